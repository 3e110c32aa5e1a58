"""The HTTP benchmark suites (throughput, concurrency) in their CPU smoke mode: a live server, client
processes, the parity gate, and every case and metric they report."""

import argparse

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
