"""Scheduler with fake requests: FIFO order, token budget, head-of-line closing, cancellation, queue bound,
requests split across batches."""

import threading

import pytest

from engine.errors import EngineStopped, Overloaded
from engine.outputs import RowRequest
from engine.scheduler import QueuedRequest, ScheduledSequence, Scheduler


def request(name: str, *lengths: int, cancelled: bool = False) -> QueuedRequest:
    return QueuedRequest([[0] * n for n in lengths], owner=name, is_cancelled=lambda: cancelled)


def names(batch: list[ScheduledSequence]) -> list[str]:
    """owner, or owner/index for the later sequences of a request"""
    return [f"{s.owner}/{s.index}" if s.index else s.owner for s in batch]


def test_fifo_order_across_requests():
    scheduler = Scheduler(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    scheduler.submit(request("a", 5, 5))
    scheduler.submit(request("c", 5))
    assert names(scheduler.next_batch(timeout=0)) == ["a", "a/1", "c"]


def test_batch_stays_under_token_budget():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=1000)
    scheduler.submit(request("r", 4, 4, 4, 4, 4))
    batches = [names(scheduler.next_batch(timeout=0)) for _ in range(3)]
    assert batches == [["r", "r/1"], ["r/2", "r/3"], ["r/4"]]  # one request split across batches
    assert scheduler.queued_tokens == 0


def test_first_sequence_that_does_not_fit_closes_the_batch():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=1000)
    # "big" does not fit after "a"; the small "c" behind it must not jump the queue
    scheduler.submit(request("a", 4))
    scheduler.submit(request("big", 8))
    scheduler.submit(request("c", 1))
    assert names(scheduler.next_batch(timeout=0)) == ["a"]
    assert names(scheduler.next_batch(timeout=0)) == ["big", "c"]


def test_sequence_budget():
    scheduler = Scheduler(max_batch_tokens=1000, max_batch_seqs=2, max_queue_tokens=1000)
    scheduler.submit(request("r", 1, 1, 1))
    scheduler.submit(request("s", 1, 1))
    assert [names(scheduler.next_batch(timeout=0)) for _ in range(3)] == [["r", "r/1"], ["r/2", "s"], ["s/1"]]


def test_cancelled_sequences_are_dropped_and_release_their_tokens():
    scheduler = Scheduler(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    scheduler.submit(request("a", 5))
    scheduler.submit(request("gone", 50, 50, cancelled=True))
    scheduler.submit(request("b", 5))
    assert scheduler.queued_tokens == 110
    assert names(scheduler.next_batch(timeout=0)) == ["a", "b"]
    assert scheduler.queued_tokens == 0


def test_a_request_cancelled_after_its_first_batch_drops_the_rest():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=1000)
    cancelled = []
    scheduler.submit(QueuedRequest([[0] * 5] * 4, owner="r", is_cancelled=lambda: bool(cancelled)))
    scheduler.submit(request("next", 3))
    assert names(scheduler.next_batch(timeout=0)) == ["r", "r/1"]
    cancelled.append(True)
    assert names(scheduler.next_batch(timeout=0)) == ["next"]
    assert scheduler.queued_tokens == 0


def test_full_queue_refuses_a_whole_request_with_overloaded():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=20)
    scheduler.submit(request("a", 15))
    with pytest.raises(Overloaded):
        scheduler.submit(request("b", 3, 3))
    assert scheduler.queued_tokens == 15
    assert names(scheduler.next_batch(timeout=0)) == ["a"]
    scheduler.submit(request("b", 3, 3))
    assert names(scheduler.next_batch(timeout=0)) == ["b", "b/1"]


def test_empty_queue_admits_a_request_larger_than_the_queue():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=10)
    scheduler.submit(request("r", 8, 8, 8))
    assert [len(scheduler.next_batch(timeout=0)) for _ in range(3)] == [1, 1, 1]


def test_next_batch_waits_for_work_and_wakes_on_submit():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=100)
    assert scheduler.next_batch(timeout=0.01) == []
    timer = threading.Timer(0.05, lambda: scheduler.submit(request("late", 2)))
    timer.start()
    assert names(scheduler.next_batch(timeout=5)) == ["late"]


def test_stopped_scheduler_refuses_work_and_wakes_waiters():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=100)
    threading.Timer(0.05, scheduler.stop).start()
    assert scheduler.next_batch(timeout=5) == []
    with pytest.raises(EngineStopped):
        scheduler.submit(request("a", 1))


def test_a_request_without_sequences_is_refused():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=100)
    with pytest.raises(ValueError, match="at least one sequence"):
        scheduler.submit(request("empty"))
    assert scheduler.next_batch(timeout=0) == []


def test_a_shared_prefix_runs_once_in_each_batch_that_takes_its_sequences():
    scheduler = Scheduler(max_batch_tokens=20, max_batch_seqs=10, max_queue_tokens=1000)
    scheduler.submit(QueuedRequest([[0] * 4] * 5, owner="r", rows=RowRequest(prefix=[1] * 6)))
    scheduler.submit(request("s", 3))
    assert scheduler.queued_tokens == 6 + 5 * 4 + 3  # the prefix counted once while queued
    first, second = scheduler.next_batch(timeout=0), scheduler.next_batch(timeout=0)
    # 6 + 4 + 4 + 4 = 18 tokens; the next batch repeats the prefix before the last two, then takes s
    assert [(s.is_prefix, s.index, s.prefix_at) for s in first] == [
        (True, -1, -1),
        *[(False, i, 0) for i in range(3)],
    ]
    assert [(s.is_prefix, s.index, s.prefix_at, s.owner) for s in second] == [
        (True, -1, -1, "r"), (False, 3, 0, "r"), (False, 4, 0, "r"), (False, 0, -1, "s"),
    ]  # fmt: skip
    assert scheduler.queued_tokens == 0


def test_a_prefix_and_its_first_sequence_fit_the_budget_together():
    scheduler = Scheduler(max_batch_tokens=20, max_batch_seqs=10, max_queue_tokens=1000)
    scheduler.submit(request("a", 8))
    scheduler.submit(QueuedRequest([[0] * 5], owner="r", rows=RowRequest(prefix=[1] * 8)))
    assert names(scheduler.next_batch(timeout=0)) == ["a"]  # 8 + 8 + 5 > 20
    assert [s.is_prefix for s in scheduler.next_batch(timeout=0)] == [True, False]
