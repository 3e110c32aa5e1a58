"""The gateway suite: the server as shipped with two engine replica processes (the bundled MiniLM on the
CPU by default), driven over HTTP by client processes: 64 clients below capacity, four times capacity
against a small queue, and a replica killed with SIGKILL under load. It records what the server held and
survived; compat_tests/test_replicas_load.py checks the same situations' vectors against a reference."""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

from benchmarks.load import run_clients
from benchmarks.records import RunContext, SuiteOutcome

MODEL = "all-MiniLM-L6-v2 (bundled), 2 replica processes"
NUM_CLIENTS = 64
TEXTS = [f"load text {index} about " + "rivers and mountains " * (index % 7) for index in range(256)]


def bodies(rng: random.Random, num_texts: tuple[int, int], count: int = 32) -> list[bytes]:
    return [
        json.dumps(
            {"input": rng.sample(TEXTS, rng.randint(*num_texts)), "encoding_format": "base64"}
        ).encode()
        for _ in range(count)
    ]


def children(pid: int) -> list[int]:
    output = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(line) for line in output.split()]


def replica_pids(pid: int) -> set[int]:
    """The server's replica processes (multiprocessing's resource tracker is a child too)."""
    found = set()
    for child in children(pid):
        try:
            if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.add(child)
        except FileNotFoundError:
            pass
    return found


def server_pid(url: str) -> int:
    port = url.rsplit(":", 1)[1]
    output = subprocess.run(["pgrep", "-f", "--", f"--port {port} "], capture_output=True, text=True).stdout
    return int(output.split()[0])


def rss_mib(pid: int) -> float:
    """RSS of the server and its children together."""
    return sum(process_rss_mib(pid).values())


def process_rss_mib(pid: int) -> dict[str, float]:
    """RSS of the server and each of its children, by pid (one that has just exited is left out)."""
    sizes = {}
    for process in [pid, *children(pid)]:
        try:
            status = Path(f"/proc/{process}/status").read_text()
        except FileNotFoundError:
            continue
        kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS"))
        sizes[str(process)] = kib / 1024
    return sizes


def count(errors: list[str], prefix: str) -> int:
    return sum(error.startswith(prefix) for error in errors)


def run(options: argparse.Namespace) -> SuiteOutcome:
    from benchmarks.live_server import serve

    smoke = getattr(options, "smoke", False)
    seconds = 2.0 if smoke else 60.0
    device = "cpu"  # the gateway's figures; the GPU suites measure the engine
    flags = ("--replicas", "2", "--device", device, "--max-batch-tokens", "2048")
    context = RunContext(suite=options.suite, model=MODEL, gpu=None, backend="torch")
    rng = random.Random(0)
    records, failures = [], []

    with serve(None, *flags) as url:
        # 1. 64 clients below capacity
        load = run_clients(
            url, [bodies(rng, (1, 4)) for _ in range(NUM_CLIENTS)], duration_s=seconds, warmup_s=1
        )
        case = "load-64-clients"
        records += [
            context.record(case, "requests_per_s", load.requests_per_s, "requests/s"),
            context.record(case, "latency_p50_ms", load.latency_ms(50), "ms"),
            context.record(case, "latency_p99_ms", load.latency_ms(99), "ms"),
            context.record(case, "errors", len(load.errors), "requests"),
        ]
        print(f"{case}: {load.num_requests} requests, {load.requests_per_s:.0f}/s, "
              f"p99 {load.latency_ms(99):.0f} ms, {len(load.errors)} errors")  # fmt: skip
        if load.errors:
            failures.append(f"{case}: {len(load.errors)} errors below capacity, e.g. {load.errors[0]}")

        # 2. SIGKILL of one replica a third into the window
        pid = server_pid(url)
        replicas = replica_pids(pid)
        restarted: list[float] = []
        watcher = threading.Thread(target=_kill_and_watch, args=(pid, replicas, seconds / 3, restarted))
        watcher.start()
        fault = run_clients(url, [bodies(rng, (1, 4)) for _ in range(32)], duration_s=seconds)
        watcher.join(120)
        if not restarted:
            raise RuntimeError("the killed replica was not restarted")
        restart_s = restarted[0]
        others = len(fault.errors) - count(fault.errors, "HTTP 503")
        case = "kill-a-replica"
        records += [
            context.record(case, "answered_200", fault.num_requests, "requests"),
            context.record(case, "answered_503", count(fault.errors, "HTTP 503"), "requests"),
            context.record(case, "other_errors", others, "requests"),
            context.record(case, "replica_restarted_after_s", restart_s, "s"),
        ]
        unavailable = count(fault.errors, "HTTP 503")
        print(f"{case}: {fault.num_requests} 200s, {unavailable} 503s, {others} other errors, "
              f"replica restarted after {restart_s:.1f} s")  # fmt: skip
        if others:
            failures.append(f"{case}: {others} errors other than 503, e.g. {fault.errors[0]}")

    with serve(None, *flags, "--max-queue-tokens", "4096") as url:
        # 3. four times capacity and more: 64 clients with about 1,500 tokens each in flight
        # memory over the timed window, after a first overload window in which the allocators grow to
        # the batch sizes (measured: the replicas grow about 130 MiB once, then stay flat)
        pid = server_pid(url)
        run_clients(url, [bodies(rng, (48, 80)) for _ in range(NUM_CLIENTS)], duration_s=seconds / 2)
        before = rss_mib(pid)
        overload = run_clients(url, [bodies(rng, (48, 80)) for _ in range(NUM_CLIENTS)], duration_s=seconds)
        growth = rss_mib(pid) - before
        refused = count(overload.errors, "HTTP 429")
        others = len(overload.errors) - refused
        case = "overload"
        records += [
            context.record(case, "answered_200", overload.num_requests, "requests"),
            context.record(case, "answered_429", refused, "requests"),
            context.record(case, "other_errors", others, "requests"),
            context.record(case, "admitted_latency_p99_ms", overload.latency_ms(99), "ms"),
            context.record(case, "memory_growth_mib", growth, "MiB"),
        ]
        print(f"{case}: {overload.num_requests} 200s, {refused} 429s, {others} other errors, "
              f"admitted p99 {overload.latency_ms(99):.0f} ms, memory {growth:+.0f} MiB")  # fmt: skip
        if others or not refused:
            failures.append(f"{case}: {others} errors other than 429, {refused} 429s")
    return SuiteOutcome(records, failures)


def _kill_and_watch(pid: int, replicas: set[int], delay_s: float, restarted: list[float]) -> None:
    """After `delay_s`, SIGKILL one replica, then note how long until its replacement process runs."""
    time.sleep(delay_s)
    victim = min(replicas)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    while time.monotonic() < killed_at + 120:
        if replica_pids(pid) - replicas:
            restarted.append(time.monotonic() - killed_at)
            return
        time.sleep(0.05)
