"""How far a slow start-up step has come (weight shards and tensors, warm-up, graph capture): a progress
bar where the server's own process writes to a terminal, log lines elsewhere (a replica process, a
container's log), at most one every LOG_EVERY_S and one at the end, so that logs stay readable."""

from __future__ import annotations

import logging
import multiprocessing
import sys
import time
from collections.abc import Iterator, Sequence
from typing import TextIO, TypeVar

T = TypeVar("T")
LOG_EVERY_S = 5.0


def progress(
    items: Sequence[T], description: str, logger: logging.Logger, stream: TextIO | None = None
) -> Iterator[T]:
    """`items` in order, with `description: i of n` shown as they go."""
    stream = stream if stream is not None else sys.stderr
    # replica processes share the terminal with each other and the server: several bars would tangle
    if stream.isatty() and multiprocessing.parent_process() is None:
        from tqdm import tqdm

        yield from tqdm(items, desc=description, total=len(items), file=stream, unit="")
        return
    started = last = time.perf_counter()
    for number, item in enumerate(items, 1):
        yield item
        now = time.perf_counter()
        if number == len(items):
            logger.info("%s: %d of %d in %.1f s", description, number, len(items), now - started)
        elif now - last >= LOG_EVERY_S:
            logger.info("%s: %d of %d", description, number, len(items))
            last = now
