"""The gateway's AnswerTime: how long it lately took to answer once a request's rows were back (its loop's
lag, the encoding), kept out of the time the engine is given, so that work admitted in time is answered
in time."""

import asyncio
import time

import pytest

from api.config import ServerConfig
from api.guard import RequestGuard
from api.timing import ANSWER_QUANTILE, TIMES, AnswerTime, RequestTimes
from engine.request import EngineOutput
from engine.service_rate import RECOVERY_HALF_LIFE_S

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)


def test_the_reserve_is_a_high_quantile_of_the_recent_answers():
    answers = AnswerTime()
    assert answers.reserve_s() == 0.0
    for milliseconds in range(128):  # the last 64: 64 to 127 ms
        answers.observe(milliseconds / 1000, at=100.0)
    assert answers.reserve_s(100.0) == pytest.approx((64 + int(ANSWER_QUANTILE * 64)) / 1000)
    for _ in range(64):  # the loop caught up: the reserve follows it down
        answers.observe(0.001, at=100.0)
    assert answers.reserve_s(100.0) == pytest.approx(0.001)


def test_a_flood_s_reserve_fades_once_no_answer_comes_to_lower_it():
    """After a flood, no request may be answered for a while: the slow answers it left must not shorten the
    time of the next requests for good. The reserve halves every RECOVERY_HALF_LIFE_S of quiet."""
    answers = AnswerTime()
    for _ in range(64):
        answers.observe(1.0, at=100.0)
    assert answers.reserve_s(100.0) == pytest.approx(1.0)
    assert answers.reserve_s(100.0 + RECOVERY_HALF_LIFE_S) == pytest.approx(0.5)
    assert answers.reserve_s(100.0 + 5 * RECOVERY_HALF_LIFE_S) < 0.05


def test_a_requests_answer_time_runs_from_its_last_rows_back_to_its_answer():
    times = RequestTimes(arrived=10.0)
    assert times.answer_s() is None  # never ran on the engine
    times.add_rows_back(submitted=10.1, queue_s=0.2, inference_s=0.3)  # back at 10.6
    times.add_rows_back(submitted=10.7, queue_s=0.0, inference_s=0.1)  # a second call, back at 10.8
    times.answered = 11.0
    assert times.answer_s() == pytest.approx(0.2)


class Recording:
    """A stand-in engine: idle, measured, answering at once; it keeps the deadline it was given."""

    def __init__(self):
        self.deadlines = []

    def backlog_seconds(self, num_tokens):
        return 0.0

    def estimate_seconds(self, num_tokens):
        return 0.0

    def enqueue(self, token_ids, token_type_ids=None, deadline=None, rows=None):
        self.deadlines.append(deadline)
        future = asyncio.get_running_loop().create_future()
        future.set_result(EngineOutput(None, 0.0, 0.0, sum(map(len, token_ids))))
        return future


class Call:
    def __init__(self, times: RequestTimes):
        self.scope = {"state": {TIMES: times}}
        self.receive = None


def test_the_engine_is_given_the_time_left_less_the_gateways_reserve():
    engine = Recording()
    arrived = time.perf_counter()
    times = RequestTimes(arrived, answer_reserve_s=0.3)
    guard = RequestGuard(engine, Call(times), ServerConfig(request_timeout=5.0))
    asyncio.run(guard.run([[1, 2, 3]]))
    assert engine.deadlines == [pytest.approx(arrived + 5.0 - 0.3)]
    assert times.rows_back is not None


def test_tokenizations_at_once_count_their_wall_time_once():
    """A request that tokenizes (or decodes images) in several parts at once reports the time any of them
    ran, not their sum: x-tokenization-time stays within x-total-time."""
    times = RequestTimes(time.perf_counter())
    guard = RequestGuard(Recording(), Call(times), ServerConfig(request_timeout=5.0))

    async def both():
        await asyncio.gather(*(guard.tokenized(asyncio.sleep(0.2)) for _ in range(3)))
        await guard.tokenized(asyncio.sleep(0.1))  # a later one adds its own

    started = time.perf_counter()
    asyncio.run(both())
    assert 0.3 <= times.tokenization_s <= time.perf_counter() - started
