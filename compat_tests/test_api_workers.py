"""`--api-workers 2` on the CPU, over two engine replica processes, over HTTP: concurrent clients get only
correct vectors and both gateway processes serve them; /metrics, whichever gateway answers, counts every
request and the replicas' batches; a killed gateway is started again; a replica killed under load is
failed over by both gateways (every response correct or a 503, none hangs) and comes back."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from benchmarks.gateway import children, replica_pids
from compat_tests.test_replicas_load import LOAD_SECONDS, check_correct, kill_under_load, run_clients

FLAGS = ("--api-workers", "2", "--replicas", "2", "--device", "cpu", "--max-batch-tokens", "2048")
RESTART_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def gateways(server_factory):
    return server_factory(*FLAGS)


@pytest.fixture(scope="module")
def reference(embed) -> np.ndarray:
    from compat_tests.test_replicas_load import TEXTS

    return embed(TEXTS)


def listening_sockets(port: int) -> set[str]:
    """The inodes of the sockets listening on the loopback TCP `port`, as /proc/PID/fd links name them."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[1].endswith(f":{port:04X}") and fields[3] == "0A":
            found.add(f"socket:[{fields[9]}]")
    return found


def gateway_pids(server) -> list[int]:
    """The server's children listening on its port: its gateways (replicas do not)."""
    sockets = listening_sockets(int(server.url.rsplit(":", 1)[1]))
    found = []
    for pid in children(server.process.pid):
        try:
            links = {os.readlink(entry) for entry in Path(f"/proc/{pid}/fd").iterdir()}
        except (FileNotFoundError, PermissionError):
            continue
        if links & sockets:
            found.append(pid)
    return sorted(found)


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match and all(f'{key}="{value}"' in (match.group(1) or "") for key, value in labels.items()):
            total += float(match.group(2))
    return total


def test_both_gateways_serve_correct_vectors_and_metrics_count_the_whole_server(gateways, reference):
    pids = gateway_pids(gateways)
    assert len(pids) == 2, pids
    before_ticks = [cpu_ticks(pid) for pid in pids]
    before = httpx.get(f"{gateways.url}/metrics", timeout=10).text
    outcomes = run_clients(gateways.url, 32, LOAD_SECONDS / 2)
    assert {status for status, *_ in outcomes} == {200}
    check_correct(outcomes, reference)
    used = [cpu_ticks(pid) - ticks for pid, ticks in zip(pids, before_ticks)]
    assert min(used) > 0.2 * max(used), used  # the kernel handed connections to both gateways
    after = httpx.get(f"{gateways.url}/metrics", timeout=10).text
    route = {"route": "/v1/embeddings", "status": "200"}
    served = metric(after, "posy_requests_total", **route) - metric(before, "posy_requests_total", **route)
    assert served == len(outcomes)  # counted by both gateways, summed by the one that answered
    texts_sent = sum(len(picked) for _, picked, *_ in outcomes)
    batched = metric(after, "posy_batch_sequences_sum") - metric(before, "posy_batch_sequences_sum")
    assert batched == texts_sent  # the replicas' batches, counted in the replica processes
    assert 'replicas="2"' in after


def test_a_killed_gateway_is_started_again(gateways):
    victim = gateway_pids(gateways)[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while True:
        pids = gateway_pids(gateways)
        if len(pids) == 2 and victim not in pids:
            break
        assert time.monotonic() < deadline, f"the killed gateway was not started again: {pids}"
        time.sleep(0.5)
    outcomes = run_clients(gateways.url, 8, 2.0)
    assert outcomes and {status for status, *_ in outcomes} == {200}


def test_a_replica_killed_under_load_is_failed_over_by_every_gateway(gateways, reference):
    # spawned children that do not hold the listening socket
    replicas = replica_pids(gateways.process.pid) - set(gateway_pids(gateways))
    assert len(replicas) == 2, replicas
    victim = min(replicas)

    outcomes = kill_under_load(gateways.url, victim)
    assert {status for status, *_ in outcomes} <= {200, 503}
    check_correct(outcomes, reference)
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while not (outcomes := run_clients(gateways.url, 8, 1.0)) or {s for s, *_ in outcomes} != {200}:
        assert time.monotonic() < deadline, "the killed replica did not come back"
