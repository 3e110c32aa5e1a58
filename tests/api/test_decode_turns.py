"""The gateways' turns at the host's cores for image decoding (api/decode_turns.py): a request's parts take
consecutive tickets and start only once fewer than `cores` earlier ones are unfinished, so that the first
request's images are done first; a dead gateway's tickets are reclaimed; a part whose turn never comes
starts anyway; and the turns work across spawned processes as the supervisor passes them."""

import asyncio
import multiprocessing
import threading
import time

import pytest

from api.decode_turns import DecodeTurns
from api.tokenizer_pool import TokenizerPool

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

SPAWN = multiprocessing.get_context("spawn")


def test_a_ticket_waits_until_fewer_than_cores_earlier_ones_are_unfinished():
    turns = DecodeTurns(SPAWN, cores=2, num_gateways=2)
    first, second = turns.gateway(0), turns.gateway(1)
    first.wait_s = second.wait_s = 0.05
    assert first.take(3) == 0 and second.take(2) == 3
    assert first.wait(0) and first.wait(1)
    assert not first.wait(2) and not second.wait(3)  # tickets 0 and 1 run
    first.finish()
    assert first.wait(2) and not second.wait(3)
    second.finish(2)  # finished in any order: what counts is how many
    assert second.wait(3) and second.wait(4)


def test_a_waiting_part_is_woken_when_another_gateways_part_finishes():
    turns = DecodeTurns(SPAWN, cores=1, num_gateways=2)
    first, second = turns.gateway(0), turns.gateway(1)
    first.take(1)
    second.take(1)
    woken: list[float] = []
    waiter = threading.Thread(target=lambda: woken.append(second.wait(1) and time.perf_counter()))
    waiter.start()
    time.sleep(0.1)
    assert not woken
    finished_at = time.perf_counter()
    first.finish()
    waiter.join(2)
    assert woken and woken[0] - finished_at < 0.5  # by its gateway's watcher, not its timeout


def test_a_dead_gateways_tickets_are_reclaimed():
    turns = DecodeTurns(SPAWN, cores=2, num_gateways=2)
    live, dead = turns.gateway(0), turns.gateway(1)
    live.wait_s = 0.05
    dead.take(5)  # and then it died, none of them finished
    ticket = live.take(1)
    assert not live.wait(ticket)
    assert turns.reclaim(1) == 5 and turns.open_tickets(1) == 0
    assert live.wait(ticket)


def test_a_part_whose_turn_never_comes_starts_anyway():
    turns = DecodeTurns(SPAWN, cores=1, num_gateways=2)
    turns.gateway(1).take(1)  # never finished, never reclaimed
    own = turns.gateway(0)
    own.wait_s = 0.1
    pool = TokenizerPool(2, own)
    done = asyncio.run(pool.map(lambda part, first: list(part), ["a", "b"], part_size=1))
    assert done == [["a"], ["b"]]
    assert turns.open_tickets(0) == 0  # each part gave its ticket back
    pool.close()


def test_the_first_requests_parts_are_done_before_the_next_ones_start():
    """Two gateways' pools of 4 threads on 4 cores, a request of 4 parts each, the second queued just after
    the first: without turns all 8 parts would share the cores at once; with them the second request's
    parts start as the first's finish."""
    turns = DecodeTurns(SPAWN, cores=4, num_gateways=2)
    pools = [TokenizerPool(4, turns.gateway(index)) for index in range(2)]
    spans: dict[str, tuple[float, float]] = {}
    lock = threading.Lock()

    def work(part, first):
        started = time.perf_counter()
        time.sleep(0.05)
        with lock:
            spans[part[0]] = (started, time.perf_counter())
        return part

    async def both():
        first = asyncio.ensure_future(pools[0].map(work, ["a0", "a1", "a2", "a3"], part_size=1))
        await asyncio.sleep(0)
        second = asyncio.ensure_future(pools[1].map(work, ["b0", "b1", "b2", "b3"], part_size=1))
        return await asyncio.gather(first, second)

    asyncio.run(both())
    first_done = max(spans[f"a{index}"][1] for index in range(4))
    second_started = min(spans[f"b{index}"][0] for index in range(4))
    assert second_started >= min(spans[f"a{index}"][1] for index in range(4))
    assert first_done < max(spans[f"b{index}"][1] for index in range(4))
    for pool in pools:
        pool.close()


def take_and_die(turns: DecodeTurns, index: int, count: int, taken) -> None:
    turns.gateway(index).take(count)
    taken.set()


def finish_one(turns: DecodeTurns, index: int) -> None:
    own = turns.gateway(index)
    own.take(1)
    own.finish()


def die_holding_the_lock(turns: DecodeTurns) -> None:
    turns._lock.acquire()  # killed within take() or finish(), as the OOM killer may


def test_a_gateway_killed_holding_the_lock_has_it_taken_over():
    turns = DecodeTurns(SPAWN, cores=1, num_gateways=2)
    dying = SPAWN.Process(target=die_holding_the_lock, args=(turns,))
    dying.start()
    dying.join(30)
    assert turns.reclaim(1) == 0
    own, taken = turns.gateway(0), []
    taking = threading.Thread(target=lambda: taken.append(own.take(1)), daemon=True)
    taking.start()
    taking.join(10)  # without the takeover, it would wait on the lock for ever
    assert taken == [0] and own.wait(0)


def test_turns_are_shared_with_spawned_gateway_processes():
    """As the supervisor passes them: a spawned process's tickets hold up this one's until it finishes
    them, or until its tickets are reclaimed once it died."""
    turns = DecodeTurns(SPAWN, cores=1, num_gateways=3)
    taken = SPAWN.Event()
    dying = SPAWN.Process(target=take_and_die, args=(turns, 1, 2, taken))
    dying.start()
    assert taken.wait(30)
    dying.join(30)
    own = turns.gateway(0)
    own.wait_s = 0.1
    ticket = own.take(1)
    assert ticket == 2 and not own.wait(ticket)
    assert turns.reclaim(1) == 2
    own.wait_s = 5.0
    assert own.wait(ticket)
    own.finish()
    other = SPAWN.Process(target=finish_one, args=(turns, 2))
    other.start()
    other.join(30)
    assert other.exitcode == 0 and turns.open_tickets(2) == 0
    later = own.take(1)
    assert later == 4 and own.wait(later)


def test_images_from_clients_at_once_through_two_gateways(tmp_path):
    """`posy serve --api-workers 2` of a tiny CLIP, the supervisor's turns passed to both gateways: 4
    clients' images at once each come back within 1e-5 of transformers' vector of the same PNG."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    import numpy as np

    from benchmarks.image_checkpoints import dual_encoder_checkpoint
    from benchmarks.live_server import serve
    from tests.api.test_images import TOLERANCE, data_uri, png, reference_vectors

    folder, model = dual_encoder_checkpoint(tmp_path / "clip", "clip")
    images = [png(24 + 4 * index, 40 - 2 * index, index) for index in range(12)]
    _, expected = reference_vectors(model, folder, ["a"], images)
    bodies = [
        {"input": [{"type": "image_url", "image_url": {"url": data_uri(data)}} for data in images[start::4]]}
        for start in range(4)
    ]
    with serve(folder, "--api-workers", "2", "--device", "cpu", "--dtype", "float32") as url:
        with httpx.Client(base_url=url, timeout=60, trust_env=False) as client:

            def embed(body):
                response = client.post("/v1/embeddings", json=body)
                assert response.status_code == 200, response.text
                return np.array([item["embedding"] for item in response.json()["data"]])

            with ThreadPoolExecutor(4) as clients:
                for start, got in enumerate(clients.map(embed, bodies * 2)):
                    np.testing.assert_allclose(got, expected[start % 4 :: 4], atol=TOLERANCE, rtol=0)
