"""A fake FlashInfer for CPU tests of the flashinfer adapter's glue: its ragged prefill wrapper records
each plan and answers with the torch reference (keys laid out apart from the queries too)."""

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


class FakeRaggedWrapper:
    """flashinfer.BatchPrefillWithRaggedKVCacheWrapper's plan/run, answered by the torch reference."""

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


def fake_flashinfer(monkeypatch) -> FlashInferAttention:
    """The flashinfer adapter on the CPU over the fake wrapper (for a test's monkeypatch)."""
    module = types.ModuleType("flashinfer")
    module.BatchPrefillWithRaggedKVCacheWrapper = FakeRaggedWrapper
    monkeypatch.setitem(sys.modules, "flashinfer", module)
    monkeypatch.setattr("engine.attention.flashinfer_backend.WORKSPACE_BYTES", 16)
    return FlashInferAttention(torch.device("cpu"))
