"""A fake FlashInfer for CPU tests of the flashinfer adapter's glue: its ragged prefill wrapper records
each plan and answers with the torch reference (keys laid out apart from the queries too)."""

import os
import sys
import types

import torch

from engine.attention import AttentionMetadata
from engine.attention.flashinfer_backend import FlashInferAttention
from engine.attention.metadata import KeyLayout
from engine.attention.torch_backend import TorchAttention


def reference(q, k, v, cu_seqlens, causal, window, scale=None):
    meta = AttentionMetadata.build(cu_seqlens.cpu(), int(torch.diff(cu_seqlens).max()))
    return TorchAttention().forward(q, k, v, meta, causal, window, scale)


class MissingJITCacheError(RuntimeError):
    """flashinfer's, by name: a kernel module not prebuilt while JIT is disabled; its spec says whether
    the JIT cache holds it."""

    def __init__(self, message: str, cached: bool):
        super().__init__(message)
        self.spec = types.SimpleNamespace(is_compiled=cached)


class FakeRaggedWrapper:
    """flashinfer.BatchPrefillWithRaggedKVCacheWrapper's plan/run, answered by the torch reference. Its
    modules are prebuilt for PREBUILT_HEAD_DIMS only (None: all): plan() of another head dim "compiles" it
    (noted in `compiled`) unless FLASHINFER_DISABLE_JIT is set, as flashinfer's loader does."""

    PREBUILT_HEAD_DIMS: frozenset[int] | None = None
    compiled: list[int] = []  # head dims compiled, in order; the JIT cache holds them from then on

    def __init__(
        self, float_workspace_buffer, kv_layout="NHD", backend="auto", use_cuda_graph=False, **buffers
    ):
        assert kv_layout == "NHD"
        assert set(buffers) == ({"qo_indptr_buf", "kv_indptr_buf"} if use_cuda_graph else set())
        self.plans = []
        self.kv_indptrs = []
        self.use_cuda_graph = use_cuda_graph
        self.schedule_bytes = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer):
        self.schedule_bytes = int_workspace_buffer.numel()

    def plan(
        self,
        qo_indptr,
        kv_indptr,
        num_qo_heads,
        num_kv_heads,
        head_dim_qk,
        *,
        causal=False,
        window_left=-1,
        sm_scale=None,
        q_data_type=torch.float16,
        kv_data_type=None,
    ):
        for indptr in (qo_indptr, kv_indptr):
            assert indptr.device.type == "cpu" and indptr.dtype == torch.int32
        prebuilt = self.PREBUILT_HEAD_DIMS
        if prebuilt is not None and head_dim_qk not in prebuilt:
            cached = head_dim_qk in FakeRaggedWrapper.compiled
            if os.environ.get("FLASHINFER_DISABLE_JIT"):
                raise MissingJITCacheError(f"no module for head dim {head_dim_qk}", cached)
            if not cached:
                FakeRaggedWrapper.compiled.append(head_dim_qk)
        self.plans.append((qo_indptr.tolist(), num_qo_heads, num_kv_heads, head_dim_qk, causal, window_left))
        # keys laid out apart from the queries (shared prefixes): their own lengths, the mask ends aligned
        self.kv_indptrs.append(None if torch.equal(qo_indptr, kv_indptr) else kv_indptr.tolist())
        self.sm_scale = sm_scale

    def run(self, q, k, v):
        indptr, _, _, _, causal, window_left = self.plans[-1]
        window = None if window_left < 0 else (window_left, 0)
        kv_indptr = self.kv_indptrs[-1]
        if kv_indptr is None:
            return reference(q, k, v, torch.tensor(indptr), causal, window, self.sm_scale)
        meta = AttentionMetadata.build(torch.tensor(indptr, dtype=torch.int32), max(indptr))
        key_lengths = tuple(torch.diff(torch.tensor(kv_indptr)).tolist())
        index = torch.arange(kv_indptr[-1])  # the keys as they reach run(): gathered already
        meta.keys = KeyLayout(index, torch.tensor(kv_indptr), key_lengths, max(key_lengths))
        return TorchAttention().forward(q, k, v, meta, causal, window, self.sm_scale)


def fake_flashinfer(monkeypatch, asked_for: bool = False) -> FlashInferAttention:
    """The flashinfer adapter on the CPU over the fake wrapper (for a test's monkeypatch)."""
    module = types.ModuleType("flashinfer")
    module.BatchPrefillWithRaggedKVCacheWrapper = FakeRaggedWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr("engine.attention.flashinfer_backend.WORKSPACE_BYTES", 16)
    monkeypatch.setattr(FakeRaggedWrapper, "compiled", [])
    backend = FlashInferAttention(torch.device("cpu"))
    backend.asked_for = asked_for
    return backend
