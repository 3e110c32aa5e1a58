"""Estimates that come back by themselves (issue 57): a rate measured on a busy host must not refuse, for
ever, work that the quiet host finishes in time. An idle engine probes itself and a probe that finds
another host replaces the batches' rate; a rate with a reference (the tokenizer threads') is pulled back
toward it as its latest observation ages; the rate queued work is held to on its way follows the latest
batch at once."""

import asyncio
import time

import pytest

from engine.batch import pack
from engine.config import EngineConfig
from engine.engine import Engine
from engine.service_rate import (
    PROBE_AFTER_S,
    PROBE_TOLERANCE,
    RECOVERY_HALF_LIFE_S,
    MovingRate,
    ServiceRate,
)
from tests.conftest import TimedRunner

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

SECONDS_PER_TOKEN = 1e-4


def test_a_probe_that_finds_another_host_replaces_the_batches_and_one_that_agrees_adds_to_them():
    rate = ServiceRate(max_batch_tokens=1000)
    for _ in range(10):
        rate.observe(1000, 2.0)  # a busy host: 2 ms a token
    assert rate.seconds_per_token == pytest.approx(2e-3)
    assert rate.observe_probe(125, 125 * 1e-4)  # the quiet host: 0.1 ms a token
    assert rate.seconds_per_token == pytest.approx(1e-4)
    assert rate.idle_seconds_per_token == pytest.approx(1e-4)
    # within PROBE_TOLERANCE it is one more observation
    assert not rate.observe_probe(125, 125 * 1e-4 * (PROBE_TOLERANCE - 0.05))
    assert 1e-4 < rate.seconds_per_token < 1e-4 * PROBE_TOLERANCE


def test_a_probe_comes_where_batches_measured_a_slower_engine_once_they_age_and_only_then():
    """A request that comes during a probe waits for it: an engine whose rate agrees with its probes never
    probes, and a busy spell costs one probe."""
    rate = ServiceRate(max_batch_tokens=1000)
    assert not rate.probe_due(time.perf_counter() + 100)  # nothing to compare with before a measurement
    rate.observe_probe(125, 125 * 1e-4)  # the start-up's seed: 0.1 ms a token
    rate.observe(1000, 0.11)  # batches that agree with it: no probe, however long it idles
    assert not rate.probe_due(time.perf_counter() + 100)
    for _ in range(32):
        rate.observe(1000, 0.5)  # a busy spell: five times slower
    measured = time.perf_counter()
    assert not rate.probe_due(measured + PROBE_AFTER_S / 2)
    assert rate.probe_due(measured + PROBE_AFTER_S)
    rate.observe_probe(125, 125 * 5e-4)  # the host is still busy: the probe agrees, and joins the batches
    assert rate.idle_seconds_per_token == pytest.approx(5e-4, rel=1e-3)  # (recovering from now on)
    assert not rate.probe_due(time.perf_counter() + 100)
    assert rate.num_probes == 2


def test_an_idle_engine_measures_itself_again_once_the_busy_spell_is_over():
    """The newcomer's lock: batches run while another process took the host measured it many times
    slower; no traffic came afterwards to measure it again, and every request of ordinary size was refused.
    The idle engine's probe (the batch build_engine seeds its rate with) finds the quiet host within about
    PROBE_AFTER_S."""
    runner = TimedRunner(SECONDS_PER_TOKEN)
    engine = Engine(runner, EngineConfig(max_batch_tokens=1000, max_queue_tokens=10**6))
    engine.probe_batch = pack([[0] * 125])
    engine.probe()
    assert engine.rate.seconds_per_token == pytest.approx(SECONDS_PER_TOKEN, rel=0.5)
    engine.start()
    try:
        runner.seconds_per_token = 10 * SECONDS_PER_TOKEN  # the host is busy with other work

        async def busy() -> None:
            await engine.run([[1] * 1000] * 2)

        asyncio.run(busy())
        assert engine.rate.seconds_per_token > 5 * SECONDS_PER_TOKEN
        runner.seconds_per_token = SECONDS_PER_TOKEN  # and quiet again; nothing is sent
        deadline = time.perf_counter() + PROBE_AFTER_S + 2.0
        while engine.rate.seconds_per_token > 2 * SECONDS_PER_TOKEN:
            assert time.perf_counter() < deadline, engine.rate.seconds_per_token
            time.sleep(0.05)
        assert engine.rate.num_probes >= 2
    finally:
        engine.stop()


def test_a_rate_slower_than_its_reference_halves_its_excess_every_half_life_without_observations():
    moving = MovingRate(8, half_life_s=2.0)
    moving.measured_reference = 1e-6
    moving.add(1000, 1000 * 9e-6, at=time.perf_counter())
    assert moving.seconds_per_unit == pytest.approx(9e-6, rel=1e-3)
    moving.latest_at -= 2.0  # two seconds on
    assert moving.seconds_per_unit == pytest.approx(5e-6, rel=1e-3)
    moving.latest_at -= 8.0
    assert moving.seconds_per_unit == pytest.approx(1e-6 + 8e-6 / 32, rel=1e-3)
    moving.add(1000, 1000 * 0.5e-6)  # faster than the reference: taken as it is
    moving.restart(1000, 1000 * 0.5e-6)
    assert moving.seconds_per_unit == pytest.approx(0.5e-6)
    # without a quiet host's measure (an image pool's), the fastest observation yet is the reference
    unmeasured = MovingRate(8, half_life_s=2.0)
    unmeasured.add(1000, 1000 * 1e-6)
    unmeasured.add(1000, 1000 * 17e-6)
    assert unmeasured.reference == pytest.approx(1e-6)
    unmeasured.latest_at -= 20.0
    assert unmeasured.seconds_per_unit == pytest.approx(1e-6, rel=0.01)


def test_queued_work_is_held_to_its_deadline_on_the_latest_batch_where_it_was_slower():
    rate = ServiceRate(max_batch_tokens=1000)
    for _ in range(31):
        rate.observe(1000, 0.1)
    rate.observe(1000, 0.4)  # the host just slowed: one batch of 32 in the window
    assert rate.seconds_per_token == pytest.approx((31 * 0.1 + 0.4) / 32000)
    assert rate.guarded_seconds_per_token == pytest.approx(4e-4, rel=1e-3)
    rate.observe(1000, 0.1)
    assert rate.guarded_seconds_per_token == pytest.approx(rate.seconds_per_token)


def test_a_probe_taken_during_a_flood_recovers_while_idle_and_the_next_batch_keeps_it():
    """The flood's lock: the idle engine probed while the flood still had the host; the probe agreed with the
    flood's batches, so no later probe came, and the rates it left refused for good work the quiet host
    runs in time. While the engine is idle every rate recovers toward the quiet host's (the fastest measure
    yet), and the next batch keeps that recovery; a busy engine's rates do not recover (on 2 cores under a
    flood, rates that recovered between slow batches admitted work that came back late: 504s)."""
    rate = ServiceRate(max_batch_tokens=1000)
    rate.observe_probe(125, 125 * 1e-4)  # start-up, on the quiet host
    rate.launched(time.perf_counter())
    for _ in range(32):
        rate.observe(1000, 0.5)  # the flood: five times slower
    rate.observe_probe(125, 125 * 5e-4)  # an idle moment in the flood: the probe agrees
    assert not rate.probe_due(time.perf_counter() + 100)
    assert rate.quiet_seconds_per_token == pytest.approx(1e-4)
    assert rate.seconds_per_token == pytest.approx(5e-4, rel=0.01)  # busy: as measured
    rate.launched(None)  # the flood is over: the engine idles
    rate._idle_since -= 10 * RECOVERY_HALF_LIFE_S
    for recovered in (rate.seconds_per_token, rate.idle_seconds_per_token, rate.guarded_seconds_per_token):
        assert recovered == pytest.approx(1e-4, rel=0.01)
    rate.launched(time.perf_counter())  # the quiet host's first batch after it
    rate.observe(1000, 0.1)
    for kept in (rate.seconds_per_token, rate.idle_seconds_per_token, rate.guarded_seconds_per_token):
        assert kept == pytest.approx(1e-4, rel=0.01)
