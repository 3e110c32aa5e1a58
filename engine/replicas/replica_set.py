"""ReplicaSet: starts one engine replica process per slot (spread over the GPUs, or sharing the CPU cores),
waits until each is warm, restarts any that dies, and stops them all. Its ReplicaPool is what the gateway
runs requests through; gateways in other processes (`--api-workers`) reach the same replicas through
ReplicaHandles, and learn of deaths and restarts from each replica's liveness in shared memory."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.checkpoint.source import ModelSource
from engine.config import EngineConfig
from engine.errors import EngineError
from engine.replicas.pool import ReplicaPool
from engine.replicas.protocol import Capabilities, Refused, read_start, start_file
from engine.replicas.replica import ReplicaConfig, replica_main
from engine.replicas.shm_ring import memory_folder

logger = logging.getLogger(__name__)
READY_TIMEOUT_S = 600.0  # loading and warming a large model on a fresh machine compiles kernels
WATCH_INTERVAL_S = 0.1
STOP_TIMEOUT_S = 30.0
LIVENESS_POLL_S = 0.25  # deaths also show at once as a closed connection; this is for returns


def replica_count(replicas: int | None, device: str) -> int:
    """--replicas, or by default one per visible GPU (one on the CPU or on a named GPU)."""
    if replicas is not None:
        if replicas < 1:
            raise ValueError(f"--replicas must be at least 1, not {replicas}")
        return replicas
    if device.startswith("cuda") and ":" not in device:
        import torch

        return max(1, torch.cuda.device_count())
    return 1


class ReplicaStartError(EngineError):
    """A replica process exited or stayed cold instead of getting ready."""


class ReplicaSet:
    def __init__(
        self,
        source: ModelSource,
        num_replicas: int,
        engine_config: EngineConfig,
        log_level: str = "info",
        metrics_model: str | None = None,
        batch_observer: Callable[[str], Callable[[int, int], None] | None] | None = None,
    ):
        """`batch_observer(metrics_model)`, called in each replica process (a module-level function, so
        that it reaches the spawned process), gives the engine's on_batch callback, or None."""
        if num_replicas < 1:
            raise ValueError("a replica set needs at least one replica")
        self._context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked CUDA state
        # sockets and shared-memory rings, in memory where the system has a folder for it
        self._folder = str(memory_folder("posy-"))
        self.configs = [
            ReplicaConfig(
                source=source,
                engine=dataclasses.replace(engine_config, device=_device(engine_config.device, index)),
                endpoint=f"{self._folder}/replica-{index}.sock",
                log_level=log_level,
                num_threads=_threads(engine_config.device, num_replicas),
                metrics_model=metrics_model,
                batch_observer=batch_observer,
            )
            for index in range(num_replicas)
        ]
        self.pool = ReplicaPool(
            [config.endpoint for config in self.configs],
            chunk_tokens=engine_config.max_batch_tokens,
            max_sequence_tokens=engine_config.max_batch_tokens,
        )
        self.processes: list = [None] * num_replicas
        self.num_restarts = [0] * num_replicas
        # per replica: alive (0 or 1), then its generation (restarts so far); read by other processes
        self.liveness = self._context.Array("q", 2 * num_replicas)
        for index in range(num_replicas):
            self.liveness[2 * index] = 1
        self._stopping = threading.Event()
        self._started: list = []  # each spawned replica's ready event
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        """Start every replica, in parallel, and return once all are warm (or raise)."""
        self.spawn()
        self.wait_ready()

    def spawn(self) -> None:
        """Start every replica's process; wait_ready() then waits for them (other sets may spawn between)."""
        self._started = [self._spawn(index) for index in range(len(self.configs))]

    def wait_ready(self) -> None:
        """Return once every spawned replica is warm (or raise), and watch them from then on."""
        for index, ready in enumerate(self._started):
            self._wait_ready(index, ready)
        started = read_start(self.configs[0].endpoint)
        assert isinstance(started, Capabilities)  # written before the replica said it was ready
        self.pool.capabilities = started
        self._watcher = threading.Thread(target=self._watch, name="posy-replicas", daemon=True)
        self._watcher.start()

    def handles(self) -> ReplicaHandles:
        """What a gateway in another process needs to run requests on these (started) replicas."""
        return ReplicaHandles(
            endpoints=tuple(config.endpoint for config in self.configs),
            capabilities=self.pool.capabilities,
            chunk_tokens=self.pool.chunk_tokens,
            max_sequence_tokens=self.pool.max_sequence_tokens,
            liveness=self.liveness,
        )

    def stop(self) -> None:
        self._stopping.set()
        self.pool.stop()
        for process in self.processes:
            if process is not None and process.is_alive():
                process.terminate()  # SIGTERM: the replica stops its engine and exits
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for process in self.processes:
            if process is not None:
                process.join(max(0.0, deadline - time.monotonic()))
                if process.is_alive():
                    process.kill()
                    process.join()
        shutil.rmtree(self._folder, ignore_errors=True)

    def _spawn(self, index: int):
        ready = self._context.Event()
        start_file(self.configs[index].endpoint).unlink(missing_ok=True)  # a restart's, not the last one's
        process = self._context.Process(
            target=replica_main,
            args=(self.configs[index], ready),
            name=f"posy-replica-{index}",
            daemon=True,
        )
        process.start()
        self.processes[index] = process
        return ready

    def _wait_ready(self, index: int, ready) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        process = self.processes[index]
        while not ready.wait(0.1):
            if not process.is_alive() or time.monotonic() > deadline:
                device = self.configs[index].engine.device
                started = None if process.is_alive() else read_start(self.configs[index].endpoint)
                if isinstance(started, Refused):
                    raise ReplicaStartError(f"engine replica {index} ({device}) refused: {started.reason}")
                state = f"exited with code {process.exitcode}" if not process.is_alive() else "stayed cold"
                raise ReplicaStartError(
                    f"engine replica {index} ({device}) {state} while starting; see its log"
                )

    def _watch(self) -> None:
        """Every WATCH_INTERVAL_S: a replica that died is told to the pool at once and started again; one
        that is starting is told back once warm. Nothing here waits on a start, so a second death during a
        restart is seen as soon as the first (readiness sees both replicas gone)."""
        starting: dict[int, tuple[Any, float]] = {}  # index -> (its ready event, its deadline)
        while not self._stopping.wait(WATCH_INTERVAL_S):
            for index, process in enumerate(self.processes):
                if self._stopping.is_set():
                    return
                if index not in starting:
                    if process.is_alive():
                        continue
                    self._died(index)
                elif starting[index][0].is_set():
                    del starting[index]
                    self._back(index)
                    continue
                elif process.is_alive() and time.monotonic() < starting[index][1]:
                    continue
                else:
                    logger.error("engine replica %d did not come back (exit code %s); trying again",
                                 index, process.exitcode)  # fmt: skip
                    process.kill()
                starting[index] = (self._spawn(index), time.monotonic() + READY_TIMEOUT_S)

    def _died(self, index: int) -> None:
        logger.error(
            "engine replica %d exited with code %s: restarting it", index, self.processes[index].exitcode
        )
        self.pool.replica_died(index)
        self.num_restarts[index] += 1
        self.liveness[2 * index], self.liveness[2 * index + 1] = 0, self.num_restarts[index]

    def _back(self, index: int) -> None:
        self.pool.replica_back(index)
        self.liveness[2 * index] = 1
        logger.info("engine replica %d is back", index)


@dataclass(frozen=True, slots=True)
class ReplicaHandles:
    """A started ReplicaSet as a gateway in another process sees it (picklable into a spawned process)."""

    endpoints: tuple[str, ...]
    capabilities: Capabilities
    chunk_tokens: int
    max_sequence_tokens: int
    liveness: Any  # the ReplicaSet's shared array: per replica, alive and generation

    def pool(self) -> ReplicaPool:
        pool = ReplicaPool(self.endpoints, self.chunk_tokens, self.max_sequence_tokens)
        pool.capabilities = self.capabilities
        return pool

    def follow(self, pool: ReplicaPool, stop: threading.Event) -> None:
        """Until `stop`: tell `pool` of every death and return of a replica (a thread's loop). A replica
        that died and came back between two looks still counts as died: its chunks were lost."""
        seen = [(1, 0)] * len(self.endpoints)  # as the pool starts: all alive, none restarted
        values = self.liveness.get_obj()  # read without the array's lock: one writer, whole words
        while not stop.wait(LIVENESS_POLL_S):
            for index, (was_alive, generation) in enumerate(seen):
                now = (values[2 * index], values[2 * index + 1])
                if now == (was_alive, generation):
                    continue
                if not now[0] or now[1] != generation:
                    pool.replica_died(index)
                if now[0]:
                    pool.replica_back(index)
                seen[index] = now


def _device(device: str, index: int) -> str:
    """Replica `index`'s device: the GPUs in turn (two replicas may share one), or the CPU."""
    if not device.startswith("cuda"):
        return device
    import torch

    if ":" in device:
        return device
    return f"cuda:{index % max(1, torch.cuda.device_count())}"


def _threads(device: str, num_replicas: int) -> int | None:
    """CPU replicas share the cores instead of each taking them all; GPU replicas need few."""
    if device.startswith("cuda"):
        return None
    return max(1, (os.cpu_count() or 1) // num_replicas)
