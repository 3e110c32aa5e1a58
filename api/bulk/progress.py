"""How far a bulk job has come: rows done (of the total where the input says it), tokens/s and an ETA; a
progress bar on a terminal, a log line every LOG_EVERY_S elsewhere."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

LOG_EVERY_S = 10.0


class JobProgress:
    def __init__(self, total_rows: int | None, logger: logging.Logger, stream: TextIO | None = None):
        self.total_rows = total_rows
        self.rows = self.skipped_rows = self.tokens = 0
        self._logger = logger
        self._started = self._logged = time.perf_counter()
        stream = stream if stream is not None else sys.stderr
        self._bar = None
        if stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total_rows, desc="embedding", unit=" rows", file=stream, smoothing=0.1)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self._started

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def skipped(self, rows: int) -> None:
        """Rows of shards a run before finished: counted as done, not in the rate."""
        self.skipped_rows += rows
        self._advance(rows)

    def embedded(self, rows: int, tokens: int) -> None:
        self.rows += rows
        self.tokens += tokens
        self._advance(rows)

    def eta_s(self) -> float | None:
        if self.total_rows is None or not self.rows:
            return None
        return (self.total_rows - self.rows - self.skipped_rows) * self.seconds / self.rows

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def _advance(self, rows: int) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.tokens_per_s:,.0f} tokens/s", refresh=False)
            self._bar.update(rows)
            return
        now = time.perf_counter()
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            self._logger.info("%s", self.line())

    def line(self) -> str:
        done = self.rows + self.skipped_rows
        of = f" of {self.total_rows:,}" if self.total_rows is not None else ""
        eta = self.eta_s()
        left = f", about {eta:.0f} s left" if eta is not None else ""
        return f"embedded {done:,}{of} rows, {self.tokens_per_s:,.0f} tokens/s{left}"
