"""The qwen3 benchmark suite in its CPU smoke mode: its code runs, its parity gates pass, and it
records every case it reports."""

import argparse

from benchmarks import qwen3


def test_smoke_run_records_every_case_and_passes_its_parity_gates():
    options = argparse.Namespace(suite="qwen3", rounds=1, backend="auto", smoke=True)
    outcome = qwen3.run(options)
    assert outcome.failures == []
    measured = {(record.case, record.metric) for record in outcome.records}
    assert measured == {
        ("qwen3-batch1x128", "latency_p50_ms"),
        ("qwen3-mixed100", "real_tokens_per_s"),
        ("qwen3-mixed100", "min_cosine_vs_fp32_reference"),
    }
    by_metric = {record.metric: record for record in outcome.records}
    assert by_metric["min_cosine_vs_fp32_reference"].value >= 0.9999  # fp32 on both sides here
    assert all(record.gpu is None for record in outcome.records)
