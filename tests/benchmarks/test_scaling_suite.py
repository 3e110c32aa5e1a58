"""The scaling suite in its CPU smoke mode: servers of one and two replica processes, both loads on each,
the scaling efficiency, and a 2048-text request split over the replicas equal to one replica's rows."""

import argparse

from benchmarks import scaling


def test_scaling_smoke_run_records_both_loads_at_each_replica_count_and_the_split_check():
    outcome = scaling.run(argparse.Namespace(suite="scaling", rounds=1, backend="auto", smoke=True))
    assert outcome.failures == []
    records = {(record.case, record.metric): record for record in outcome.records}
    heavy, many = "http-100x16-512", "clients-2"
    heavy_metrics = ("tokens_per_s", "tokens_per_s_per_gpu", "latency_p50_ms", "errors")
    many_metrics = ("latency_p50_ms", "latency_p99_ms", "requests_per_s", *heavy_metrics[:2], "errors")
    expected = set()
    for layout in ("r1-w1", "r2-w1"):  # one gateway process in the smoke run
        expected |= {(f"{heavy}-{layout}", metric) for metric in heavy_metrics}
        expected |= {(f"{many}-{layout}", metric) for metric in many_metrics}
    expected |= {(f"{heavy}-r2-w1", "scaling_efficiency"), (f"{many}-r2-w1", "scaling_efficiency")}
    expected |= {
        ("split-2048-r2-w1", "min_cosine_vs_one_replica"),
        ("split-2048-r2-w1", "max_abs_diff_vs_one_replica"),
    }
    assert set(records) == expected
    for layout in ("r1-w1", "r2-w1"):
        for load in (heavy, many):
            assert records[f"{load}-{layout}", "errors"].value == 0
            assert records[f"{load}-{layout}", "tokens_per_s"].value > 0
    # two CPU replicas: a replica counts as a device
    per_gpu = records[f"{heavy}-r2-w1", "tokens_per_s_per_gpu"].value
    assert per_gpu == records[f"{heavy}-r2-w1", "tokens_per_s"].value / 2
    for load in (heavy, many):
        assert records[f"{load}-r2-w1", "scaling_efficiency"].value > 0
    assert records["split-2048-r2-w1", "min_cosine_vs_one_replica"].value >= 0.99999  # fp32 on both sides
    assert records["split-2048-r2-w1", "max_abs_diff_vs_one_replica"].value <= 1e-5
    assert all(record.gpu is None and record.suite == "scaling" for record in outcome.records)


def test_layouts_pass_api_workers_only_when_more_than_one():
    smoke = scaling.layouts(scaling.SMOKE, num_gpus=0)
    assert [(layout.num_replicas, layout.num_workers, layout.num_devices) for layout in smoke] == [
        (1, 1, 1), (2, 1, 2),
    ]  # fmt: skip
    assert smoke[1].flags == ("--replicas", "2")
    full = scaling.layouts(scaling.FULL, num_gpus=4)
    assert [layout.num_replicas for layout in full] == [1, 2, 4]
    assert [layout.num_devices for layout in full] == [1, 2, 4]
    assert all(layout.num_workers >= 1 for layout in full)
    wide = scaling.Layout(num_replicas=2, num_workers=4, num_devices=2)
    assert wide.flags == ("--replicas", "2", "--api-workers", "4") and wide.name == "r2-w4"


def test_records_name_the_gpus_the_replicas_ran_on():
    two_gpus, one_shared = scaling.Layout(2, 8, 2), scaling.Layout(2, 4, 1)
    assert two_gpus.hardware("NVIDIA H200") == "2x NVIDIA H200"
    assert one_shared.hardware("NVIDIA H200") == "NVIDIA H200"  # two replicas sharing one GPU
    assert two_gpus.hardware(None) is None  # on the CPU
