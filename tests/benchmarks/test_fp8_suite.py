"""The fp8 suite in its CPU smoke mode (FP8 emulated): every case runs bf16 and fp8 engines on the same
weights and records fp8's figure against bf16's (HF's ratio for Qwen2), its target and fp8's drift, which
stays within the suite's bounds; the batch-1 case has no target."""

import argparse

from benchmarks import fp8


def test_smoke_run_records_each_case_against_bf16_with_its_target_and_drift():
    outcome = fp8.run(argparse.Namespace(suite="fp8", rounds=1, backend="auto", smoke=True))
    assert outcome.failures == []
    by_case = {}
    for record in outcome.records:
        by_case.setdefault(record.case, {})[record.metric] = record
    assert set(by_case) == set(fp8.TARGETS)
    for case, (metric, target, _) in fp8.TARGETS.items():
        measured = by_case[case]
        assert measured[metric].value > 0 and measured[metric].baseline > 0
        if target is None:  # measured, no target (batch 1)
            assert f"{metric}_target" not in measured
        else:
            assert measured[f"{metric}_target"].value == target
        drift = next(record for name, record in measured.items() if "vs_bf16" in name)
        if "cosine" in drift.metric:
            assert drift.value >= fp8.MIN_COSINE
        else:
            assert drift.value <= fp8.MAX_SCORE_DRIFT
