"""`posy embed` on this machine, as a user runs it: 2,000 rows embedded through the in-process engine
equal /v1/embeddings' vectors, in input order; a job killed with SIGKILL midway resumes from its finished
shards to the same output as an uninterrupted run; other formats, Matryoshka dimensions, bad input, and
input and output on object storage (a loopback S3 server, moto's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from api.bulk.output import MANIFEST, read_output
from tests.sts import sts_test_split

from .conftest import REPO_ROOT, server_env
from .contract import MODEL
from .corpus import JOB_TIMEOUT_S, assert_rows_match, http_vectors, posy_embed, write_corpus


@pytest.fixture(scope="module", autouse=True)
def sts_present():
    sts_test_split()  # the corpus: fails, never skips, where a clone lacks it


SHARD_ROWS = 200  # 10 shards of the corpus's 2,000 rows


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def expected(corpus, embed):
    return http_vectors(embed, corpus.texts)


@pytest.fixture(scope="module")
def local_output(corpus, tmp_path_factory):
    output = tmp_path_factory.mktemp("local") / "vectors"
    posy_embed(
        str(corpus.path), "--output", str(output), "--id-column", "id", "--shard-rows", f"{SHARD_ROWS}"
    )
    return output


def test_a_local_job_equals_the_http_api_in_input_order(local_output, corpus, expected):
    table = read_output(str(local_output))
    assert table.column("id").to_pylist() == corpus.ids  # the shards in order are the input's order
    assert_rows_match(table, corpus, expected)
    manifest = json.loads((local_output / MANIFEST).read_text())
    assert manifest["complete"] and len(manifest["shards"]) == 10


def finished_shards(output) -> int:
    try:
        return len(json.loads((output / MANIFEST).read_text())["shards"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def processes_in_group(group: int) -> list[int]:
    """Live processes of a process group (a job started in its own session, and its workers)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if fields[0] != "Z" and int(fields[2]) == group:
            members.append(int(stat.parent.name))
    return members


def wait_for_no_process_in(group: int, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (members := processes_in_group(group)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return members


def test_a_job_killed_midway_resumes_to_the_uninterrupted_output(corpus, local_output, tmp_path):
    output = tmp_path / "vectors"
    args = [str(corpus.path), "--output", str(output), "--id-column", "id", "--shard-rows", str(SHARD_ROWS)]
    # tokenized in worker processes, as beside a GPU: none of them may outlive the job
    job = subprocess.Popen(
        [sys.executable, "-m", "api", "embed", *args, "--tokenizer-processes", "2"], cwd=REPO_ROOT,
        env=server_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while finished_shards(output) < 3 and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_in_group(job.pid)) >= 3, "the job and its 2 tokenizer processes"
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    killed_at = finished_shards(output)
    assert 3 <= killed_at < 10, killed_at
    assert not json.loads((output / MANIFEST).read_text())["complete"]
    assert wait_for_no_process_in(job.pid) == []

    # resumed with the tokenizer in a thread: the killed run's shards equal its own
    rerun = posy_embed(*args)
    assert f"taking up {killed_at} finished shards" in rerun.stderr
    resumed, uninterrupted = read_output(str(output)), read_output(str(local_output))
    assert resumed.column("id").to_pylist() == uninterrupted.column("id").to_pylist()  # none lost, none twice
    vectors = np.array(resumed.column("embedding").to_pylist(), dtype=np.float32)
    reference = np.array(uninterrupted.column("embedding").to_pylist(), dtype=np.float32)
    assert np.allclose(vectors, reference, atol=1e-6)
    # a third run finds the job done and leaves the output as it is
    assert "nothing to do" in posy_embed(*args).stderr


def test_ctrl_c_stops_a_job_with_status_130_and_keeps_its_shards(corpus, tmp_path):
    output = tmp_path / "vectors"
    args = [str(corpus.path), "--output", str(output), "--id-column", "id", "--shard-rows", str(SHARD_ROWS)]
    # as from a terminal: a test run from a background shell (CI) would pass on SIGINT ignored
    job = subprocess.Popen(
        [sys.executable, "-m", "api", "embed", *args, "--tokenizer-processes", "2"], cwd=REPO_ROOT,
        env=server_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while finished_shards(output) < 1 and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(job.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's whole group: the workers too
    _, stderr = job.communicate(timeout=120)
    assert job.returncode == 130, stderr[-2000:]
    assert "interrupted: the finished shards are kept" in stderr and "Traceback" not in stderr
    assert 1 <= finished_shards(output) < 10
    assert wait_for_no_process_in(job.pid) == []


def test_csv_input_with_matryoshka_dimensions_equals_the_http_api(tmp_path, embed):
    texts = ["A man is playing a guitar.", "A woman slices an onion, quickly.", 'She said "hi" twice.']
    quoted = ['"' + text.replace('"', '""') + '"' for text in texts]  # CSV's quoting
    (tmp_path / "in.csv").write_text("text\n" + "".join(line + "\n" for line in quoted))
    posy_embed(str(tmp_path / "in.csv"), "--output", str(tmp_path / "out"), "--dimensions", "128")
    table = read_output(str(tmp_path / "out"))
    assert table.column("id").to_pylist() == [0, 1, 2]  # row numbers without --id-column
    vectors = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    assert vectors.shape == (3, 128)
    assert np.allclose(vectors, embed(texts, MODEL, dimensions=128), atol=1e-5)


def test_bad_input_or_a_rerank_model_fails_with_a_clear_message_and_status_2(tmp_path, corpus):
    (tmp_path / "in.jsonl").write_text('{"body": "no text here"}\n')
    done = posy_embed(str(tmp_path / "in.jsonl"), "--output", str(tmp_path / "out"), check=False)
    assert done.returncode == 2 and "row 0 has no 'text'" in done.stderr
    done = posy_embed(str(corpus.path), "--output", str(tmp_path / "o2"), "--dimensions", "999", check=False)
    assert done.returncode == 2 and "--dimensions must be between 1 and the model's 384" in done.stderr


@pytest.fixture
def s3():
    """(endpoint "host:port", credentials) of a loopback S3 server holding an empty bucket "corpus"."""
    moto_server = pytest.importorskip("moto.server")
    import boto3

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    credentials = {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    session = boto3.session.Session(
        aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
    )
    session.client("s3", endpoint_url=f"http://{host}:{port}").create_bucket(Bucket="corpus")
    try:
        yield f"{host}:{port}", credentials
    finally:
        server.stop()


def test_a_job_reads_and_writes_object_storage(s3, tmp_path, embed, monkeypatch):
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from api.bulk.source import filesystem

    endpoint, credentials = s3
    for name, value in credentials.items():
        monkeypatch.setenv(name, value)
    options = f"?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    texts = [f"sentence {i} about {'penguins' if i % 2 else 'trains'}" for i in range(300)]
    fs, path = filesystem(f"s3://corpus/in.parquet{options}")
    pq.write_table(pa.table({"text": texts}), path, filesystem=fs)
    output = f"s3://corpus/vectors{options}"
    posy_embed(f"s3://corpus/in.parquet{options}", "--output", output, "--shard-rows", "128", env=credentials)
    table = read_output(output)
    assert table.column("id").to_pylist() == list(range(300))
    vectors = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    assert np.allclose(vectors, embed(texts), atol=1e-5)
    listed = sorted(info.base_name for info in fs.get_file_info(pafs.FileSelector("corpus/vectors")))
    assert listed == [MANIFEST, "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
