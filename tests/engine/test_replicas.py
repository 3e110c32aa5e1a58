"""Engine replicas in worker processes (the bundled all-MiniLM-L6-v2 on the CPU, two replicas): a large
request is split by tokens, spread over both and reassembled in input order with the in-process engine's
vectors; a replica killed with SIGKILL under load is restarted, its chunks are retried once elsewhere,
and every request ends correct or with EngineStopped (503), none hangs; failures keep their kinds."""

import asyncio
import os
import signal
import time

import numpy as np
import pytest

from api.tokenize import TextEncoder
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.checkpoint.source import ModelSource
from engine.config import EngineConfig
from engine.errors import EngineError, EngineStopped, Overloaded, SequenceTooLong
from engine.prefixes import split_by_tokens
from engine.replicas.pool import _exception
from engine.replicas.protocol import Failure
from engine.replicas.replica_set import ReplicaSet

# small batches, so that even a few hundred short texts make several chunks
CONFIG = EngineConfig(device="cpu", dtype="float32", max_batch_tokens=2048, max_queue_tokens=64 * 4096)
REQUEST_TIMEOUT_S = 120  # a request that takes longer has hung


@pytest.fixture(scope="module")
def sequences():
    spec = resolve_model(None)
    encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size)
    texts = [f"text number {i} is about " + "cats and dogs " * (i % 9) for i in range(1024)]
    return encoder.encode(texts, None, truncate=True)


@pytest.fixture(scope="module")
def expected(sequences):
    """The in-process engine's vectors for every sequence."""
    engine = build_engine(resolve_model(None), CONFIG)

    async def run():
        return await engine.run(sequences)

    try:
        return asyncio.run(run())
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def replicas():
    replica_set = ReplicaSet(ModelSource(), 2, CONFIG)
    replica_set.start()
    yield replica_set
    replica_set.stop()


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, REQUEST_TIMEOUT_S))


def test_split_by_tokens_keeps_order_and_the_budget():
    assert split_by_tokens([3, 3, 3, 3], 6) == [(0, 2), (2, 4)]
    assert split_by_tokens([5], 2) == [(0, 1)]  # one sequence longer than the budget is a chunk alone
    assert split_by_tokens([1, 9, 1], 5) == [(0, 1), (1, 2), (2, 3)]
    ranges = split_by_tokens(list(range(1, 100)), 500)
    assert ranges[0][0] == 0 and ranges[-1][1] == 99
    assert all(end == start for (_, end), (start, _) in zip(ranges, ranges[1:]))


def test_a_large_request_is_split_balanced_and_reassembled_in_order(replicas, sequences, expected):
    before = list(replicas.pool.chunks_sent)
    rows = run(replicas.pool.run(sequences))
    sent = [after - earlier for after, earlier in zip(replicas.pool.chunks_sent, before)]
    assert min(sent) >= 1 and sum(sent) >= 4, sent  # both replicas took chunks of the one request
    assert abs(sent[0] - sent[1]) <= max(sent) // 2 + 1, sent
    np.testing.assert_allclose(rows, expected, rtol=0, atol=1e-5)
    assert replicas.pool.outstanding == [0, 0]


def test_a_killed_replica_comes_back_and_no_request_hangs(replicas, sequences, expected):
    slices = [slice(start, start + 64) for start in range(0, 512, 64)]

    async def one(part):
        try:
            return part, await replicas.pool.run(sequences[part])
        except EngineStopped as error:
            return part, error

    async def load():
        tasks = [asyncio.create_task(one(part)) for part in slices * 2]
        await asyncio.sleep(0.5)
        assert not all(task.done() for task in tasks), "the replica must be killed under load"
        os.kill(replicas.processes[0].pid, signal.SIGKILL)
        return await asyncio.gather(*tasks)

    restarts = replicas.num_restarts[0]
    results = run(load())
    for part, rows in results:  # correct, or a clean 503; anything else raises out of gather
        if not isinstance(rows, EngineStopped):
            np.testing.assert_allclose(rows, expected[part], rtol=0, atol=1e-5)
    deadline = time.monotonic() + 60
    while replicas.num_restarts[0] == restarts or not replicas.pool.alive[0]:
        assert time.monotonic() < deadline, "the killed replica did not come back"
        time.sleep(0.2)
    # both serve again
    before = list(replicas.pool.chunks_sent)
    np.testing.assert_allclose(run(replicas.pool.run(sequences[:512])), expected[:512], rtol=0, atol=1e-5)
    assert all(after > earlier for after, earlier in zip(replicas.pool.chunks_sent, before))


def test_the_pool_accepts_work_while_a_replica_lives(replicas, sequences, expected):
    """Readiness (/ready) follows the pool: both replicas killed, it accepts nothing until one is back."""
    assert replicas.pool.accepting
    for process in replicas.processes:
        os.kill(process.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while replicas.pool.accepting:
        assert time.monotonic() < deadline, "the pool did not notice its replicas were gone"
        time.sleep(0.02)
    deadline = time.monotonic() + 90
    while not all(replicas.pool.alive):
        assert time.monotonic() < deadline, "the killed replicas did not come back"
        time.sleep(0.2)
    assert replicas.pool.accepting
    np.testing.assert_allclose(run(replicas.pool.run(sequences[:64])), expected[:64], rtol=0, atol=1e-5)


def test_bad_requests_fail_in_the_gateway_before_any_replica(replicas):
    with pytest.raises(ValueError):
        run(replicas.pool.run([]))
    with pytest.raises(SequenceTooLong):
        run(replicas.pool.run([[101] * 5000]))


@pytest.mark.parametrize(
    "kind, error",
    [
        ("overloaded", Overloaded),
        ("invalid", SequenceTooLong),
        ("stopped", EngineStopped),
        ("failed", EngineError),
    ],
)
def test_replica_failures_keep_their_kinds(kind, error):
    raised = _exception(Failure(7, kind, "why", queued_tokens=0, requests_read=0, retry_after_s=2.4))
    assert isinstance(raised, error) and str(raised) == "why"
    if kind == "overloaded":
        assert raised.retry_after_s == 2  # whole seconds, for Retry-After
