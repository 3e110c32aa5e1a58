"""Engine with a fake runner: results reach their callers, batch N+1 launches before batch N is
collected (on the CPU, after), a full queue is Overloaded, failures reach the caller and the engine keeps
serving."""

import asyncio
import itertools
import threading
import time

import numpy as np
import pytest
import torch

from engine.batch import PackedBatch
from engine.config import EngineConfig
from engine.engine import IDLE_SPIN_S, Engine
from engine.errors import EngineError, Overloaded, SequenceTooLong
from tests.conftest import embedder_output

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)


class FakeResult:
    def __init__(self, rows: np.ndarray, log: list, step: int):
        self.rows, self.log, self.step = rows, log, step

    def ready(self) -> bool:
        return True

    def result(self) -> np.ndarray:
        self.log.append(("result", self.step))
        return self.rows

    def all_finite(self) -> bool:
        return bool(np.isfinite(self.rows).all())


class FakeRunner:
    """Each output row is (sum of the sequence's ids, its length), as if from a device that runs behind the
    host (the steps' order tells when it computed)."""

    device = torch.device("cpu")
    computes_on_launch = False
    output = embedder_output(2)

    def __init__(self, gate: threading.Event | None = None, fail_on: int | None = None):
        self.log: list = []
        self.gate = gate
        self.fail_on = fail_on
        self.num_steps = 0

    def step(self, batch: PackedBatch) -> FakeResult:
        if self.gate is not None:
            self.gate.wait(10)
        step = self.num_steps
        self.num_steps += 1
        self.log.append(("step", step))
        if self.fail_on is not None and batch.input_ids.tolist().count(self.fail_on):
            raise RuntimeError("poisoned batch")
        cu = batch.cu_seqlens.tolist()
        ids = batch.input_ids.tolist()
        rows = np.array([[sum(ids[a:b]), b - a] for a, b in itertools.pairwise(cu)], dtype=np.float32)
        return FakeResult(rows, self.log, step)


def make_engine(runner, **limits) -> Engine:
    engine = Engine(runner, EngineConfig(**{"max_batch_tokens": 64, "max_queue_tokens": 4096, **limits}))
    engine.start()
    return engine


def test_concurrent_requests_each_get_their_own_rows():
    engine = make_engine(FakeRunner())

    async def main():
        requests = [[[i, j + 1] for j in range(i % 5 + 1)] for i in range(48)]
        results = await asyncio.gather(*(engine.run(request) for request in requests))
        for request, rows in zip(requests, results):
            assert rows.tolist() == [[float(sum(ids)), float(len(ids))] for ids in request]

    try:
        asyncio.run(main())
    finally:
        engine.stop()


@pytest.mark.parametrize("computes_on_launch", [False, True], ids=["device", "cpu"])
def test_next_batch_launches_before_the_previous_one_is_collected_but_on_the_cpu_after(computes_on_launch):
    # a CPU step computes its batch before it returns: launching batch N+1 first would hold batch N's rows
    # back for all of N+1's time (under a backlog, a batch's time added to every request's)
    gate = threading.Event()
    runner = FakeRunner(gate)
    runner.computes_on_launch = computes_on_launch
    engine = make_engine(runner, max_batch_tokens=4)

    async def main():
        # four 4-token sequences queued at once make four batches
        task = asyncio.ensure_future(engine.run([[1, 1, 1, 1]] * 4))
        await asyncio.sleep(0.05)
        gate.set()
        return await task

    try:
        rows = asyncio.run(main())
    finally:
        engine.stop()
    assert rows[:, 0].tolist() == [4.0] * 4
    order = runner.log
    for step in range(1, 4):
        launched_first = order.index(("step", step)) < order.index(("result", step - 1))
        assert launched_first is not computes_on_launch


def test_full_queue_is_overloaded_and_serving_resumes():
    gate = threading.Event()
    engine = make_engine(FakeRunner(gate), max_batch_tokens=8, max_queue_tokens=8)

    async def main():
        first = asyncio.ensure_future(engine.run([[1] * 8]))
        await asyncio.sleep(0.05)  # the worker holds `first` in step(); queue empty
        second = asyncio.ensure_future(engine.run([[1] * 8]))
        await asyncio.sleep(0.01)
        with pytest.raises(Overloaded):
            await engine.run([[1] * 4])
        gate.set()
        assert (await first)[0, 0] == 8 and (await second)[0, 0] == 8
        assert (await engine.run([[2, 2]]))[0, 0] == 4

    try:
        asyncio.run(main())
    finally:
        engine.stop()


def test_a_failing_step_fails_its_callers_only():
    engine = make_engine(FakeRunner(fail_on=13), max_batch_tokens=4)

    async def main():
        with pytest.raises(EngineError):
            await engine.run([[13, 13, 13]])
        assert (await engine.run([[1, 2]]))[0, 0] == 3

    try:
        asyncio.run(main())
    finally:
        engine.stop()


def test_cancelled_request_is_dropped_before_it_runs():
    gate = threading.Event()
    runner = FakeRunner(gate)
    engine = make_engine(runner, max_batch_tokens=4)

    async def main():
        first = asyncio.ensure_future(engine.run([[1, 1, 1, 1]]))
        await asyncio.sleep(0.05)
        doomed = asyncio.ensure_future(engine.run([[7, 7, 7, 7]]))
        await asyncio.sleep(0.01)
        doomed.cancel()
        await asyncio.sleep(0.01)
        gate.set()
        await first
        assert (await engine.run([[5]]))[0, 0] == 5

    try:
        asyncio.run(main())
    finally:
        engine.stop()
    assert runner.num_steps == 2


def test_bad_sequences_are_refused_before_they_reach_a_batch():
    engine = make_engine(FakeRunner(), max_batch_tokens=8)

    async def main():
        with pytest.raises(ValueError):
            await engine.run([[1, 2], []])
        with pytest.raises(ValueError):
            await engine.run([])
        with pytest.raises(SequenceTooLong):
            await engine.run([[1] * 9])
        assert (await engine.run([[1] * 8]))[0, 0] == 8

    try:
        asyncio.run(main())
    finally:
        engine.stop()


def test_warm_up_reaches_every_kernel_variant():
    from engine.build import warm_up_batches

    def shape(batches):
        return [[len(sequence) for sequence in batch] for batch in batches]

    assert shape(warm_up_batches(512)) == [[1], [2], [64], [128]]
    assert shape(warm_up_batches(100)) == [[1], [2], [64], [100, 12]]
    assert shape(warm_up_batches(40)) == [[1], [2], [40, 8]]
    assert shape(warm_up_batches(5)) == [[1], [2], [5, 5, 5, 1]]


class DeviceResult:
    """Rows of a step still running on a stand-in device until `done_at` (time.perf_counter)."""

    def __init__(self, rows: np.ndarray, done_at: float, log: list, step: int):
        self.rows, self.done_at, self.log, self.step = rows, done_at, log, step

    def ready(self) -> bool:
        return time.perf_counter() >= self.done_at

    def result(self) -> np.ndarray:
        self.log.append(("result", self.step))
        time.sleep(max(0.0, self.done_at - time.perf_counter()))
        return self.rows

    def all_finite(self) -> bool:
        return bool(np.isfinite(self.rows).all())


class DeviceRunner:
    """Launches return at once; the device runs steps one after another, `seconds_per_token` a token."""

    device = torch.device("cpu")
    computes_on_launch = False
    output = embedder_output(2)

    def __init__(self, seconds_per_token: float):
        self.seconds_per_token = seconds_per_token
        self.log: list = []
        self.free_at = 0.0

    def step(self, batch: PackedBatch) -> DeviceResult:
        step = sum(1 for event, _ in self.log if event == "step")
        self.log.append(("step", step))
        self.free_at = max(time.perf_counter(), self.free_at) + batch.num_tokens * self.seconds_per_token
        rows = np.zeros((batch.num_seqs, 2), dtype=np.float32)
        return DeviceResult(rows, self.free_at, self.log, step)


@pytest.mark.parametrize(("num_tokens", "overlaps"), [(32, True), (4, False)])
def test_work_that_comes_while_a_large_batch_runs_is_launched_behind_it(num_tokens, overlaps):
    # 32 tokens (of a 64-token budget) take 64 ms on the device: a request 10 ms later is launched while
    # that batch runs, not after its rows; a 4-token batch (a step's fixed cost) does not wait for it
    runner = DeviceRunner(seconds_per_token=0.002)
    engine = make_engine(runner)

    async def main():
        await engine.run([[1] * 32])  # the engine's first measurement of its speed
        runner.log.clear()
        first = asyncio.ensure_future(engine.run([[1] * num_tokens]))
        await asyncio.sleep(0.01 if overlaps else 0.002)
        await asyncio.gather(first, engine.run([[2] * num_tokens]))

    try:
        asyncio.run(main())
    finally:
        engine.stop()
    steps = [(event, step - runner.log[0][1]) for event, step in runner.log]
    if overlaps:
        assert steps == [("step", 0), ("step", 1), ("result", 0), ("result", 1)]
    else:
        assert steps == [("step", 0), ("result", 0), ("step", 1), ("result", 1)]


class RecordingIntake:
    """A replica's intake that never has frames: records each poll's (time, timeout)."""

    def __init__(self):
        self.polls: list[tuple[float, float]] = []

    def poll(self, timeout: float) -> None:
        self.polls.append((time.perf_counter(), timeout))
        time.sleep(min(timeout, 0.005))  # a select that saw nothing (shortened: the test stays quick)

    def wake(self) -> None:
        pass


@pytest.mark.parametrize(("device", "spins"), [("cuda", True), ("cpu", False)])
def test_a_replica_engine_on_a_gpu_keeps_reading_without_sleeping_for_a_while_after_a_batch(device, spins):
    runner = FakeRunner()
    runner.device = torch.device(device)  # no index: the worker leaves the current device alone
    engine = make_engine(runner)
    intake = RecordingIntake()
    engine.attach(intake)
    try:
        assert asyncio.run(engine.run([[1, 2, 3]])).tolist() == [[6.0, 3.0]]
        finished = engine._last_finished
        time.sleep(IDLE_SPIN_S + 0.03)
    finally:
        engine.stop()
    spinning = [timeout for at, timeout in intake.polls if finished < at < finished + 0.8 * IDLE_SPIN_S]
    later = [timeout for at, timeout in intake.polls if at > finished + 1.2 * IDLE_SPIN_S]
    if spins:
        # no poll inside the window waits; how many fit in it is the machine's (this test's own thread may
        # hold the GIL through all of it: Python switches threads every 5 ms), then one that sleeps
        assert set(spinning) <= {0.0}
    else:
        assert spinning and 0.0 not in spinning
    assert later and all(timeout > 0 for timeout in later)
