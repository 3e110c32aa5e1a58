"""EngineInterface: what serving a model asks of its engine, said once. Engine (in process) and ReplicaPool
(replica processes) implement it (and inherit its `run`); so does the gateway's RequestGuard, the engine as
one request sees it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from engine.outputs import ALL_ROWS, HeadOutput, RowRequest
from engine.request import EngineOutput


class EngineInterface(Protocol):
    @property
    def output(self) -> HeadOutput:
        """What its head gives (engine/outputs.py)."""
        ...

    def enqueue(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
        deadline: float | None = None,
        rows: RowRequest = ALL_ROWS,
    ) -> asyncio.Future[EngineOutput]:
        """Queue the sequences now (a refusal raises here: Overloaded, SequenceTooLong, ValueError) and
        return the future of what `rows` asks of them; cancelling it drops what is still queued."""
        ...

    async def run(
        self,
        token_ids: Sequence[Sequence[int]],
        token_type_ids: Sequence[Sequence[int] | None] | None = None,
        rows: RowRequest = ALL_ROWS,
    ) -> np.ndarray:
        """The rows `rows` asks of the sequences, awaited (float32, in order: by default the head's, one a
        sequence or one a token, HeadOutput.rows); Engine and ReplicaPool inherit this one."""
        return (await self.enqueue(token_ids, token_type_ids, rows=rows)).rows

    def estimate_seconds(self, num_tokens: int) -> float | None:
        """How long `num_tokens` take on it idle (at the rate an idle engine measures), as admission judges
        it (engine/admission.py: stretched by the margin); None before it has measured."""
        ...

    def backlog_seconds(self, num_tokens: int) -> float | None:
        """How long `num_tokens` queued now would take to come back behind its queue, as admission judges
        it (engine/admission.py)."""
        ...

    def rates(self) -> list[tuple[float | None, float]]:
        """(seconds a token, margin) that admission judges each of its engines on (one a replica), for
        /metrics and the logs."""
        ...

    def shares_prefix(self, prefix_length: int, lengths: Sequence[int]) -> bool:
        """Whether sequences of `lengths` that start with the same `prefix_length` tokens should come as
        continuations of that prefix (a RowRequest's prefix) rather than whole."""
        ...

    def tokens_to_run(self, lengths: Sequence[int], prefix_length: int = 0) -> int:
        """The tokens a request of `lengths` (continuing a prefix of `prefix_length`) runs."""
        ...

    @property
    def queued_tokens(self) -> int: ...

    @property
    def accepting(self) -> bool:
        """It runs and takes work (readiness)."""
        ...

    def describe(self) -> dict[str, str]:
        """How it runs, for logs and metrics."""
        ...

    def stop(self) -> None: ...
