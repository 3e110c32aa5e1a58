"""A model posy refuses to serve ends `posy serve` in one line, `posy: cannot serve: <reason>`, and exit
code 2: at resolve (a config, a pooling), or while the lifespan loads it (a tensor its checkpoint lacks, a
dtype it cannot run in), where uvicorn would otherwise log the lifespan's exception group."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from api.server import Server

EXIT_CODE = 2
# uvicorn logs a failed lifespan here: Litestar's formatted traceback, then "Application startup failed"
UVICORN_LOGGER = "uvicorn.error"


def cannot_serve(reason: object) -> int:
    """Say why in one line on stderr; -> the exit code."""
    print(f"posy: cannot serve: {reason}", file=sys.stderr)
    return EXIT_CODE


class QuietRefusal(logging.Filter):
    """Drops uvicorn's error records once the server has refused to start: cannot_serve says why."""

    def __init__(self, server: Server):
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        return self.server.refusal is None or record.levelno < logging.ERROR


def serve_or_refuse(server: Server, serve: Callable[[], None]) -> int:
    """Run `serve` (uvicorn, whose lifespan loads the models); a refusal while loading -> one line."""
    quiet = QuietRefusal(server)
    logger = logging.getLogger(UVICORN_LOGGER)
    logger.addFilter(quiet)
    try:
        serve()
    except SystemExit:  # uvicorn's exit on a failed start-up
        if server.refusal is None:
            raise
        return cannot_serve(server.refusal)
    finally:
        logger.removeFilter(quiet)
    return 0
