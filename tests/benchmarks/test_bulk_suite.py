"""The bulk suite in its CPU smoke mode: posy embed against the engine alone, with the output gate."""

import argparse

from benchmarks import bulk


def test_bulk_smoke_run_records_the_jobs_rate_against_the_engines_and_passes_its_gate():
    outcome = bulk.run(argparse.Namespace(suite="bulk", rounds=1, backend="auto", smoke=True))
    assert outcome.failures == []
    records = {(record.case, record.metric): record for record in outcome.records}
    rate = records["embed-2k-50tok", "tokens_per_s"]
    assert rate.value > 0 and rate.baseline > 0 and rate.ratio == rate.value / rate.baseline
    assert records["embed-2k-50tok", "rows_per_s"].value > 0
    assert records["embed-2k-50tok", "min_cosine_vs_engine"].value >= 0.99999
