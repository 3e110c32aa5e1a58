"""ReplicaPool against stand-in replicas (the replica's own serving code, read by a stand-in engine that
answers at once, refuses or holds; no model): chunks come back in input order from several replicas, a
chunk refused by a full replica goes to one with room, all replicas full is Overloaded with Retry-After,
a request split over replicas is admitted whole or refused whole, a cancelled request tells its
replicas, payloads larger than the rings still arrive, and the deadline travels with each chunk."""

import asyncio
import threading
import time
import types

import msgspec
import numpy as np
import pytest

from engine.errors import BehindDeadline, EngineError
from engine.outputs import ALL_ROWS, EMBED, SEQUENCE, HeadOutput, RowRequest
from engine.replicas import link as replica_link
from engine.replicas.pool import ReplicaOverloaded, ReplicaPool
from engine.replicas.protocol import Capabilities
from engine.replicas.replica import serve
from engine.service_rate import RECOVERY_HALF_LIFE_S


class StandInEngine:
    """Answers each request with one row per sequence, [sum of its ids, its length]; or refuses every
    request when `full` (as the queue would), or holds them all when `hold`. Records what it got."""

    attention_backend = "stand-in"

    def __init__(
        self,
        full: bool = False,
        hold: bool = False,
        broken: bool = False,
        seconds_per_token: float | None = None,
        queued: int | None = None,
    ):
        self.full, self.hold, self.broken = full, hold, broken
        # a full queue says so in its refusals, unless it refuses for the deadline with little queued
        self.queued_tokens = queued if queued is not None else 10**6 if full else 0
        # what a replica reports of its ServiceRate
        self.rate = types.SimpleNamespace(
            seconds_per_token=seconds_per_token,
            idle_seconds_per_token=seconds_per_token,
            margin=1.0,
            quiet_seconds_per_token=seconds_per_token,
        )
        self.received: list[tuple[list[list[int]], float | None]] = []
        self.prefixes: list[list[int]] = []
        self.images: list = []  # each request's RowRequest.images
        self.held = []

    def attach(self, intake):
        """Like the engine's worker: read the intake until stopped."""
        self._polling = True
        self._poller = threading.Thread(target=self._poll, args=(intake,))
        self._poller.start()

    def _poll(self, intake):
        while self._polling:
            intake.poll(0.05)

    def stop(self):
        self._polling = False
        self._poller.join(10)

    def submit(self, request, token_ids, token_type_ids=None, deadline=None, rows=ALL_ROWS):
        self.received.append(([list(map(int, ids)) for ids in token_ids], deadline))
        # late chunking's spans and bge-m3's first rows reach a real engine: tests/api/test_late_chunking.py,
        # tests/engine/test_sparse_parity.py
        assert rows.spans is None and not rows.first_rows
        prefix = rows.prefix
        if prefix is not None:
            self.prefixes.append(list(map(int, prefix)))
        if rows.images is not None:
            self.images.append(rows.images)
        if self.full:
            raise BehindDeadline(9.0, 6.5)
        if self.broken:  # a fault of the replica's own, not a refusal
            raise TypeError("submit() takes 7 positional arguments but 8 were given")
        if self.hold:
            self.held.append(request)
            return
        head = [] if prefix is None else list(prefix)
        rows = np.array([[float(np.sum(head + list(ids))), len(ids)] for ids in token_ids], dtype=np.float32)
        request.num_tokens = len(head) + sum(map(len, token_ids))
        threading.Thread(target=request.set_rows, args=(0, rows)).start()


class StandInReplica:
    def __init__(self, endpoint: str, **behaviour):
        self.engine = StandInEngine(**behaviour)
        self.stop = threading.Event()
        ready = threading.Event()
        self.thread = threading.Thread(target=serve, args=(self.engine, endpoint, ready, self.stop))

        self.thread.start()
        assert ready.wait(10)

    def close(self):
        self.stop.set()
        self.thread.join(10)


# what the stand-in replicas would say at their start: a row of two a sequence, no shared prefixes
STAND_IN_CAPABILITIES = Capabilities(HeadOutput(SEQUENCE, 2, (EMBED,)), None, {})


def run_with(tmp_path, behaviours, body, chunk_tokens=10):
    """Stand-in replicas with the given behaviours and a pool over them; `body(pool, engines)`."""
    endpoints = [str(tmp_path / f"replica-{index}.sock") for index in range(len(behaviours))]
    replicas = [StandInReplica(endpoint, **behaviour) for endpoint, behaviour in zip(endpoints, behaviours)]

    async def main():
        pool = ReplicaPool(endpoints, chunk_tokens=chunk_tokens, max_sequence_tokens=100)
        pool.capabilities = STAND_IN_CAPABILITIES
        try:
            return await asyncio.wait_for(body(pool, [replica.engine for replica in replicas]), 30)
        finally:
            pool.stop()
            await asyncio.sleep(0)

    try:
        return asyncio.run(main())
    finally:
        for replica in replicas:
            replica.close()


SEQUENCES = [[index] * (1 + index % 4) for index in range(40)]  # 100 tokens: ten chunks of at most 10
EXPECTED = np.array([[sum(ids), len(ids)] for ids in SEQUENCES], dtype=np.float32)


def test_chunks_from_several_replicas_come_back_in_input_order(tmp_path):
    async def body(pool, engines):
        rows = await pool.run(SEQUENCES)
        return rows, pool.chunks_sent

    rows, sent = run_with(tmp_path, [{}, {}, {}], body)
    np.testing.assert_array_equal(rows, EXPECTED)
    assert sum(sent) >= 10 and min(sent) >= 1, sent


def test_token_types_travel_with_their_sequences(tmp_path):
    async def body(pool, engines):
        await pool.run([[1, 2], [3, 4, 5]], [[0, 1], None])
        return engines[0].received

    assert run_with(tmp_path, [{}], body) == [([[1, 2], [3, 4, 5]], None)]


def test_a_shared_prefix_travels_with_every_chunk_and_counts_in_its_budget(tmp_path):
    prefix = [50, 60, 70]

    async def body(pool, engines):
        pool.capabilities = msgspec.structs.replace(STAND_IN_CAPABILITIES, shared_prefixes_from=1)
        # 10-token chunks with the 3-token prefix: 7 of the sequences' tokens a chunk at most
        output = await pool.enqueue(SEQUENCES[:12], rows=RowRequest(prefix=prefix))
        pool.capabilities = STAND_IN_CAPABILITIES
        with pytest.raises(ValueError, match="do not run shared prefixes"):
            pool.enqueue(SEQUENCES[:2], rows=RowRequest(prefix=prefix))
        return output, engines

    output, engines = run_with(tmp_path, [{}, {}], body)
    expected = EXPECTED[:12] + np.array([[sum(prefix), 0]], dtype=np.float32)
    np.testing.assert_array_equal(output.rows, expected)
    chunks = [ids for engine in engines for ids, _ in engine.received]
    assert all(sum(map(len, ids)) + len(prefix) <= 10 for ids in chunks)
    assert [prefix] * len(chunks) == [got for engine in engines for got in engine.prefixes]
    assert output.num_tokens == sum(map(len, SEQUENCES[:12])) + len(prefix) * len(chunks)


def test_a_chunk_refused_by_a_full_replica_goes_to_one_with_room(tmp_path):
    async def body(pool, engines):
        rows = await pool.run(SEQUENCES[:3])  # one chunk: it may reach the full replica first
        rows_again = await pool.run(SEQUENCES[:3])
        return rows, rows_again, [len(engine.received) for engine in engines]

    rows, rows_again, received = run_with(tmp_path, [{"full": True}, {}], body)
    np.testing.assert_array_equal(rows, EXPECTED[:3])
    np.testing.assert_array_equal(rows_again, EXPECTED[:3])
    assert received[1] >= 2


def test_all_replicas_full_is_overloaded_with_the_replicas_retry_after(tmp_path):
    async def body(pool, engines):
        with pytest.raises(ReplicaOverloaded) as error:
            await pool.run(SEQUENCES[:3])
        return error.value.retry_after_s

    assert run_with(tmp_path, [{"full": True}, {"full": True}], body) == 3  # ceil(9.0 - 6.5)


def test_a_replica_that_cannot_queue_a_run_fails_the_request_and_serves_on(tmp_path):
    """A fault in the replica's own code (not a refusal) is the request's error, not a request that never
    comes back; the connection keeps serving."""

    async def body(pool, engines):
        with pytest.raises(EngineError, match="could not queue the run: TypeError"):
            await pool.run(SEQUENCES[:3])
        engines[0].broken = False
        return await pool.run(SEQUENCES)

    np.testing.assert_array_equal(run_with(tmp_path, [{"broken": True}], body), EXPECTED)


def test_a_split_request_refused_by_one_replica_is_refused_whole(tmp_path):
    """One replica holds its chunks (admitted), the other refuses: the caller gets the refusal, and the
    admitted chunks are cancelled on their replica rather than left to run."""

    async def body(pool, engines):
        with pytest.raises(ReplicaOverloaded):
            await pool.run(SEQUENCES)
        await asyncio.sleep(0.3)
        held = engines[0].held
        return len(held), all(request.is_cancelled() for request in held), pool.outstanding

    # the refusing replica reports an empty queue (too slow for the deadline): the holding one, with
    # chunks outstanding, is the busier, so no refused chunk goes there
    behaviours = [{"hold": True}, {"full": True, "queued": 0}]
    num_held, all_cancelled, outstanding = run_with(tmp_path, behaviours, body)
    assert num_held >= 1 and all_cancelled
    assert outstanding == [0, 0]


def test_a_cancelled_request_cancels_its_chunks_on_the_replicas(tmp_path):
    async def body(pool, engines):
        task = asyncio.create_task(pool.run(SEQUENCES))
        await asyncio.sleep(0.3)  # the Runs have reached the replicas, which hold them
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        held = [request for engine in engines for request in engine.held]
        return len(held), all(request.is_cancelled() for request in held), pool.outstanding

    num_held, all_cancelled, outstanding = run_with(tmp_path, [{"hold": True}, {"hold": True}], body)
    assert num_held == 10 and all_cancelled
    assert outstanding == [0, 0]


def test_payloads_larger_than_the_rings_arrive_through_spill_files(tmp_path, monkeypatch):
    monkeypatch.setattr(replica_link, "REQUEST_RING_BYTES", 4096)
    monkeypatch.setattr(replica_link, "REPLY_RING_BYTES", 4096)
    sequences = [[index % 97 + 1] * 50 for index in range(400)]  # 20,000 tokens, 80 kB of ids

    async def body(pool, engines):
        first = await pool.run(sequences)
        second = await pool.run(sequences[:3])  # the rings again, once the spills are read
        return first, second

    first, second = run_with(tmp_path, [{}], body, chunk_tokens=100_000)
    expected = np.array([[sum(ids), len(ids)] for ids in sequences], dtype=np.float32)
    np.testing.assert_array_equal(first, expected)
    np.testing.assert_array_equal(second, expected[:3])
    assert not list(tmp_path.glob("spill-*"))  # each spill file is gone once read


def test_images_travel_with_their_sequences_and_a_shared_one_once(tmp_path):
    """Each sequence's images cross the ring in order; one that several sequences hold (a vision-language
    ranker's image query, in each of its pairs) crosses once and reaches the engine as one grid, which the
    vision tower then runs once (engine/inline_images.py)."""
    rng = np.random.default_rng(0)
    query, first, second = (rng.integers(0, 256, (2, columns, 6), dtype=np.uint8) for columns in (2, 4, 2))
    sequences = [[1, 9, 2, 9, 9, 3], [1, 9, 2, 9, 3], [4, 9], [5, 6]]  # image token 9, merged by 2
    entries = [(query, first), (query, second), query, None]

    async def body(pool, engines):
        output = HeadOutput(SEQUENCE, 2, (EMBED,), takes_images=True, image_run=(9, 2))
        pool.capabilities = msgspec.structs.replace(STAND_IN_CAPABILITIES, output=output)
        rows = (await pool.enqueue(sequences, rows=RowRequest(images=entries))).rows
        return rows, engines[0].images

    rows, received = run_with(tmp_path, [{}], body, chunk_tokens=100)
    np.testing.assert_array_equal(rows, [[sum(ids), len(ids)] for ids in sequences])
    assert len(received) == 1
    (one, two), (three, four), alone, text = received[0]
    for got, sent in ((one, query), (two, first), (three, query), (four, second), (alone, query)):
        np.testing.assert_array_equal(got, sent)
    assert one is three is alone and text is None


def test_the_deadline_travels_with_each_chunk_as_it_is(tmp_path):
    """The host's one monotonic clock: a Run that waited in the socket (a replica busy with a batch) gets
    no more time for its wait."""

    async def body(pool, engines):
        deadline = time.perf_counter() + 5.0
        await pool.enqueue(SEQUENCES[:3], None, deadline)
        return deadline, engines[0].received[0][1]

    deadline, received = run_with(tmp_path, [{}], body)
    assert received == deadline


def test_the_pool_estimates_from_the_rates_its_replicas_report(tmp_path):
    async def body(pool, engines):
        before = pool.estimate_seconds(1000)
        await pool.run(SEQUENCES)  # every replica answers, with its rate
        return before, pool.estimate_seconds(1000)

    before, after = run_with(tmp_path, [{"seconds_per_token": 1e-3}, {"seconds_per_token": 1e-3}], body)
    assert before is None  # no estimate before the replicas have said
    assert after == pytest.approx(0.5)  # two replicas at 1,000 tokens/s each


def test_the_backlog_is_the_least_loaded_live_replicas_at_its_rate():
    pool = ReplicaPool(
        ["unused-0.sock", "unused-1.sock", "unused-2.sock"], chunk_tokens=10, max_sequence_tokens=100
    )
    assert pool.backlog_seconds(100) is None  # none has reported a rate
    pool.seconds_per_token = [1e-3, 2e-3, None]
    pool.reported, pool.outstanding = [900, 100, 0], [100, 50, 0]
    assert pool.backlog_seconds(100) == pytest.approx(min(1100 * 1e-3, 250 * 2e-3))
    pool.alive[1] = False
    assert pool.backlog_seconds(100) == pytest.approx(1100 * 1e-3)


def test_a_replicas_reported_rates_recover_toward_its_quiet_rate_as_the_report_ages():
    """A gateway hears a replica's rates only with its answers: after a flood it would hold the flood's rates
    for ever, refusing what the replica itself (whose rates recover) would admit."""
    pool = ReplicaPool(["unused-0.sock"], chunk_tokens=10_000, max_sequence_tokens=100)
    pool.seconds_per_token, pool.idle_seconds_per_token = [5e-4], [5e-4]
    pool.quiet_seconds_per_token, pool.heard_at = [1e-4], [time.perf_counter()]
    assert pool.backlog_seconds(1000) == pytest.approx(0.5, rel=1e-3)
    assert pool.estimate_seconds(1000) == pytest.approx(0.5, rel=1e-3)
    pool.heard_at = [time.perf_counter() - 10 * RECOVERY_HALF_LIFE_S]
    assert pool.backlog_seconds(1000) == pytest.approx(0.1, rel=0.01)
    assert pool.estimate_seconds(1000) == pytest.approx(0.1, rel=0.01)
    assert pool.rates()[0][0] == pytest.approx(1e-4, rel=0.01)


def test_a_replicas_report_counts_only_while_this_gateway_has_work_on_it():
    """A report comes with this gateway's results: with none in flight, the last may be long stale (the
    queue drained since), and a gateway refusing on it would never hear otherwise."""
    pool = ReplicaPool(["unused-0.sock"], chunk_tokens=10, max_sequence_tokens=100)
    pool.seconds_per_token = [1e-3]
    pool.reported, pool.outstanding = [5000], [0]
    assert pool.backlog_seconds(100) == pytest.approx(100 * 1e-3)
    pool.outstanding = [200]
    assert pool.backlog_seconds(100) == pytest.approx(5300 * 1e-3)
