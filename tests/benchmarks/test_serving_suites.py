"""The low-latency suites (1: embeddings, 2: scoring) in their CPU smoke mode, and RESULTS.md with the
serving suites' plots rendered from records: the benchmark code runs in CI and cannot rot."""

import argparse
import json

import pytest

from benchmarks import latency, scoring
from benchmarks.records import FIELDS
from benchmarks.render import render


def smoke(module, suite):
    return module.run(argparse.Namespace(suite=suite, rounds=1, backend="auto", smoke=True))


def test_latency_suite_times_every_case_against_the_baseline():
    outcome = smoke(latency, "latency")
    assert outcome.failures == []
    p50 = {record.case: record for record in outcome.records if record.metric == "latency_p50_ms"}
    cases = {
        "bert-base-128",
        "bert-base-512",
        "qwen3-0.6b-4096",
        "http-bert-base-128",
        "http-bert-base-128-httpx",
    }
    assert set(p50) == cases
    for case, record in p50.items():
        assert record.value > 0 and (case.startswith("http") or record.baseline > 0)
    cosines = [record.value for record in outcome.records if record.metric == "min_cosine_vs_fp32_reference"]
    assert len(cosines) == 3 and min(cosines) >= 0.9999  # fp32 on both sides in the smoke run


def test_scoring_suite_times_every_document_count_for_both_models():
    outcome = smoke(scoring, "scoring")
    assert outcome.failures == []
    cases = {record.case for record in outcome.records if record.metric == "latency_p50_ms"}
    judge = "qwen3-reranker-0.6b"
    # the causal judge's cases also with shared prefixes, and the 40-token query's (smoke: 8 passages)
    judge_cases = {f"{judge}-{count}x128" for count in (5, 25, 50)} | {f"{judge}-50x{94}"}
    assert cases == {f"bert-base-cross-encoder-{count}x128" for count in (5, 25, 50)} | judge_cases | {
        f"{case}-shared" for case in judge_cases
    }
    speedups = {record.case for record in outcome.records if record.metric == "shared_prefix_speedup"}
    assert speedups == judge_cases
    errors = [record.value for record in outcome.records if record.metric == "max_score_error_vs_fp32"]
    assert len(errors) == 3 + 2 * len(judge_cases) and max(errors) <= 1e-4


def record(suite, case, metric, value, baseline=None):
    ratio = value / baseline if baseline else None
    values = (suite, case, "m", "NVIDIA H200", "2.11", "triton", "abc1234", "2026-11-29", metric, value, "ms")
    return dict(zip(FIELDS, (*values, baseline, ratio)))


def test_render_links_a_plot_under_each_serving_suite(tmp_path):
    pytest.importorskip("matplotlib")
    results = tmp_path / "results"
    results.mkdir()
    suites = {
        "latency": [record("latency", "bert-base-128", "latency_p50_ms", 0.5, 5.0),
                    record("latency", "qwen3-0.6b-4096", "latency_p50_ms", 9.0, 28.0),
                    record("latency", "http-bert-base-128", "latency_p50_ms", 1.2)],
        "scoring": [record("scoring", f"bert-base-cross-encoder-{n}x512", "latency_p50_ms", n / 6, n / 2)
                    for n in (5, 25, 50)],
        "throughput": [record("throughput", "http-100x50", "tokens_per_s", 2.1e6, 0.7e6)],
        "concurrency": [record("concurrency", f"clients-{n}", metric, n * value)
                        for n in (1, 2, 4) for metric, value in
                        (("latency_p50_ms", 1.0), ("latency_p99_ms", 2.0), ("requests_per_s", 500.0))],
        "engine": [record("engine", "batch1x128", "latency_p50_ms", 0.6, 5.5)],
    }  # fmt: skip
    for suite, records in suites.items():
        (results / f"{suite}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    output = render(results, tmp_path / "RESULTS.md", tmp_path / "plots")
    text = output.read_text()
    for suite in ("latency", "scoring", "throughput", "concurrency"):
        assert f"![{suite}](plots/{suite}.png)" in text
        assert (tmp_path / "plots" / f"{suite}.png").stat().st_size > 1000
    assert "![engine]" not in text  # no plot for the other suites, only their tables
    assert "| batch1x128 | latency_p50_ms |" in text


def test_render_puts_a_suites_notes_above_its_table_and_none_under_the_others(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    for suite in ("scaling", "engine"):
        line = json.dumps(record(suite, "batch1x128", "latency_p50_ms", 0.6)) + "\n"
        (results / f"{suite}.jsonl").write_text(line)
    (results / "scaling.md").write_text("Run with `bash benchmarks/gpu_run.sh COMMIT scaling`.\n\n")
    text = render(results, tmp_path / "RESULTS.md", tmp_path / "plots").read_text()
    scaling, engine = text.split("## scaling")[1], text.split("## engine")[1].split("## scaling")[0]
    assert scaling.index("Run with `bash benchmarks/gpu_run.sh COMMIT scaling`.") < scaling.index("| case |")
    assert "gpu_run" not in engine
