"""posy on Ray, against a local Ray cluster the test starts (4 logical CPUs, a 300 MB object store, loopback
only): `posy embed --ray` through Ray Data gives /v1/embeddings' vectors for a corpus of two batches, and
`posy serve --ray` runs 2 Serve replicas that the openai and cohere SDKs drive like a plain `posy serve`."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import time

import cohere
import httpx
import numpy as np
import openai
import pyarrow.parquet as pq
import pytest

from api.bulk.ray_job import BATCH_ROWS
from tests.sts import sts_test_split

from .conftest import REPO_ROOT, free_port, server_env
from .contract import MODEL, SAME_VECTOR, cohere_client, cosine
from .corpus import assert_rows_match, http_vectors, posy_embed, write_corpus

pytest.importorskip("ray")
pytestmark = pytest.mark.busy  # its Ray cluster works between its tests: never beside a serial test


@pytest.fixture(scope="module", autouse=True)
def sts_present():
    sts_test_split()  # the corpus: fails, never skips, where a clone lacks it


START_TIMEOUT_S = 240
# two map_batches calls on the one worker, the second short: a Ray worker's engine runs on one thread
NUM_ROWS = BATCH_ROWS + 256
TEXTS = ["A man is playing a guitar.", "Someone plays an instrument.", "The stock market fell today."]
QUERY = "Where do emperor penguins raise their chicks?"
DOCS = [
    "The recipe calls for two cups of flour.",
    "Emperor penguins raise their chicks on the Antarctic sea ice.",
    "Stock prices rose sharply after the earnings report.",
]


def ray_env() -> dict[str, str]:
    # the test's cluster is loopback-only and without auth: a token a developer's earlier Ray session
    # left in ~/.ray would otherwise turn token auth on for some of its processes and not others
    return {**server_env(), "RAY_AUTH_MODE": "disabled"}


def ray_command(*args: str) -> list[str]:
    return [shutil.which("ray") or str(REPO_ROOT / "missing-ray"), *args]


@pytest.fixture(scope="module")
def ray_address(tmp_path_factory):
    port = free_port()
    start = ray_command(
        "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1", "--num-cpus=4",
        "--object-store-memory=300000000", "--include-dashboard=false", "--disable-usage-stats",
        f"--temp-dir={tmp_path_factory.mktemp('ray')}",
    )  # fmt: skip
    subprocess.run(start, check=True, env=ray_env(), capture_output=True, timeout=START_TIMEOUT_S)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run(ray_command("stop", "--force"), env=ray_env(), capture_output=True, timeout=120)


def test_a_ray_data_job_equals_the_http_api(ray_address, tmp_path, embed):
    corpus = write_corpus(tmp_path, NUM_ROWS)
    output = tmp_path / "vectors"
    posy_embed(
        str(corpus.path), "--output", str(output), "--id-column", "id", "--ray", ray_address, env=ray_env()
    )
    assert_rows_match(pq.read_table(output), corpus, http_vectors(embed, corpus.texts))


def test_a_ray_data_job_without_ids_is_refused(ray_address, tmp_path):
    (tmp_path / "in.jsonl").write_text('{"text": "a"}\n')
    done = posy_embed(
        str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "o"), "--ray", ray_address, check=False
    )
    assert done.returncode == 2 and "--ray needs --id-column" in done.stderr


@pytest.fixture(scope="module")
def serve_url(ray_address, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    command = [
        sys.executable,
        "-m",
        "api",
        "serve",
        "--ray",
        ray_address,
        "--port",
        str(port),
        "--ray-min-replicas",
        "2",
    ]
    with open(log, "w") as sink:
        server = subprocess.Popen(
            command, cwd=REPO_ROOT, env=ray_env(), stdout=sink, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and server.poll() is None:
            try:
                if httpx.get(f"{url}/ready", timeout=5, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"posy serve --ray did not get ready: {log.read_text()[-4000:]}")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=120)


def serve_replicas(ray_address: str) -> dict[str, int]:
    """The posy deployment's replicas by state (RUNNING, STARTING, ...), as Serve reports them."""
    script = (
        f"import ray; from ray import serve; ray.init(address={ray_address!r}, logging_level='ERROR'); "
        "status = serve.status().applications['posy'].deployments['posy']; "
        "states = status.replica_states.items(); "
        "print({str(getattr(state, 'value', state)): count for state, count in states})"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=ray_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return ast.literal_eval(done.stdout.strip().splitlines()[-1])


def test_serve_on_ray_runs_two_replicas_that_the_sdks_drive_like_a_plain_server(
    serve_url, ray_address, embed, http
):
    # the app answers once a replica is up; the second may still be starting (on a loaded 2-core machine,
    # seconds later): both must be running within the start-up timeout
    deadline = time.monotonic() + START_TIMEOUT_S
    while (states := serve_replicas(ray_address)).get("RUNNING", 0) != 2 and time.monotonic() < deadline:
        time.sleep(2)
    assert states.get("RUNNING", 0) == 2, states
    with openai.OpenAI(base_url=f"{serve_url}/v1", api_key="x", max_retries=0, timeout=120) as client:
        for _ in range(4):  # several requests: Serve's proxy spreads them over both replicas
            response = client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
            vectors = np.array([item.embedding for item in response.data], dtype=np.float32)
            for got, want in zip(vectors, embed(TEXTS)):
                assert cosine(got, want) >= SAME_VECTOR
        with pytest.raises(openai.BadRequestError):  # the same validation, in OpenAI's error shape
            client.embeddings.create(model=MODEL, input="")
    plain = http.post("/v2/rerank", json={"model": MODEL, "query": QUERY, "documents": DOCS}).json()[
        "results"
    ]
    with cohere_client(cohere.ClientV2, serve_url, timeout=120.0) as co:
        ranked = co.rerank(model=MODEL, query=QUERY, documents=DOCS).results
    assert [result.index for result in ranked] == [result["index"] for result in plain]
    for result, want in zip(ranked, plain):
        assert result.relevance_score == pytest.approx(want["relevance_score"], abs=1e-5)


def test_a_serve_config_files_app_builder_takes_posy_flags_and_autoscaling_bounds():
    from api.ray_serve import app_builder

    args = {
        "flags": "--max-batch-tokens 8192 --auto-truncate",
        "min_replicas": 1,
        "max_replicas": 3,
        "gpus": True,
    }
    deployment = app_builder(args)._bound_deployment
    autoscaling = deployment._deployment_config.autoscaling_config
    assert (deployment.name, autoscaling.min_replicas, autoscaling.max_replicas) == ("posy", 1, 3)
    (config,) = deployment.init_args
    assert config.engine.max_batch_tokens == 8192 and config.auto_truncate
    # one engine per replica
    assert (config.replicas, config.api_workers, config.engine.device) == (1, 1, "cuda")
    assert deployment.ray_actor_options["num_gpus"] == 1
    with pytest.raises(ValueError, match="min replicas"):
        app_builder({"min_replicas": 3, "max_replicas": 2, "gpus": False})
