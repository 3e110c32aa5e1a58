"""The flashinfer backend: FlashInfer's ragged prefill (FA3 or FA2 inside). Its plan() runs on the host
with the batch's lengths, once per batch and mask, and is shared by every layer; not CUDA-graph safe."""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import Any

import torch

from engine.attention.base import AttentionBackend, Window
from engine.attention.metadata import AttentionMetadata
from engine.errors import AttentionBackendUnavailable

logger = logging.getLogger(__name__)

WORKSPACE_BYTES = 128 * 2**20


@dataclass(frozen=True, slots=True)
class PlanKey:
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    causal: bool
    window_left: int  # -1: unbounded
    sm_scale: float | None = None  # None: 1 / sqrt(head_dim)

    def __str__(self) -> str:
        mask = "causal" if self.causal else "bidirectional"
        if self.window_left >= 0:
            mask += f", window {self.window_left}"
        if self.sm_scale is not None:
            mask += f", scale {self.sm_scale:g}"
        dtype = str(self.dtype).removeprefix("torch.")
        return f"{dtype}, {self.num_heads}/{self.num_kv_heads} heads, head dim {self.head_dim}, {mask}"


@dataclass(slots=True)
class _Slot:
    wrapper: Any  # flashinfer.BatchPrefillWithRaggedKVCacheWrapper
    copied: torch.cuda.Event | None  # recorded after plan() queued its copy of the schedule; None on CPU


def mask_arguments(causal: bool, window: Window | None) -> tuple[bool, int]:
    """(causal, window_left) for plan(): FlashInfer bounds windows on the left only, so a window must be
    causal, (left, 0)."""
    if window is None:
        return causal, -1
    left, right = window
    if right != 0:
        raise AttentionBackendUnavailable(
            f"flashinfer has only causal sliding windows (left, 0), not {window}"
        )
    return True, left


def host_indptr(seqlens: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(seqlens)], dtype=torch.int32)


class FlashInferAttention(AttentionBackend):
    name = "flashinfer"
    graph_safe = False  # plan() reads the lengths on the host each batch
    head_dims = frozenset({64, 128, 256})
    dtypes = frozenset({torch.bfloat16, torch.float16})

    def __init__(self, device: torch.device, kernel: str = "auto") -> None:
        try:
            import flashinfer
        except (ImportError, OSError) as error:
            raise AttentionBackendUnavailable(f"flashinfer cannot be imported: {error}") from error
        self._flashinfer = flashinfer
        self.device = device
        self.kernel = kernel  # flashinfer's own choice: "auto" (FA3 on Hopper, else FA2), "fa3" or "fa2"
        # one workspace for every wrapper: they all run on one stream, one after another
        self._workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        # plan() writes the schedule to a pinned host buffer and queues a copy to the device; the host
        # runs a batch ahead, so batches use two sets of wrappers in turn, and a wrapper is planned again
        # only once its last copy has run (its event), else that copy could read the newer schedule
        self._slots: tuple[dict[PlanKey, _Slot], dict[PlanKey, _Slot]] = ({}, {})
        self._turn = 0
        self._batch: AttentionMetadata | None = None  # held, so identity cannot be reused by a new batch
        self._seqlens: tuple[int, ...] = ()
        self._indptr = host_indptr(())
        self._num_tokens = 0
        self._planned: dict[PlanKey, Any] = {}

    def check(
        self,
        num_heads: int | None = None,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        dtype: torch.dtype | None = None,
        window: Window | None = None,
        position_bias: bool = False,
    ) -> None:
        super().check(num_heads, num_kv_heads, head_dim, dtype, position_bias=position_bias)
        causal, window_left = mask_arguments(False, window)
        if None in (num_heads, num_kv_heads, head_dim, dtype) or self.device.type != "cuda":
            return
        self._load_kernels(PlanKey(num_heads, num_kv_heads, head_dim, dtype, causal, window_left))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        causal: bool,
        window: Window | None,
        scale: float | None = None,
    ) -> torch.Tensor:
        # q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q
        causal, window_left = mask_arguments(causal, window)
        key = PlanKey(q.shape[1], k.shape[1], q.shape[2], q.dtype, causal, window_left, scale)
        return self._wrapper(meta, key, q.shape[0]).run(q, k, v)

    def _wrapper(self, meta: AttentionMetadata, key: PlanKey, num_tokens: int) -> Any:
        if meta is not self._batch or meta.seqlens is not self._seqlens:
            # a new batch: its host indptr once, and fresh plans in the other set of wrappers
            self._batch, self._seqlens = meta, meta.seqlens
            self._indptr = host_indptr(meta.seqlens)
            self._num_tokens = int(self._indptr[-1])
            self._turn = 1 - self._turn
            self._planned = {}
        if self._num_tokens != num_tokens:
            raise ValueError(
                f"flashinfer plans from the host lengths (meta.seqlens), which cover {self._num_tokens} "
                f"tokens, not {num_tokens}; a CUDA-graph batch has none"
            )
        wrapper = self._planned.get(key)
        if wrapper is None:
            slots = self._slots[self._turn]
            slot = slots.get(key)
            if slot is None:
                copied = torch.cuda.Event() if self.device.type == "cuda" else None
                slot = slots[key] = _Slot(self._new_wrapper(), copied)
            if slot.copied is not None:
                slot.copied.synchronize()  # returns at once while never recorded
            self._plan(slot.wrapper, key, self._indptr)
            if slot.copied is not None:
                slot.copied.record(torch.cuda.current_stream(self.device))
            wrapper = self._planned[key] = slot.wrapper
        return wrapper

    def _new_wrapper(self) -> Any:
        return self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self._workspace, kv_layout="NHD", backend=self.kernel
        )

    def _plan(self, wrapper: Any, key: PlanKey, indptr: torch.Tensor) -> None:
        wrapper.plan(
            indptr,
            indptr,
            key.num_heads,
            key.num_kv_heads,
            key.head_dim,
            causal=key.causal,
            window_left=key.window_left,
            sm_scale=key.sm_scale,
            q_data_type=key.dtype,
            kv_data_type=key.dtype,
        )

    def _load_kernels(self, key: PlanKey) -> None:
        """Plan and run one token at start-up, so a kernel module that is missing fails here, clearly."""
        logger.info(
            "flashinfer: loading ragged prefill kernels (%s); if not prebuilt and JIT is on, minutes",
            key,
        )
        wrapper = self._new_wrapper()
        q = torch.zeros(1, key.num_heads, key.head_dim, dtype=key.dtype, device=self.device)
        k = torch.zeros(1, key.num_kv_heads, key.head_dim, dtype=key.dtype, device=self.device)
        try:
            self._plan(wrapper, key, host_indptr((1,)))
            wrapper.run(q, k, k)
        except RuntimeError as error:  # flashinfer's MissingJITCacheError is one
            raise AttentionBackendUnavailable(
                f"flashinfer cannot load its ragged prefill kernels ({key}): {error}"
            ) from error
        # this wrapper's pinned schedule buffer is freed on return: let its queued copy finish first
        torch.cuda.current_stream(self.device).synchronize()


def flashinfer_backend(device: torch.device) -> FlashInferAttention:
    if device.type != "cuda":
        raise AttentionBackendUnavailable("needs a CUDA device")
    if not torch.cuda.is_available():
        raise AttentionBackendUnavailable("CUDA is not available")
    return FlashInferAttention(device)
