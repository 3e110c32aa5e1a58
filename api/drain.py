"""DrainingServer: uvicorn with posy's SIGTERM drain. The first SIGTERM turns /ready to 503 and answers
new work with 503 at once (load balancers notice), keeps the listener open for the grace period, then
lets uvicorn close it and wait (bounded) for the admitted requests, which finish; then the lifespan
stops the engines and the process exits 0. A second signal, or Ctrl-C, stops without the grace period."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType

import uvicorn

from api.server import Server

logger = logging.getLogger(__name__)


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


def run_server(
    app,
    server: Server,
    host: str,
    port: int,
    log_level: str,
    grace_s: float,
    shutdown_timeout_s: float,
    sockets: list | None = None,
) -> None:
    """Serve until drained; on `sockets` (listening already, shared with other gateways) where given."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        # nothing reads the client's address: no X-Forwarded-For rewriting on every request
        proxy_headers=False,
        timeout_graceful_shutdown=max(1, round(shutdown_timeout_s)),
    )
    DrainingServer(config, server, grace_s).run(sockets=sockets)
