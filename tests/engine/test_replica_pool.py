"""ReplicaPool against fake replicas (ZeroMQ ROUTER sockets in the test's event loop, no model): chunks
come back in input order from several replicas, a chunk refused by a full replica goes to one with room,
all replicas full is Overloaded with Retry-After, and a cancelled request tells its replicas."""

import asyncio

import numpy as np
import pytest

from engine.replica_pool import ReplicaOverloaded, ReplicaPool
from engine.replica_protocol import Cancel, Failure, Result, Run, encoder, replica_decoder

zmq = pytest.importorskip("zmq")


class FakeReplica:
    """Answers each Run with one row per sequence, [sum of its ids, its length], or refuses it when
    `full`; `hold` keeps Runs unanswered; records every message."""

    def __init__(self, endpoint: str, full: bool = False, hold: bool = False):
        import zmq.asyncio

        self.full, self.hold, self.messages = full, hold, []
        self.socket = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(endpoint)
        self.task = asyncio.get_running_loop().create_task(self.serve())

    async def serve(self):
        encode, decode = encoder(), replica_decoder()
        while True:
            identity, payload = await self.socket.recv_multipart()
            message = decode.decode(payload)
            self.messages.append(message)
            if isinstance(message, Cancel) or self.hold:
                continue
            if self.full:
                reply = Failure(
                    message.id, "overloaded", "the queue is full", queued_tokens=10**6, retry_after_s=3
                )
            else:
                rows = np.array([[sum(ids), len(ids)] for ids in message.token_ids], dtype="<f4")
                reply = Result(message.id, rows.tobytes(), len(rows), queued_tokens=0)
            await self.socket.send_multipart([identity, encode.encode(reply)])

    def close(self):
        self.task.cancel()
        self.socket.close()


def endpoints(tmp_path, count):
    return [f"ipc://{tmp_path}/fake-{index}" for index in range(count)]


def run_with(tmp_path, behaviours, body):
    """Start fake replicas with the given behaviours and a pool over them, run `body(pool, fakes)`."""

    async def main():
        fakes = [
            FakeReplica(endpoint, **behaviour)
            for endpoint, behaviour in zip(endpoints(tmp_path, len(behaviours)), behaviours)
        ]
        pool = ReplicaPool(endpoints(tmp_path, len(behaviours)), chunk_tokens=10, max_sequence_tokens=100)
        try:
            return await asyncio.wait_for(body(pool, fakes), 30)
        finally:
            pool.stop()
            await asyncio.sleep(0)
            for fake in fakes:
                fake.close()

    return asyncio.run(main())


SEQUENCES = [[index] * (1 + index % 4) for index in range(40)]  # 100 tokens: ten chunks of at most 10
EXPECTED = np.array([[sum(ids), len(ids)] for ids in SEQUENCES], dtype=np.float32)


def test_chunks_from_several_replicas_come_back_in_input_order(tmp_path):
    async def body(pool, fakes):
        rows = await pool.run(SEQUENCES)
        return rows, pool.chunks_sent

    rows, sent = run_with(tmp_path, [{}, {}, {}], body)
    np.testing.assert_array_equal(rows, EXPECTED)
    assert sum(sent) >= 10 and min(sent) >= 1, sent


def test_a_chunk_refused_by_a_full_replica_goes_to_one_with_room(tmp_path):
    async def body(pool, fakes):
        rows = await pool.run(SEQUENCES[:3])  # one chunk: it may reach the full replica first
        rows_again = await pool.run(SEQUENCES[:3])
        return rows, rows_again, [len(fake.messages) for fake in fakes]

    rows, rows_again, received = run_with(tmp_path, [{"full": True}, {}], body)
    np.testing.assert_array_equal(rows, EXPECTED[:3])
    np.testing.assert_array_equal(rows_again, EXPECTED[:3])
    assert received[1] >= 2


def test_all_replicas_full_is_overloaded_with_retry_after(tmp_path):
    async def body(pool, fakes):
        with pytest.raises(ReplicaOverloaded) as error:
            await pool.run(SEQUENCES[:3])
        return error.value.retry_after_s

    assert run_with(tmp_path, [{"full": True}, {"full": True}], body) == 3


def test_a_cancelled_request_cancels_its_chunks_on_the_replicas(tmp_path):
    async def body(pool, fakes):
        task = asyncio.create_task(pool.run(SEQUENCES))
        await asyncio.sleep(0.3)  # the Runs have reached the replicas, which hold them
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        runs = {m.id for fake in fakes for m in fake.messages if isinstance(m, Run)}
        cancels = {m.id for fake in fakes for m in fake.messages if isinstance(m, Cancel)}
        return runs, cancels, pool.outstanding

    runs, cancels, outstanding = run_with(tmp_path, [{"hold": True}, {"hold": True}], body)
    assert runs and cancels == runs
    assert outstanding == [0, 0]
