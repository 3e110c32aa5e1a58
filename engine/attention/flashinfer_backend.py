"""The flashinfer backend: FlashInfer's ragged prefill (FA3 on Hopper, FA2 elsewhere), grouped-query heads
read in place. Its plan() runs on the host with the batch's lengths, once per batch and mask, and every
layer shares it.

CUDA graphs: a graph's batches get wrappers of their own in FlashInfer's graph mode, planned by `prepare`
before each replay. Graph mode fixes the schedule's sizes (and FA3's grid, one program per SM) at the
first plan, so the first plan must cover the whole token bucket: the graph cache's placeholder batch,
with its dummy sequences over the tail, does. Later plans write a new schedule into the same buffers.
Measured on the H200 (bf16, per layer): Qwen3-0.6B's heads (16/8, head dim 128) on one causal text of
4096 tokens 142 us against FlashAttention 2's 359 (its key/value heads repeated first), 50 x 512 174
against 578; BERT-base's (12, head dim 64) 50 x 512 126 against 163. A plan costs the host 0.06 to 1 ms
(about 0.2 us per (tile, head) of the schedule), so a graph re-plans only when its lengths change."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
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
class _GraphPlans:
    """The wrappers of one CUDA graph's batches, by mask, and the lengths they were last planned for."""

    meta: AttentionMetadata  # the graph's, held so that its id is never reused
    # host int32 [num_slots + 1]: the query and key lengths of the next run (the same tensor without a
    # key layout)
    indptr: torch.Tensor
    kv_indptr: torch.Tensor
    wrappers: dict[PlanKey, Any]
    planned: dict[PlanKey, tuple[torch.Tensor, torch.Tensor]]  # the indptrs each wrapper's schedule holds


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


def schedule_bytes(num_tokens: int, num_slots: int, num_heads: int) -> int:
    """A bound on a graph-mode plan's schedule: FA3 keeps 7 int32 arrays of (query tiles of at least 128
    rows + slots) x heads entries; twice that, and 1 MiB for FA2's split-KV bookkeeping."""
    return 2 * 7 * 4 * (-(-num_tokens // 128) + num_slots) * num_heads + 2**20


def host_indptr(seqlens: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor([0, *itertools.accumulate(seqlens)], dtype=torch.int32)


class FlashInferAttention(AttentionBackend):
    name = "flashinfer"
    graph_safe = True  # in graph mode, planned by `prepare` before each replay
    reads_key_layout = True  # key lengths planned apart from the queries', eagerly and in graph mode
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
        self._kv_indptr = self._indptr
        self._num_tokens = 0
        self._planned: dict[PlanKey, Any] = {}
        self._graphs: dict[int, _GraphPlans] = {}  # by id(meta) of each CUDA graph's metadata

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
        if None in (num_heads, num_kv_heads, head_dim, dtype):
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
        graph = self._graphs.get(id(meta))
        if graph is not None and graph.meta is meta:
            return self._graph_wrapper(graph, key, q.shape[0]).run(q, k, v)
        return self._wrapper(meta, key, q.shape[0]).run(q, k, v)

    def prepare(
        self, meta: AttentionMetadata, cu_seqlens: torch.Tensor, key_cu_seqlens: torch.Tensor | None = None
    ) -> None:
        # kept: a later call compares with them
        indptr = cu_seqlens.to(torch.int32, copy=True)
        kv_indptr = indptr if key_cu_seqlens is None else key_cu_seqlens.to(torch.int32, copy=True)
        graph = self._graphs.get(id(meta))
        if graph is None or graph.meta is not meta:
            graph = self._graphs[id(meta)] = _GraphPlans(meta, indptr, kv_indptr, {}, {})
        graph.indptr, graph.kv_indptr = indptr, kv_indptr
        for key, wrapper in graph.wrappers.items():
            # the same lengths as the schedule in the wrapper's device buffers: nothing to redo
            planned_indptr, planned_kv_indptr = graph.planned[key]
            if not (torch.equal(planned_indptr, indptr) and torch.equal(planned_kv_indptr, kv_indptr)):
                self._plan(wrapper, key, indptr, kv_indptr)
                graph.planned[key] = indptr, kv_indptr

    def _graph_wrapper(self, graph: _GraphPlans, key: PlanKey, num_tokens: int) -> Any:
        wrapper = graph.wrappers.get(key)
        if wrapper is not None:
            return wrapper
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("flashinfer: a graph's wrappers are planned in its warm-up, before capture")
        num_slots = graph.indptr.shape[0] - 1
        buffers = [torch.zeros(num_slots + 1, dtype=torch.int32, device=self.device) for _ in range(2)]
        wrapper = self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self._workspace, kv_layout="NHD", backend=self.kernel, use_cuda_graph=True,
            qo_indptr_buf=buffers[0], kv_indptr_buf=buffers[1],
        )  # fmt: skip
        # the schedule's buffer, sized for this graph (FlashInfer's default is 8 MiB, pinned twice)
        size = schedule_bytes(num_tokens, num_slots, key.num_heads)
        schedule = torch.empty(size, dtype=torch.uint8, device=self.device)
        wrapper.reset_workspace_buffer(self._workspace, schedule)
        # the first plan fixes the schedule's sizes: it must cover the graph's whole token bucket
        if int(graph.indptr[-1]) != num_tokens:
            raise ValueError(f"a graph's first plan covers {int(graph.indptr[-1])} of {num_tokens} tokens")
        self._plan(wrapper, key, graph.indptr, graph.kv_indptr)
        graph.wrappers[key], graph.planned[key] = wrapper, (graph.indptr, graph.kv_indptr)
        return wrapper

    def _wrapper(self, meta: AttentionMetadata, key: PlanKey, num_tokens: int) -> Any:
        if meta is not self._batch or meta.seqlens is not self._seqlens:
            # a new batch: its host indptr once, and fresh plans in the other set of wrappers
            self._batch, self._seqlens = meta, meta.seqlens
            self._indptr = host_indptr(meta.seqlens)
            # shared prefixes: each sequence's gathered keys; FlashInfer's causal mask ends aligned
            self._kv_indptr = self._indptr if meta.keys is None else host_indptr(meta.keys.seqlens)
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
            self._plan(slot.wrapper, key, self._indptr, self._kv_indptr)
            if slot.copied is not None:
                slot.copied.record(torch.cuda.current_stream(self.device))
            wrapper = self._planned[key] = slot.wrapper
        return wrapper

    def _new_wrapper(self) -> Any:
        return self._flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            self._workspace, kv_layout="NHD", backend=self.kernel
        )

    def _plan(
        self, wrapper: Any, key: PlanKey, indptr: torch.Tensor, kv_indptr: torch.Tensor | None = None
    ) -> None:
        wrapper.plan(
            indptr,
            indptr if kv_indptr is None else kv_indptr,
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
        """Plan and run one token at start-up, so a kernel module that is missing fails here, clearly;
        unless it was asked for by name, one that would have to be compiled is missing too (a candidate's
        first request would wait minutes for it)."""
        note = "; if not prebuilt, compiling them takes minutes" if self.asked_for else ""
        logger.info("flashinfer: loading ragged prefill kernels (%s)%s", key, note)
        wrapper = self._new_wrapper()
        q = torch.zeros(1, key.num_heads, key.head_dim, dtype=key.dtype, device=self.device)
        k = torch.zeros(1, key.num_kv_heads, key.head_dim, dtype=key.dtype, device=self.device)
        try:
            try:
                with contextlib.nullcontext() if self.asked_for else jit_disabled():
                    self._plan(wrapper, key, host_indptr((1,)))
                    wrapper.run(q, k, k)
            except RuntimeError as error:
                if not compiled_before(error):
                    raise
                self._plan(wrapper, key, host_indptr((1,)))  # its JIT cache holds it: loaded, not compiled
                wrapper.run(q, k, k)
        except RuntimeError as error:  # flashinfer's MissingJITCacheError is one
            if type(error).__name__ == "MissingJITCacheError" and not self.asked_for:
                raise AttentionBackendUnavailable(
                    f"flashinfer has no prebuilt ragged prefill kernels for {key}, and compiling them takes "
                    "minutes: --attention-backend flashinfer compiles them at start-up"
                ) from error
            raise AttentionBackendUnavailable(
                f"flashinfer cannot load its ragged prefill kernels ({key}): {error}"
            ) from error
        if self.device.type == "cuda":
            # this wrapper's pinned schedule buffer is freed on return: let its queued copy finish first
            torch.cuda.current_stream(self.device).synchronize()


def compiled_before(error: RuntimeError) -> bool:
    """A MissingJITCacheError for a module that flashinfer's JIT cache holds (compiled by an earlier run):
    with JIT disabled it loads prebuilt modules only."""
    spec = getattr(error, "spec", None)
    return type(error).__name__ == "MissingJITCacheError" and bool(getattr(spec, "is_compiled", False))


@contextlib.contextmanager
def jit_disabled():
    """flashinfer refuses to compile a missing module (MissingJITCacheError) while FLASHINFER_DISABLE_JIT
    is set, which it reads as it loads one; set around the start-up probe only, where no other thread
    loads kernels yet, and restored after."""
    before = os.environ.get(DISABLE_JIT)
    os.environ[DISABLE_JIT] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ[DISABLE_JIT]
        else:
            os.environ[DISABLE_JIT] = before


DISABLE_JIT = "FLASHINFER_DISABLE_JIT"


def flashinfer_backend(device: torch.device) -> FlashInferAttention:
    if device.type != "cuda":
        raise AttentionBackendUnavailable("needs a CUDA device")
    if not torch.cuda.is_available():
        raise AttentionBackendUnavailable("CUDA is not available")
    return FlashInferAttention(device)
