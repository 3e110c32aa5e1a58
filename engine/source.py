"""ModelSource: a model as the command line names it and the flags that change how it is read, the one
record a replica process or a bulk job's worker gets to resolve the same ModelSpec (no torch imported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.spec import ModelSpec


@dataclass(frozen=True, slots=True)
class ModelSource:
    model: str | None = None  # a folder or hub id; None is the bundled all-MiniLM-L6-v2
    bidirectional: bool = False  # a decoder embedder without its causal mask
    max_model_len: int | None = None  # caps the window
    model_impl: str = "auto"  # engine/config.py MODEL_IMPLS
    trust_remote_code: bool = False  # the transformers fallback may run code in the folder

    def resolve(self) -> ModelSpec:
        """Find the files and read the spec (engine/resolve.py resolve_model)."""
        from engine.resolve import resolve_model

        return resolve_model(
            self.model, self.bidirectional, self.max_model_len, self.model_impl, self.trust_remote_code
        )
