"""A model `posy serve` refuses ends it in one line, `posy: cannot serve: <reason>`, exit code 2, whatever
the layout and wherever the refusal comes (at resolve, from the checkpoint's tensors, while the lifespan
loads): never a traceback or uvicorn's exception group."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.token_checkpoints import splade_checkpoint
from tests.engine.checkpoint_edits import without_tensor

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve(*flags: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "api", "serve", "--device", "cpu", "--port", str(free_port()), *flags]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=240, check=False)


def assert_refused(result: subprocess.CompletedProcess, reason: str) -> None:
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("posy: cannot serve: ") and reason in lines[-1], output[-3000:]
    assert sum("cannot serve" in line for line in output.splitlines()) == 1
    for noise in ("Traceback", "ExceptionGroup", "Exception Group", "Application startup failed"):
        assert noise not in output, output[-3000:]


@pytest.mark.parametrize("layout", [(), ("--api-workers", "2")])
def test_a_missing_tensor_is_one_line(minilm_path, tmp_path, layout):
    folder = splade_checkpoint(minilm_path, tmp_path / "splade")
    name = without_tensor(folder, "cls.predictions.transform.dense.weight")
    assert_refused(serve("--model", str(folder), *layout), f"missing: ['{name.removeprefix('bert.')}']")


def test_an_unsupported_splade_pooling_is_one_line(minilm_path, tmp_path):
    folder = splade_checkpoint(minilm_path, tmp_path / "splade")
    (folder / "1_SpladePooling" / "config.json").write_text(json.dumps({"pooling_strategy": "mean"}))
    assert_refused(
        serve("--model", str(folder)), "SpladePooling {'pooling_strategy': 'mean'} is not supported"
    )


@pytest.mark.parametrize("layout", [("--engine-process", "off"), ("--engine-process", "on")])
def test_a_refusal_while_the_lifespan_loads_is_one_line(layout):
    """What only building the engine finds (here an attention backend the CPU cannot run) is refused in the
    lifespan, under uvicorn, which would log Litestar's exception group; or in the engine's own process,
    which says why to the gateway instead of printing its traceback."""
    assert_refused(
        serve("--attention-backend", "flashinfer", *layout),
        "attention backend 'flashinfer' cannot run on cpu",
    )
