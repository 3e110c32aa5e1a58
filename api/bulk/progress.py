"""How far a bulk job has come: rows done of the input's total once it is known (counted up front, or read
to its end), rows/s, tokens/s and an ETA; a progress bar on a terminal, a log line every LOG_EVERY_S
elsewhere."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

LOG_EVERY_S = 10.0


class JobProgress:
    """`no_total` says why there is no total yet (counting, a stream), in its place, until counted()."""

    def __init__(
        self,
        no_total: str,
        logger: logging.Logger,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.total_rows: int | None = None
        self.no_total = no_total
        self.rows = self.skipped_rows = self.tokens = 0
        self._logger = logger
        self._stream = stream if stream is not None else sys.stderr
        self._clock = clock
        self._started = self._logged = clock()
        self._bar = None

    def start(self) -> None:
        """The job's rows begin to come: the rates are over the time from here (not the model's load)."""
        self._started = self._logged = self._clock()
        if self._stream.isatty():
            from tqdm import tqdm

            options = {"desc": "embedding", "unit": " rows", "smoothing": 0.1, "postfix": self._postfix()}
            self._bar = tqdm(total=self.total_rows, file=self._stream, **options)

    @property
    def seconds(self) -> float:
        return self._clock() - self._started

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def counted(self, total_rows: int | None) -> None:
        """The input's rows (None: not counted after all, so the total stays unknown)."""
        if total_rows is None:
            return
        self.total_rows = total_rows
        if self._bar is not None:
            self._bar.total = total_rows
            self._bar.set_postfix_str(self._postfix())

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
        return max(self.total_rows - self.rows - self.skipped_rows, 0) * self.seconds / self.rows

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _advance(self, rows: int) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(self._postfix(), refresh=False)  # the bar shows rows/s and the ETA
            self._bar.update(rows)
            return
        now = self._clock()
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            self._logger.info("%s", self.line())

    def _postfix(self) -> str:
        no_total = f", {self.no_total}" if self.total_rows is None else ""
        return f"{self.tokens_per_s:,.0f} tokens/s{no_total}"

    def line(self) -> str:
        done = self.rows + self.skipped_rows
        of = f"of {self.total_rows:,} rows" if self.total_rows is not None else f"rows ({self.no_total})"
        eta = self.eta_s()
        left = f", about {duration(eta)} left" if eta else ""  # 0: the job is done
        rates = f"{self.rows_per_s:,.0f} rows/s, {self.tokens_per_s:,.0f} tokens/s"
        return f"embedded {done:,} {of}, {rates}{left}"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
