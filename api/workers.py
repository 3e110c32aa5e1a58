"""`--api-workers N`: N gateway processes serving one port. The supervisor (the `posy serve` process)
starts every model's engine replicas once and spawns the gateways; each binds its own listening socket
to the port with SO_REUSEPORT, so that the kernel spreads new connections evenly over them (one shared
socket lets whichever gateway wakes first accept a whole burst). Each gateway runs the whole app over
ReplicaPools connected to the same replicas, so queue limits and balancing live in the replicas, not
per gateway, and /metrics sums all processes (see api/metrics.py). A gateway that dies is started
again. SIGTERM is passed on to the gateways, which drain (api/drain.py); once they are gone the replicas
stop and the supervisor exits 0."""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import threading
import time
from collections.abc import Sequence

from api.config import ServerConfig
from api.decode_turns import DecodeTurns
from api.summary import startup_summary
from engine.replicas.replica_set import ReplicaHandles

logger = logging.getLogger(__name__)
WATCH_INTERVAL_S = 0.2
STOP_MARGIN_S = 10.0  # beyond the drain grace and the shutdown timeout, before a gateway is killed
PARENT_CHECK_S = 1.0
BACKLOG = 2048  # uvicorn's default


class GatewaySupervisor:
    def __init__(self, config: ServerConfig):
        self.config = config
        self._context = multiprocessing.get_context("spawn")  # no forked CUDA or event-loop state
        self._gateways: list = []
        self._handles: list[ReplicaHandles] = []
        self._turns: DecodeTurns | None = None
        self._stopping = threading.Event()
        self.num_restarts = 0

    def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the exit code."""
        from api.server import Server

        try:
            bind(self.config.host, self.config.port).close()  # a taken port fails now, not after loading
        except OSError as error:
            logger.error("cannot listen on %s:%d: %s", self.config.host, self.config.port, error)
            return 1
        server = Server(self.config)  # here only to resolve the models and start their replicas
        specs = server.resolve()
        engine_config = server.engine_config(max(spec.max_seq_length for spec in specs))
        num_replicas = server.num_replicas(engine_config.device)
        try:
            replica_sets = server.start_replicas()
            self._handles = [replica_set.handles() for replica_set in replica_sets]
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, self._on_signal)
            if any(spec.images is not None for spec in specs):  # the gateways decode images on the same cores
                self._turns = DecodeTurns(self._context, self.config.image_threads, self.config.api_workers)
            self._gateways = [self._spawn(index) for index in range(self.config.api_workers)]
            described = [
                (server.names(index, spec), spec, handles.capabilities.description)
                for index, (spec, handles) in enumerate(zip(specs, self._handles))
            ]
            logger.info("%s", startup_summary(self.config, engine_config, described, num_replicas))
            self._watch()
        finally:
            self._stop_gateways()
            server.stop()
        return 0

    def _spawn(self, index: int):
        process = self._context.Process(
            target=gateway_main,
            args=(self.config, self._handles, index, self._turns),
            name=f"posy-gateway-{index}",
        )
        process.start()
        return process

    def _watch(self) -> None:
        while not self._stopping.wait(WATCH_INTERVAL_S):
            for index, process in enumerate(self._gateways):
                if process.is_alive() or self._stopping.is_set():
                    continue
                logger.error("gateway %d exited with code %s: starting it again", index, process.exitcode)
                self.num_restarts += 1
                if self._turns is not None:
                    self._turns.reclaim(index)  # its images' tickets, left unfinished
                self._gateways[index] = self._spawn(index)

    def _on_signal(self, signum: int, _frame) -> None:
        # the gateways drain (or, on a second signal or Ctrl-C, stop at once); this process then stops
        for process in self._gateways:
            if process.is_alive():
                os.kill(process.pid, signum)
        self._stopping.set()

    def _stop_gateways(self) -> None:
        """Wait (bounded) for the gateways to drain and exit."""
        deadline = time.monotonic() + self.config.drain_grace + self.config.shutdown_timeout + STOP_MARGIN_S
        for process in self._gateways:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                logger.error("gateway %s did not stop in time: killing it", process.name)
                process.kill()
                process.join()


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to the port the gateways share (SO_REUSEPORT), not yet listening."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind((host, port))
    return listener


def gateway_main(
    config: ServerConfig, handles: Sequence[ReplicaHandles], index: int, turns: DecodeTurns | None = None
) -> None:
    """A spawned gateway's entry: the app over the given replicas, on its own socket of the shared port,
    its image decoding taking turns at the cores with the other gateways'."""
    from api.app import create_app
    from api.drain import run_server
    from api.server import Server

    logging.basicConfig(
        level=config.log_level.upper(),
        format=f"%(asctime)s %(levelname)s gateway {index} %(name)s: %(message)s",
    )
    parent = os.getppid()

    def watch_parent() -> None:
        # an orphaned gateway (its supervisor killed) stops instead of serving on alone
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=watch_parent, name="posy-parent", daemon=True).start()
    listener = bind(config.host, config.port)
    listener.listen(BACKLOG)
    own_turns = turns.gateway(index) if turns is not None else None
    server = Server(config, replicas=handles, decode_turns=own_turns)
    app = create_app(config, server)
    run_server(app, server, config, sockets=[listener])
