"""The server's process layout, chosen from the host unless flags say: how many gateway processes serve
HTTP, and whether the engine runs inside the one gateway or in processes of its own.

The rule, on a GPU host (the CPU default stays one process: a laptop's cores are the model's):
- count the cores this process may use: its CPU affinity, capped by its cgroup's CPU quota;
- under MIN_CORES_FOR_GATEWAYS, one process: the gateway and the engine share it;
- otherwise the engine runs in its own process (one per GPU), with CORES_PER_ENGINE cores left to it,
  and every CORES_PER_GATEWAY of the rest runs a gateway, at most MAX_GATEWAYS. A gateway is a Python
  process of about 250 MiB (it imports the model's config and tokenizer code), so 7 on 16 cores take
  under 2 GiB.
JSON, tokenization and HTTP then use several cores, and the engine's thread never waits for the GIL of a
gateway busy with them. A gateway splits a large request's tokenization over its share of the cores, and
at least a quarter of them (at most MAX_TOKENIZER_THREADS): four clients sending 100 texts each keep four
gateways tokenizing at once, and on the H200's host 100 texts of 50 words take 5.0 ms on one thread, 2.8
on two and 1.7 on four."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

MIN_CORES_FOR_GATEWAYS = 6
CORES_PER_ENGINE = 2  # its batching thread, the thread that reads the gateways, torch's own
CORES_PER_GATEWAY = 2  # its event loop, and room for the tokenizer and the clients beside it
MAX_GATEWAYS = 8
MAX_TOKENIZER_THREADS = 8  # past this, handing out the parts costs more than the parts save
# an image model's gateways decode a request's images on as many threads as the host's cores, each: an
# image takes milliseconds (a 640x480 PNG about 7 ms to decode and resize), and Pillow holds no GIL meanwhile;
# the gateways take turns at the cores (api/decode_turns.py)
MAX_IMAGE_THREADS = 32
CGROUP = Path("/sys/fs/cgroup")
# set for the server's processes before torch loads OpenMP (where the environment does not say): torch's
# CPU threads sleep when they wait instead of spinning. Spinning, they held the cores a batch's other thread
# and the HTTP server needed: under a flood of clients a 4,096-token batch of the bundled model took 4 to
# 6 s instead of 0.66 (2 cores), and admitted requests were answered past --request-timeout; sleeping,
# it takes as long as before when alone
OMP_WAIT_POLICY = ("OMP_WAIT_POLICY", "PASSIVE")


@dataclass(frozen=True, slots=True)
class Layout:
    api_workers: int
    engine_process: bool  # the engines run in replica processes rather than in the gateway
    reason: str  # for the start-up summary


def tokenizer_threads(cores: float, api_workers: int) -> int:
    """The threads each gateway splits a large request's tokenization over."""
    return max(1, min(MAX_TOKENIZER_THREADS, max(int(cores // api_workers), int(cores // 4))))


def image_threads(cores: float) -> int:
    """The threads each gateway of an image model decodes a request's images on."""
    return max(1, min(MAX_IMAGE_THREADS, int(cores)))


def usable_cores(cgroup: Path = CGROUP) -> float:
    """The cores this process may run on: its affinity, capped by a cgroup CPU quota (v2 or v1)."""
    try:
        cores: float = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    quota = _cgroup_quota(cgroup)
    return min(cores, quota) if quota is not None else cores


def _cgroup_quota(cgroup: Path) -> float | None:
    try:  # v2: "max 100000" or "200000 100000"
        limit, period = (cgroup / "cpu.max").read_text().split()[:2]
        return None if limit == "max" else int(limit) / int(period)
    except (OSError, ValueError):
        pass
    try:  # v1
        quota = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None


def choose_layout(
    device: str,
    cores: float,
    num_engines: int,
    api_workers: int | None = None,
    engine_process: bool | None = None,
) -> Layout:
    """The layout for `cores` usable cores and `num_engines` engine replicas; flags given win."""
    cores_text = f"{cores:g} usable cores"
    if api_workers is not None or engine_process is not None or not device.startswith("cuda"):
        workers = api_workers or 1
        # several gateways share replica processes; several replicas are processes of their own
        out = engine_process if engine_process is not None else (workers > 1 or num_engines > 1)
        reason = "as the flags say" if api_workers is not None or engine_process is not None else "on the CPU"
        return Layout(workers, out or workers > 1, reason)
    if cores < MIN_CORES_FOR_GATEWAYS:
        return Layout(1, num_engines > 1, f"{cores_text}: one gateway beside the engine")
    spare = cores - CORES_PER_ENGINE * num_engines
    workers = max(1, min(MAX_GATEWAYS, math.floor(spare / CORES_PER_GATEWAY)))
    return Layout(workers, True, f"{cores_text}: {workers} gateways, the engine in its own process")
