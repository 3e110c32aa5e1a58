"""The HTTP benchmark suites (throughput, concurrency) in their CPU smoke mode: a live server, client
processes, the parity gate, and every case and metric they report."""

import argparse
import dataclasses

import pytest

from benchmarks import concurrency, throughput


def smoke(suite: str) -> argparse.Namespace:
    return argparse.Namespace(suite=suite, rounds=1, backend="auto", smoke=True)


def by_case_and_metric(outcome) -> dict:
    return {(record.case, record.metric): record for record in outcome.records}


def test_throughput_smoke_run_records_both_variants_against_the_baseline():
    outcome = throughput.run(smoke("throughput"))
    assert outcome.failures == []
    records = by_case_and_metric(outcome)
    cases = ("http-100x16-512", "http-100x50")
    metrics = ("tokens_per_s", "errors", "min_cosine_vs_fp32_reference")
    assert set(records) == {(case, metric) for case in cases for metric in metrics}
    for case in cases:
        assert records[case, "errors"].value == 0
        rate = records[case, "tokens_per_s"]
        assert rate.value > 0 and rate.baseline > 0 and rate.ratio == rate.value / rate.baseline
        assert records[case, "min_cosine_vs_fp32_reference"].value >= 0.9999  # fp32 on both sides here
    assert all(record.gpu is None and record.suite == "throughput" for record in outcome.records)


def test_concurrency_smoke_run_records_every_level_and_the_target_ratios():
    outcome = concurrency.run(smoke("concurrency"))
    assert outcome.failures == []
    records = by_case_and_metric(outcome)
    levels = ("clients-1", "clients-2")
    metrics = ("latency_p50_ms", "latency_p99_ms", "requests_per_s", "tokens_per_s", "errors")
    assert set(records) == (
        {(case, metric) for case in levels for metric in metrics}
        | {("clients-1", "min_cosine_vs_fp32_reference")}
        | {("clients-2-vs-1", "throughput_ratio"), ("clients-2-vs-1", "latency_p50_ratio")}
    )
    for case in levels:
        assert records[case, "errors"].value == 0
        assert records[case, "requests_per_s"].value > 0 and records[case, "tokens_per_s"].value > 0
        assert records[case, "latency_p99_ms"].value >= records[case, "latency_p50_ms"].value > 0
    assert records["clients-1", "min_cosine_vs_fp32_reference"].value >= 0.9999
    assert records["clients-2-vs-1", "throughput_ratio"].value > 0
    assert all(record.gpu is None and record.suite == "concurrency" for record in outcome.records)


@pytest.mark.serial  # compares its HTTP latencies with its engine's: alone (tests/serial.py)
def test_online_smoke_run_records_every_case_beside_the_engine_and_its_stage_timings(monkeypatch):
    from benchmarks import online

    # the smoke plan's windows halved and the replica hop in two rounds of the same window, not four: every
    # case and record still comes, from the same servers (whose starts are most of the test's time)
    short = dataclasses.replace(online.SMOKE, window_s=online.SMOKE.window_s / 2, overload_s=1.0)
    monkeypatch.setattr(online, "SMOKE", short)
    monkeypatch.setattr(online, "HOP_ROUNDS", online.HOP_ROUNDS // 2)
    outcome = online.run(smoke("online"))
    assert outcome.failures == []
    records = by_case_and_metric(outcome)
    engine_b1 = records["engine-b1", "latency_p50_ms"].value
    assert records["engine-b1-after-idle", "latency_p50_ms"].value > 0
    for case in ("b1-raw", "b1-httpx", "b1-raw-replica", "b1-raw-in-process"):
        p50 = records[case, "latency_p50_ms"]
        assert p50.baseline == engine_b1 and p50.value > engine_b1  # HTTP costs something over the engine
        assert records[case, "errors"].value == 0
        for stage in ("total", "tokenization", "queue", "inference"):
            assert records[case, f"server_{stage}_p50_ms"].value >= 0
        assert records[case, "server_total_p50_ms"].value < p50.value  # the server's share of the client's
    many = records["clients-2-8x12", "tokens_per_s"]
    assert many.baseline == records["engine-8x12", "tokens_per_s"].value and many.ratio > 0
    assert records["clients-2-raw", "requests_per_s"].value > 0
    assert ("replica-hop", "latency_p50_ms") in records
    assert records["overload-2x", "other_answers"].value == 0
    assert records["overload-2x", "answered_429_without_retry_after"].value == 0
    assert records["overload-2x", "answered_200"].value > 0
    assert ("overload-2x", "memory_growth_second_half_mib") in records
    assert ("overload-2x", "refused_latency_p99_ms") in records
