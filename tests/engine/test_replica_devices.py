"""Where replicas run: by default one per visible GPU, each on its own (more replicas than GPUs share them
in turn), on a named GPU or the CPU one. On a host of two or more GPUs, a server started without
--replicas runs one replica on every GPU and its vectors match the fp32 reference."""

import os
import random
import subprocess

import pytest
import torch

from engine.replicas import replica_set as replicas


@pytest.fixture
def two_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


def test_by_default_one_replica_per_visible_gpu_and_one_elsewhere(two_gpus):
    assert replicas.replica_count(None, "cuda") == 2
    assert replicas.replica_count(None, "cuda:1") == 1  # a named GPU: the server stays on it
    assert replicas.replica_count(None, "cpu") == 1
    assert replicas.replica_count(3, "cuda") == 3
    with pytest.raises(ValueError, match="at least 1"):
        replicas.replica_count(0, "cuda")


def test_replicas_take_the_gpus_in_turn_and_keep_a_named_device(two_gpus):
    assert [replicas._device("cuda", index) for index in range(4)] == ["cuda:0", "cuda:1", "cuda:0", "cuda:1"]
    assert replicas._device("cuda:1", 0) == "cuda:1"
    assert replicas._device("cpu", 1) == "cpu"


def nvidia_smi(query: str) -> list[list[str]]:
    output = subprocess.check_output(["nvidia-smi", f"--query-{query}", "--format=csv,noheader"], text=True)
    return [line.split(", ") for line in output.splitlines() if line]


def gpus_with_a_process_other_than(pid: int) -> set[str]:
    return {uuid for uuid, other in nvidia_smi("compute-apps=gpu_uuid,pid") if int(other) != pid}


@pytest.mark.gpu
def test_a_server_on_several_gpus_runs_a_replica_on_each_by_default():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two or more GPUs")
    from benchmarks.baseline import min_cosine
    from benchmarks.checkpoints import words
    from benchmarks.live_server import serve_random_bert, served_info
    from benchmarks.load import embed_over_http

    num_gpus = torch.cuda.device_count()
    rng = random.Random(0)
    texts = [words(rng.randint(4, 60), rng) for _ in range(512)]
    with serve_random_bert("test", "smoke", "cuda", "bfloat16", "auto", "m") as (url, baseline, _):
        assert served_info(url, "replicas") == str(num_gpus)
        every_gpu = {uuid for (uuid,) in nvidia_smi("gpu=uuid")}
        assert gpus_with_a_process_other_than(os.getpid()) == every_gpu
        vectors, _ = embed_over_http(url, texts, "m")  # split over every replica
        assert min_cosine(vectors, baseline.embed(texts)) >= 0.999  # bf16 against fp32
