"""serve(): a real `python -m api serve` process on a free loopback port for the HTTP suites, stopped
(SIGTERM, then kill) when the block ends; its log is printed if it fails to become ready."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 300.0  # loading and warming up a real-size model on a fresh machine compiles kernels


class ServerFailed(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def serve(model: Path | None, *flags: str) -> Iterator[str]:
    """The base URL of a ready server for `model` (None: the bundled one) started with `flags`."""
    port = free_port()
    command = [sys.executable, "-m", "api", "serve", "--port", str(port), "--drain-grace", "0", *flags]
    if model is not None:
        command += ["--model", str(model)]
    env = {name: value for name, value in os.environ.items() if not name.startswith("POSY_")}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1", POSY_LOG_LEVEL="warning")
    with serve_process(command, env, port, "/ready") as url:
        yield url


@contextmanager
def serve_process(command: list[str], env: dict[str, str], port: int, ready_path: str) -> Iterator[str]:
    """Run a server process (its log kept aside) until `ready_path` answers 200 on `port`; its base URL.
    It is stopped (SIGTERM, then kill) when the block ends; its log is in the error if it never gets
    ready."""
    import httpx

    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            with httpx.Client(timeout=2.0, trust_env=False) as client:
                while not _ready(client, url + ready_path):
                    if process.poll() is not None or time.monotonic() > deadline:
                        log.seek(0)
                        output = log.read().decode(errors="replace")[-6000:]
                        raise ServerFailed(f"`{' '.join(command)}` did not become ready:\n{output}")
                    time.sleep(0.25)
            yield url
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def served_backend(url: str) -> str:
    """The attention backend the server's (first) model runs, from its `posy_model_info` metric."""
    return served_info(url, "attention_backend")


def served_info(url: str, label: str) -> str:
    """A label of the server's (first) `posy_model_info` metric: attention_backend, replicas, ..."""
    import re

    import httpx

    text = httpx.get(f"{url}/metrics", timeout=10.0, trust_env=False).text
    found = re.search(rf'posy_model_info\{{[^}}]*\b{label}="([^"]+)"', text)
    return found.group(1) if found else "unknown"


def _ready(client, url: str) -> bool:
    import httpx

    try:
        return client.get(url).status_code == 200
    except httpx.TransportError:
        return False


@contextmanager
def serve_random_bert(
    suite: str, shape: str, device: str, dtype: str, backend: str, served_name: str, *extra_flags: str
):
    """The HTTP suites' setup: a random-weight BERT of `shape` (seeded: the same weights every time), its
    fp32 baseline, a ready server for it started with `extra_flags` besides the suites' own, and the suite's
    RunContext carrying the attention backend the server chose. Yields (url, baseline, context)."""
    import dataclasses

    import torch

    from benchmarks.baseline import Baseline
    from benchmarks.checkpoints import save_bert
    from benchmarks.records import RunContext

    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    flags = (
        "--device",
        device,
        "--dtype",
        dtype,
        "--attention-backend",
        backend,
        "--served-model-name",
        served_name,
        *extra_flags,
    )
    with tempfile.TemporaryDirectory() as folder:
        checkpoint = save_bert(Path(folder), shape)
        baseline = Baseline(checkpoint, device, torch.float32)
        with serve(checkpoint.folder, *flags) as url:
            context = RunContext(
                suite=suite, model=f"{shape}-shape (random weights)", gpu=gpu, backend=backend
            )
            yield url, baseline, dataclasses.replace(context, backend=served_backend(url))
