"""`posy serve` flags and their POSY_* twins; serving a hub id from an offline HF cache."""

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from api.cli import apply_environment, build_parser, config_from_args
from engine.errors import UnsupportedModel

REPO = Path(__file__).resolve().parents[2]


def parse(argv, environ=None):
    parser, serve = build_parser()
    apply_environment(serve, environ or {})
    return config_from_args(parser.parse_args(argv))


def test_defaults_serve_the_bundled_model():
    config = parse(["serve"])
    assert config.models == (None,) and config.port == 8000 and not config.auto_truncate
    assert not config.accept_token_ids


def test_flags_and_aliases():
    config = parse(
        [
            "serve",
            "--model",
            "a",
            "--model",
            "b",
            "--served-model-name",
            "x,y",
            "--served-model-name",
            "z",
            "--auto-truncate",
            "--max-batch-tokens",
            "8192",
            "--api-key",
            "k",
        ]
    )
    assert config.models == ("a", "b")
    assert config.served_model_names == (("x", "y"), ("z",))
    assert config.auto_truncate and config.engine.max_batch_tokens == 8192 and config.api_key == "k"


def test_environment_twins_and_command_line_precedence():
    environ = {
        "POSY_PORT": "9001",
        "POSY_AUTO_TRUNCATE": "true",
        "POSY_MODEL": "m1;m2",
        "POSY_API_KEY": "env",
        "POSY_ACCEPT_TOKEN_IDS": "1",
    }
    config = parse(["serve", "--api-key", "flag"], environ)
    assert config.port == 9001 and config.auto_truncate and config.models == ("m1", "m2")
    assert config.accept_token_ids and parse(["serve", "--accept-token-ids"]).accept_token_ids
    assert config.api_key == "flag"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_hub_cache(root: Path, repo_id: str, source: Path) -> None:
    """The layout huggingface_hub reads offline: models--org--name/{refs/main, snapshots/<commit>/...}."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = root / ("models--" + repo_id.replace("/", "--"))
    shutil.copytree(source, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)


def test_serve_a_hub_id_from_the_offline_cache(tmp_path, minilm_path):
    build_hub_cache(tmp_path / "hub", "posy-test/minilm", minilm_path)
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HOME": str(tmp_path),
    }
    command = [sys.executable, "-m", "api", "serve", "--model", "posy-test/minilm", "--port", str(port)]
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if process.poll() is not None:
                pytest.fail(f"server exited: {process.stdout.read().decode()[-3000:]}")
            try:
                if httpx.get(f"{base}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        models = httpx.get(f"{base}/v1/models").json()["data"]
        assert [model["id"] for model in models] == ["posy-test/minilm"]
        response = httpx.post(f"{base}/v1/embeddings", json={"model": "posy-test/minilm", "input": "hello"})
        vector = np.asarray(response.json()["data"][0]["embedding"])
        assert vector.shape == (384,) and abs(np.linalg.norm(vector) - 1) < 1e-5
    finally:
        process.terminate()
        process.wait(30)


def test_an_unknown_hub_id_offline_fails_to_start(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path), "HF_HOME": str(tmp_path)}
    command = [sys.executable, "-m", "api", "serve", "--model", "nobody/nothing", "--port", str(free_port())]
    result = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode != 0
    assert "nobody/nothing" in result.stderr + result.stdout


def test_a_batch_budget_below_the_model_window_fails_at_start_up():
    from api.server import Server

    with pytest.raises(ValueError, match="max_batch_tokens"):
        Server(parse(["serve", "--max-batch-tokens", "100"])).resolve()


def test_max_model_len_caps_the_window_and_batch_tokens_grow_to_the_window(tmp_path):
    from api.server import Server

    capped = Server(parse(["serve", "--max-model-len", "128", "--device", "cpu"]))
    assert capped.resolve()[0].max_seq_length == 128
    # a model window above the CPU default of 4096 batch tokens raises the default instead of failing
    server = Server(parse(["serve", "--device", "cpu"]))
    assert server.engine_config(8192).max_batch_tokens == 8192
    assert server.engine_config(256).max_batch_tokens == 4096
    with pytest.raises(ValueError, match="max-model-len"):
        Server(parse(["serve", "--max-model-len", "0"])).resolve()


def test_bidirectional_reaches_the_model_spec(tmp_path):
    from api.server import Server
    from tests.engine.test_qwen3_parity import save_random_qwen3

    save_random_qwen3(tmp_path, "Qwen3Model", sentence_transformers="lasttoken")
    assert not Server(parse(["serve", "--model", str(tmp_path)])).resolve()[0].bidirectional
    spec = Server(parse(["serve", "--model", str(tmp_path), "--bidirectional"])).resolve()[0]
    assert spec.bidirectional and spec.pooling == "last"  # sentence-transformers' pooling still rules


def test_pooling_splade_reaches_the_model_spec_of_serve_and_embed(tmp_path, minilm_path):
    """TEI's --pooling splade: a bare *ForMaskedLM served (or embedded) as SPLADE; POSY_POOLING its twin."""
    from api.bulk.cli import job_config
    from api.cli import build_parsers
    from api.server import Server
    from tests.engine.test_sparse_checkpoints import masked_lm

    folder = str(masked_lm(minilm_path, tmp_path / "mlm"))
    with pytest.raises(UnsupportedModel, match="--pooling splade"):
        Server(parse(["serve", "--model", folder])).resolve()
    spec = Server(parse(["serve", "--model", folder], {"POSY_POOLING": "splade"})).resolve()[0]
    assert spec.task == "sparse_embed" and spec.splade is not None
    parser, _, _ = build_parsers()
    args = parser.parse_args(["embed", "in.csv", "--output", "out", "--model", folder, "--pooling", "splade"])
    assert job_config(args).source.resolve().task == "sparse_embed"
    with pytest.raises(SystemExit):
        parse(["serve", "--pooling", "max"])  # not one of TEI's values


def test_request_limits_flags_defaults_and_environment_twins():
    config = parse(["serve"])
    assert config.max_request_tokens == 1024 * 1024 and config.request_timeout == 60.0
    config = parse(["serve", "--max-request-tokens", "5000", "--request-timeout", "0"])
    assert config.max_request_tokens == 5000 and config.request_timeout == 0.0
    config = parse(["serve"], {"POSY_MAX_REQUEST_TOKENS": "777", "POSY_REQUEST_TIMEOUT": "2.5"})
    assert config.max_request_tokens == 777 and config.request_timeout == 2.5
    for argv in (["--max-request-tokens", "0"], ["--request-timeout", "-1"], ["--max-request-tokens", "x"]):
        with pytest.raises(SystemExit):
            parse(["serve", *argv])


def test_shared_prefixes_flag_reaches_the_engine_config(tmp_path):
    from api.server import Server
    from tests.engine.test_qwen3_parity import save_random_qwen3

    assert parse(["serve"]).engine.shared_prefixes
    assert not parse(["serve", "--shared-prefixes", "off"]).engine.shared_prefixes
    assert not parse(["serve"], {"POSY_SHARED_PREFIXES": "off"}).engine.shared_prefixes
    with pytest.raises(SystemExit):
        parse(["serve", "--shared-prefixes", "sometimes"])
    save_random_qwen3(tmp_path, "Qwen3ForCausalLM")
    for value, shares in (("on", True), ("off", False)):
        config = parse(["serve", "--model", str(tmp_path), "--shared-prefixes", value, "--device", "cpu"])
        assert Server(config).engine_config(128).shared_prefixes is shares


def test_api_workers_flag_default_and_environment_twin():
    assert parse(["serve"]).api_workers == 1
    assert parse(["serve", "--api-workers", "4"]).api_workers == 4
    assert parse(["serve"], {"POSY_API_WORKERS": "3"}).api_workers == 3
    with pytest.raises(SystemExit):
        parse(["serve", "--api-workers", "0"])


def test_api_workers_on_a_taken_port_fail_before_loading_anything():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "api", "serve", "--api-workers", "2", "--device", "cpu"]
        result = subprocess.run(
            [*command, "--port", str(port)], cwd=REPO, capture_output=True, text=True, timeout=60
        )
    assert result.returncode == 1
    assert "cannot listen" in result.stderr and "spawn_main" not in result.stderr


def test_embed_flags_share_the_engine_flags_and_environment_twins():
    from api.bulk.cli import job_config
    from api.cli import build_parsers

    parser, _, embed = build_parsers()
    apply_environment(embed, {"POSY_SHARD_ROWS": "1000", "POSY_DEVICE": "cpu"})
    args = parser.parse_args(
        [
            "embed",
            "in.parquet",
            "--output",
            "out",
            "--id-column",
            "doc",
            "--dimensions",
            "128",
            "--dtype",
            "float32",
        ]
    )
    config = job_config(args)
    assert (config.input, config.output, config.id_column, config.text_column) == (
        "in.parquet",
        "out",
        "doc",
        "text",
    )
    assert config.shard_rows == 1000 and config.engine.device == "cpu" and config.engine.dtype == "float32"
    assert config.dimensions == 128 and args.ray is None
    assert parser.parse_args(["embed", "in.csv", "--output", "o", "--ray"]).ray == "auto"
    assert parser.parse_args(["serve", "--ray", "10.0.0.1:6379"]).ray == "10.0.0.1:6379"


def test_the_bundled_model_is_named_beside_others(tmp_path, monkeypatch):
    parser, _ = build_parser()
    given = ["--model", "bundled", "--model", str(tmp_path), "--model", "all-MiniLM-L6-v2"]
    assert config_from_args(parser.parse_args(["serve", *given])).models == (None, str(tmp_path), None)
    (tmp_path / "all-MiniLM-L6-v2").mkdir()  # a folder of that name at hand is that folder
    monkeypatch.chdir(tmp_path)
    args = parser.parse_args(["serve", "--model", "all-MiniLM-L6-v2"])
    assert config_from_args(args).models == ("all-MiniLM-L6-v2",)
