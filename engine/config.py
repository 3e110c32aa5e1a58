"""EngineConfig: every limit of the runtime in one place, each documented."""

from __future__ import annotations

from dataclasses import dataclass

GPU_MAX_BATCH_TOKENS = 16384
CPU_MAX_BATCH_TOKENS = 4096
QUEUE_BATCHES = 64


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # "cpu" or "cuda[:N]"; the CLI resolves "auto" before building this.
    device: str = "cpu"
    # "float32", "bfloat16" or "float16"; CPU runs float32.
    dtype: str = "float32"
    # attention backend name, resolved once at start-up (see engine/attention).
    attention_backend: str = "auto"
    # tokens one forward pass may hold; never below the largest model window.
    max_batch_tokens: int = CPU_MAX_BATCH_TOKENS
    # sequences one forward pass may hold.
    max_batch_seqs: int = 512
    # tokens waiting in the queue before new work is refused with Overloaded (429).
    max_queue_tokens: int = QUEUE_BATCHES * CPU_MAX_BATCH_TOKENS

    def check(self, max_window: int) -> None:
        if self.max_batch_tokens < max_window:
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) must be at least the largest model "
                f"window ({max_window})"
            )
        if self.max_batch_seqs < 1:
            raise ValueError("max_batch_seqs must be at least 1")
        if self.max_queue_tokens < self.max_batch_tokens:
            raise ValueError("max_queue_tokens must be at least max_batch_tokens")


def default_max_batch_tokens(device: str) -> int:
    return GPU_MAX_BATCH_TOKENS if device.startswith("cuda") else CPU_MAX_BATCH_TOKENS
