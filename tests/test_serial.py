"""The suite's turn lock (tests/serial.py): a serial test's turn shares the host with no other test's."""

import multiprocessing
import shutil
import time

from tests.serial import _lock_folder, host_turn

HOLD_S = 0.3


def hold(exclusive: bool, spans, ready) -> None:
    ready.wait()
    with host_turn(exclusive):
        started = time.monotonic()
        time.sleep(HOLD_S)
        spans.append((exclusive, started, time.monotonic()))


def spans_of(kinds: list[bool]) -> list[tuple[bool, float, float]]:
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager:
        spans, ready = manager.list(), manager.Event()
        processes = [context.Process(target=hold, args=(kind, spans, ready)) for kind in kinds]
        for process in processes:
            process.start()
        ready.set()
        for process in processes:
            process.join(30)
        return sorted(spans, key=lambda span: span[1])


def test_shared_turns_overlap_and_an_exclusive_one_overlaps_none(monkeypatch, tmp_path):
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", f"turns-{tmp_path.name}")  # a lock of this test's own
    try:
        check_turns()
    finally:
        shutil.rmtree(_lock_folder())


def check_turns() -> None:
    shared = spans_of([False, False])
    assert len(shared) == 2 and shared[1][1] < shared[0][2]  # both held at once
    mixed = spans_of([False, True, False, True])
    assert len(mixed) == 4
    for exclusive, start, end in mixed:
        if exclusive:
            others = [span for span in mixed if span[1:] != (start, end)]
            assert all(other_end <= start or other_start >= end for _, other_start, other_end in others)
