"""Scheduler with fake requests: FIFO order, token budget, head-of-line closing, cancellation, queue bound."""

import threading

import pytest

from engine.errors import EngineStopped, Overloaded
from engine.scheduler import ScheduledSequence, Scheduler


def seq(name: str, num_tokens: int, cancelled: bool = False) -> ScheduledSequence:
    return ScheduledSequence(token_ids=[0] * num_tokens, owner=name, is_cancelled=lambda: cancelled)


def names(batch: list[ScheduledSequence]) -> list[str]:
    return [sequence.owner for sequence in batch]


def test_fifo_order_across_requests():
    scheduler = Scheduler(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    scheduler.submit([seq("a", 5), seq("b", 5)])
    scheduler.submit([seq("c", 5)])
    assert names(scheduler.next_batch(timeout=0)) == ["a", "b", "c"]


def test_batch_stays_under_token_budget():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=1000)
    scheduler.submit([seq(str(i), 4) for i in range(5)])
    batches = [names(scheduler.next_batch(timeout=0)) for _ in range(3)]
    assert batches == [["0", "1"], ["2", "3"], ["4"]]
    assert scheduler.queued_tokens == 0


def test_first_sequence_that_does_not_fit_closes_the_batch():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=1000)
    # "big" does not fit after "a"; the small "c" behind it must not jump the queue
    scheduler.submit([seq("a", 4), seq("big", 8), seq("c", 1)])
    assert names(scheduler.next_batch(timeout=0)) == ["a"]
    assert names(scheduler.next_batch(timeout=0)) == ["big", "c"]


def test_sequence_budget():
    scheduler = Scheduler(max_batch_tokens=1000, max_batch_seqs=2, max_queue_tokens=1000)
    scheduler.submit([seq(str(i), 1) for i in range(5)])
    assert [len(scheduler.next_batch(timeout=0)) for _ in range(3)] == [2, 2, 1]


def test_cancelled_sequences_are_dropped_and_release_their_tokens():
    scheduler = Scheduler(max_batch_tokens=100, max_batch_seqs=10, max_queue_tokens=1000)
    scheduler.submit([seq("a", 5), seq("gone", 50, cancelled=True), seq("b", 5)])
    assert names(scheduler.next_batch(timeout=0)) == ["a", "b"]
    assert scheduler.queued_tokens == 0


def test_full_queue_refuses_a_whole_request_with_overloaded():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=20)
    scheduler.submit([seq("a", 15)])
    with pytest.raises(Overloaded):
        scheduler.submit([seq("b", 3), seq("c", 3)])
    assert scheduler.queued_tokens == 15
    assert names(scheduler.next_batch(timeout=0)) == ["a"]
    scheduler.submit([seq("b", 3), seq("c", 3)])
    assert names(scheduler.next_batch(timeout=0)) == ["b", "c"]


def test_empty_queue_admits_a_request_larger_than_the_queue():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=10)
    scheduler.submit([seq(str(i), 8) for i in range(3)])
    assert [len(scheduler.next_batch(timeout=0)) for _ in range(3)] == [1, 1, 1]


def test_next_batch_waits_for_work_and_wakes_on_submit():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=100)
    assert scheduler.next_batch(timeout=0.01) == []
    timer = threading.Timer(0.05, lambda: scheduler.submit([seq("late", 2)]))
    timer.start()
    assert names(scheduler.next_batch(timeout=5)) == ["late"]


def test_stopped_scheduler_refuses_work_and_wakes_waiters():
    scheduler = Scheduler(max_batch_tokens=10, max_batch_seqs=10, max_queue_tokens=100)
    threading.Timer(0.05, scheduler.stop).start()
    assert scheduler.next_batch(timeout=5) == []
    with pytest.raises(EngineStopped):
        scheduler.submit([seq("a", 1)])
