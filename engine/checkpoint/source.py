"""ModelSource: a model as the command line names it and the flags that change how it is read, the one
record a replica process or a bulk job's worker gets to resolve the same ModelSpec (no torch imported)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.checkpoint.spec import ModelSpec

# --pooling, as TEI names its values -> the spec's: an embedder's pooling in place of the folder's, or
# "splade": a masked LM's vocabulary weights (engine/checkpoint/splade.py)
POOLING_FLAGS = {"cls": "cls", "mean": "mean", "last-token": "last", "splade": "splade"}


@dataclass(frozen=True, slots=True)
class ModelFlags:
    """The flags that change how a model is read, `posy serve`'s and `posy embed`'s."""

    bidirectional: bool = False  # a decoder embedder without its causal mask
    max_model_len: int | None = None  # caps the window
    model_impl: str = "auto"  # engine/config.py MODEL_IMPLS
    trust_remote_code: bool = False  # the transformers fallback may run code in the folder
    pooling: str | None = None  # --pooling (POOLING_FLAGS); None: the folder's own


@dataclass(frozen=True, slots=True)
class ModelSource:
    model: str | None = None  # a folder or hub id; None is the bundled all-MiniLM-L6-v2
    flags: ModelFlags = ModelFlags()

    def resolve(self) -> ModelSpec:
        """Find the files and read the spec (engine/checkpoint/resolve.py resolve_model)."""
        from engine.checkpoint.resolve import resolve_model

        flags = self.flags
        return resolve_model(
            self.model, flags.bidirectional, flags.max_model_len, flags.model_impl, flags.trust_remote_code,
            flags.pooling,
        )  # fmt: skip
