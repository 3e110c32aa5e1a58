"""DrainingServer: uvicorn with posy's SIGTERM drain. The first SIGTERM turns /ready to 503 and answers
new work with 503 at once (load balancers notice), each answer closing its connection, keeps the listener
open for the grace period, then closes it, answers what open connections had sent by then, and lets
uvicorn close the rest and wait (bounded) for the admitted requests, which finish; then the lifespan stops
the engines and the process exits 0. A second signal, or Ctrl-C, stops without the grace period."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from types import FrameType

import uvicorn

from api.config import ServerConfig
from api.connection_limits import ConnectionLimits, awaits_first_request, limited_protocol
from api.server import Server

logger = logging.getLogger(__name__)
# once the listener is closed, how long open connections get to have what they sent read (and answered)
# before uvicorn closes those that are idle: a request sent on an idle connection as it closes is lost
# ("server disconnected"). A connection that has sent no request yet (one the kernel had queued) gets
# longer: its client connected before the close and is about to send, but on a loaded host its first
# bytes came 0.5 s later (CI, 4 requests lost of some 2,300)
SETTLE_S = 0.5
FIRST_REQUEST_S = 3.0
SETTLE_POLL_S = 0.02


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, server: Server, grace_s: float):
        super().__init__(config)
        self.posy = server
        self.grace_s = grace_s
        self._timer: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig != signal.SIGTERM or self.posy.draining or self.grace_s <= 0:
            super().handle_exit(sig, frame)
            return
        self.posy.draining = True
        logger.info("SIGTERM: draining; new requests get 503 for %.0f s, then the port closes", self.grace_s)
        # should_exit, uvicorn's own switch, not handle_exit: uvicorn re-raises the signals it handled
        # once it has stopped, and a drained shutdown is a clean exit 0
        self._timer = threading.Timer(self.grace_s, setattr, (self, "should_exit", True))
        self._timer.daemon = True
        self._timer.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.posy.draining:
            loop = asyncio.get_running_loop()
            for connection in self._close_listeners(sockets):
                await loop.connect_accepted_socket(self._protocol, connection)
            await self._settle()
        await super().shutdown(sockets)

    def _close_listeners(self, sockets: list[socket.socket] | None) -> list[socket.socket]:
        """Close the listeners, first taking the connections the kernel had queued on them (which their
        close would reset, requests and all); no await between the two, so nothing else queues."""
        queued: list[socket.socket] = []
        for server in self.servers:
            for listener in server.sockets:
                queued += accept_queued(listener.fileno())
            server.close()
        for sock in sockets or []:
            sock.close()
        return queued

    def _protocol(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn's startup makes it for its listeners."""
        return self.config.http_protocol_class(
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )

    async def _settle(self) -> None:
        """Until no connection is open (each drained answer closes its own), or SETTLE_S pass and no
        connection awaits its first request, or FIRST_REQUEST_S pass."""
        start = time.monotonic()
        while connections := self.server_state.connections:
            waited = time.monotonic() - start
            if waited >= FIRST_REQUEST_S or (
                waited >= SETTLE_S and not any(map(awaits_first_request, connections))
            ):
                return
            await asyncio.sleep(SETTLE_POLL_S)


def accept_queued(listener_fd: int) -> list[socket.socket]:
    """Every connection queued on a listening (non-blocking) socket, accepted."""
    listener = socket.socket(fileno=os.dup(listener_fd))
    listener.setblocking(False)
    queued = []
    try:
        while True:
            connection, _ = listener.accept()
            connection.setblocking(False)
            queued.append(connection)
    except (BlockingIOError, InterruptedError):
        return queued
    finally:
        listener.close()


def run_server(app, server: Server, config: ServerConfig, sockets: list | None = None) -> None:
    """Serve until drained; on `sockets` (listening already, shared with other gateways) where given."""
    uvicorn_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level,
        access_log=False,
        # nothing reads the client's address: no X-Forwarded-For rewriting on every request
        proxy_headers=False,
        timeout_graceful_shutdown=max(1, round(config.shutdown_timeout)),
        # httptools' protocol with read deadlines and a cap on open connections
        http=limited_protocol(ConnectionLimits.of(config)),
    )
    DrainingServer(uvicorn_config, server, config.drain_grace).run(sockets=sockets)
