"""The process layout `posy serve` picks from the host: cores counted from affinity and the cgroup quota,
the engine in its own process with several gateways on a GPU host with the cores for it, one process on
the CPU or on few cores, and flags that always win."""

import os

import pytest

from api.layout import (
    MAX_GATEWAYS,
    MAX_IMAGE_THREADS,
    choose_layout,
    image_threads,
    tokenizer_threads,
    usable_cores,
)


def test_cores_are_the_affinity_capped_by_a_cgroup_v2_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert usable_cores(tmp_path) == affinity  # no cgroup files: the affinity
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cores(tmp_path) == affinity
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert usable_cores(tmp_path) == min(affinity, 1.5)


def test_a_cgroup_v1_quota_counts_too(tmp_path):
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cores(tmp_path) == 0.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert usable_cores(tmp_path) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "cores, engines, gateways, engine_process",
    [
        (16, 1, 7, True),  # the H200 host: 2 cores for the engine, a gateway per 2 of the other 14
        (8, 1, 3, True),
        (6, 1, 2, True),
        (4, 1, 1, False),  # too few cores to split: one process
        (2.5, 1, 1, False),  # a quota of 2.5 cores
        (128, 8, MAX_GATEWAYS, True),
        (4, 2, 1, True),  # two GPUs: their replicas are processes whatever the cores
    ],
)
def test_a_gpu_host_is_laid_out_from_its_cores(cores, engines, gateways, engine_process):
    layout = choose_layout("cuda", cores, engines)
    assert (layout.api_workers, layout.engine_process) == (gateways, engine_process)
    assert f"{cores:g} usable cores" in layout.reason


def test_the_cpu_default_is_one_process():
    layout = choose_layout("cpu", 64, 1)
    assert (layout.api_workers, layout.engine_process) == (1, False)


def test_flags_win():
    assert choose_layout("cuda", 16, 1, api_workers=1) == choose_layout("cuda", 16, 1, 1, None)
    assert choose_layout("cuda", 16, 1, api_workers=1).engine_process is False
    assert choose_layout("cuda", 16, 1, api_workers=1, engine_process=True).engine_process is True
    assert choose_layout("cpu", 2, 1, engine_process=True).engine_process is True
    several = choose_layout("cuda", 2, 1, api_workers=3, engine_process=False)
    assert (several.api_workers, several.engine_process) == (3, True)  # gateways share replica processes


@pytest.mark.parametrize(
    ("cores", "gateways", "threads"),
    [(2, 1, 2), (16, 7, 4), (16, 1, 8), (8, 3, 2), (64, 8, 8), (1, 1, 1), (0.5, 1, 1)],
)
def test_a_large_tokenization_is_split_over_a_quarter_of_the_host_at_least(cores, gateways, threads):
    assert tokenizer_threads(cores, gateways) == threads


@pytest.mark.parametrize(("cores", "threads"), [(2, 2), (16, 16), (0.5, 1), (256, MAX_IMAGE_THREADS)])
def test_each_gateway_decodes_a_requests_images_on_the_hosts_cores(cores, threads):
    assert image_threads(cores) == threads
