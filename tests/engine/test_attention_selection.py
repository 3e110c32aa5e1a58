"""Backend selection ("auto" and explicit names) and each CUDA adapter's glue, on the CPU: fake kernels
(flashinfer, flash_attn.cute, torch's varlen_attn) record their arguments and answer with the torch
reference, so the outputs match it to atol 1e-5 in fp32."""

import os
import sys
import types

import pytest
import torch
import torch.nn.attention.varlen

from engine.attention import (
    AUTO_ORDER,
    BACKENDS,
    AttentionMetadata,
    for_head_dim,
    select_backend,
    varlen_attention,
)
from engine.attention.base import AttentionBackend
from engine.attention.flash_attn_backend import FlashAttnAttention
from engine.attention.flashinfer_backend import FlashInferAttention
from engine.attention.metadata import KeyLayout
from engine.attention.torch_backend import TorchAttention
from engine.attention.torch_varlen import TorchVarlenAttention
from engine.batch import pack
from engine.errors import AttentionBackendUnavailable
from tests.engine.fake_flashinfer import fake_flashinfer, reference

SEQLENS = [3, 5, 1, 7]


def batch(num_heads=4, num_kv_heads=4, head_dim=16, seqlens=SEQLENS, seed=0):
    generator = torch.Generator().manual_seed(seed)
    num_tokens = sum(seqlens)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=generator)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)
    cu_seqlens = torch.tensor([0, *torch.tensor(seqlens).cumsum(0).tolist()], dtype=torch.int32)
    return q, k, v, AttentionMetadata.build(cu_seqlens, max(seqlens))


# ---- selection ------------------------------------------------------------------------------------


def test_auto_on_cpu_is_torch():
    backend = select_backend("auto", "cpu", num_heads=8, num_kv_heads=2, head_dim=32, dtype=torch.float32)
    assert backend.name == "torch"
    assert "CPU" in backend.reason
    assert select_backend("auto", "cpu", graphs=True).name == "torch"


@pytest.mark.parametrize("name", ["torch-varlen", "flashinfer", "flash-attn", "triton"])
def test_cuda_backends_on_cpu_say_why(name):
    with pytest.raises(AttentionBackendUnavailable, match=f"'{name}' cannot run on cpu: needs a CUDA device"):
        select_backend(name, "cpu")


def test_explicit_choice_checks_the_shape():
    assert select_backend("torch", "cpu", num_heads=8, num_kv_heads=2).reason == "asked for"
    with pytest.raises(AttentionBackendUnavailable, match="not a multiple of 3 key/value heads"):
        select_backend("torch", "cpu", num_heads=8, num_kv_heads=3)


def test_every_auto_row_ends_with_the_reference():
    for order in AUTO_ORDER.values():
        assert order[-1] == "torch"
        assert set(order) <= set(BACKENDS)
    assert AUTO_ORDER["cuda", True][:4] == ("triton", "flash-attn", "flashinfer", "torch-varlen")
    assert AUTO_ORDER["cuda", False][0] == "flashinfer"


class FakeBackend(AttentionBackend):
    dtypes = frozenset({torch.bfloat16, torch.float16})

    def __init__(self, name, graph_safe, head_dims):
        self.name, self.graph_safe, self.head_dims = name, graph_safe, head_dims


@pytest.fixture
def fake_cuda_backends(monkeypatch):
    """Replace the CUDA factories with fakes; returns the set of names to report as not installed."""
    missing = set()
    specs = {
        "flash-attn": (True, frozenset(range(8, 257, 8))),
        "torch-varlen": (True, frozenset(range(8, 257, 8))),
        "triton": (True, frozenset(range(16, 257, 16))),
        "flashinfer": (True, frozenset({64, 128, 256})),
    }
    for name, (graph_safe, head_dims) in specs.items():

        def factory(device, name=name, graph_safe=graph_safe, head_dims=head_dims):
            if name in missing:
                raise AttentionBackendUnavailable("not installed")
            return FakeBackend(name, graph_safe, head_dims)

        monkeypatch.setitem(BACKENDS, name, factory)
    return missing


def auto(graphs, head_dim=64, dtype=torch.bfloat16):
    return select_backend(
        "auto", "cuda", num_heads=8, num_kv_heads=2, head_dim=head_dim, dtype=dtype, graphs=graphs
    )


def test_auto_with_graphs_takes_the_first_graph_safe_backend(fake_cuda_backends):
    assert auto(graphs=True).name == "triton"
    fake_cuda_backends.add("triton")
    backend = auto(graphs=True)
    assert backend.name == "flash-attn"
    assert "graph-safe backends, fastest first" in backend.reason
    assert "passed over triton (not installed)" in backend.reason
    fake_cuda_backends.add("flash-attn")
    assert auto(graphs=True).name == "flashinfer"
    assert auto(graphs=True, head_dim=8).name == "torch-varlen"  # flashinfer's head dims are 64/128/256
    fake_cuda_backends.add("flashinfer")
    assert auto(graphs=True).name == "torch-varlen"


def test_auto_with_graphs_falls_back_to_eager_backends(fake_cuda_backends):
    fake_cuda_backends.update({"flash-attn", "triton", "torch-varlen", "flashinfer"})
    backend = auto(graphs=True)
    assert backend.name == "torch"
    assert backend.reason.endswith("not graph-safe, so CUDA graphs stay off")


def test_auto_without_graphs_prefers_flashinfer_where_the_head_dim_fits(fake_cuda_backends):
    assert auto(graphs=False).name == "flashinfer"
    backend = auto(graphs=False, head_dim=32)
    assert backend.name == "flash-attn"
    assert "flashinfer (flashinfer supports head dims 64/128/256, not 32)" in backend.reason
    fake_cuda_backends.update({"flashinfer", "flash-attn"})
    assert auto(graphs=False).name == "triton"
    fake_cuda_backends.add("triton")
    assert auto(graphs=False).name == "torch-varlen"
    # fp32 fits none of the CUDA kernels: the reference
    assert auto(graphs=False, dtype=torch.float32).name == "torch"


def test_explicit_choice_that_does_not_fit(fake_cuda_backends):
    with pytest.raises(AttentionBackendUnavailable, match="'flashinfer' cannot run on cuda: .* not 32"):
        select_backend("flashinfer", "cuda", head_dim=32)
    assert select_backend("flashinfer", "cuda", head_dim=128, graphs=True).reason == "asked for"
    backend = select_backend("torch", "cuda", head_dim=128, graphs=True)
    assert backend.reason == "asked for; not graph-safe, so CUDA graphs stay off"
    assert select_backend("torch-varlen", "cuda", head_dim=128, graphs=True).reason == "asked for"


def test_a_vision_tower_of_another_head_dim_runs_on_flashattention_2(fake_cuda_backends):
    """Qwen2-VL-2B's vision heads of 80 beside its decoder's 128: one FlashAttention 2 kernel a batch of
    images where the decoder's backend lacks 80, torch's SDPA (a kernel a run) only where that cannot."""
    flashinfer = auto(graphs=False)
    assert flashinfer.name == "flashinfer"
    assert for_head_dim(flashinfer, 128) is flashinfer
    assert for_head_dim(flashinfer, 80).name == "torch-varlen"
    assert for_head_dim(flashinfer, 84).name == "torch"  # FlashAttention 2 takes multiples of 8
    fake_cuda_backends.add("torch-varlen")
    assert for_head_dim(flashinfer, 80).name == "torch"
    reference = select_backend("torch", "cpu")
    assert for_head_dim(reference, 80) is reference


def test_auto_without_the_shape_keeps_to_the_reference(fake_cuda_backends):
    backend = select_backend("auto", "cuda", graphs=True)
    assert backend.name == "torch"
    assert "flash-attn (auto needs the model's head_dim and dtype to choose it)" in backend.reason


# ---- flashinfer glue --------------------------------------------------------------------------------


@pytest.fixture
def flashinfer_cpu(monkeypatch):
    return fake_flashinfer(monkeypatch)


def test_flashinfer_check(flashinfer_cpu):
    flashinfer_cpu.check(8, 2, 128, torch.bfloat16)
    flashinfer_cpu.check(8, 2, 64, torch.float16, window=(16, 0))
    with pytest.raises(AttentionBackendUnavailable, match="head dims 64/128/256, not 32"):
        flashinfer_cpu.check(8, 2, 32, torch.bfloat16)
    with pytest.raises(AttentionBackendUnavailable, match="not float32"):
        flashinfer_cpu.check(8, 2, 64, torch.float32)
    with pytest.raises(AttentionBackendUnavailable, match="only causal sliding windows"):
        flashinfer_cpu.check(8, 2, 64, torch.bfloat16, window=(4, 4))


def test_flashinfer_as_a_candidate_never_compiles_a_missing_kernel_module(monkeypatch):
    """A user's first Gemma3 request (head dim 256) waited minutes while FlashInfer compiled its module
    behind the triton backend: as a candidate it is unavailable there instead; asked for, it compiles."""
    from tests.engine.fake_flashinfer import FakeRaggedWrapper

    monkeypatch.setattr(FakeRaggedWrapper, "PREBUILT_HEAD_DIMS", frozenset({64, 128}))
    candidate = fake_flashinfer(monkeypatch)
    candidate.check(8, 2, 128, torch.bfloat16)
    with pytest.raises(AttentionBackendUnavailable, match="no prebuilt ragged prefill kernels"):
        candidate.check(8, 2, 256, torch.bfloat16)
    assert FakeRaggedWrapper.compiled == [] and "FLASHINFER_DISABLE_JIT" not in os.environ
    asked_for = fake_flashinfer(monkeypatch, asked_for=True)
    asked_for.check(8, 2, 256, torch.bfloat16)
    assert FakeRaggedWrapper.compiled == [256]
    # compiled by an earlier run, its JIT cache holds it: a candidate loads it
    later = fake_flashinfer(monkeypatch)
    FakeRaggedWrapper.compiled.append(256)
    later.check(8, 2, 256, torch.bfloat16)
    assert FakeRaggedWrapper.compiled == [256]


def test_flashinfer_unavailable_without_the_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    with pytest.raises(AttentionBackendUnavailable, match="flashinfer cannot be imported"):
        FlashInferAttention(torch.device("cpu"))


def test_flashinfer_plans_once_per_batch_and_mask(flashinfer_cpu):
    q, k, v, meta = batch(num_heads=8, num_kv_heads=2)
    for _ in range(3):  # three layers of one forward
        out = varlen_attention(q, k, v, meta, backend=flashinfer_cpu, causal=True)
    torch.testing.assert_close(out, reference(q, k, v, meta.cu_seqlens, True, None), atol=1e-5, rtol=1e-5)
    windowed = varlen_attention(q, k, v, meta, backend=flashinfer_cpu, causal=True, window=2)
    torch.testing.assert_close(
        windowed, reference(q, k, v, meta.cu_seqlens, True, (2, 0)), atol=1e-5, rtol=1e-5
    )
    first_set = flashinfer_cpu._slots[flashinfer_cpu._turn]
    plans = [plan for slot in first_set.values() for plan in slot.wrapper.plans]
    assert plans == [
        ([0, 3, 8, 9, 16], 8, 2, 16, True, -1),
        ([0, 3, 8, 9, 16], 8, 2, 16, True, 2),
    ]

    # the next batch plans again, in the other set of wrappers (the first set's copies may be in flight)
    q2, k2, v2, meta2 = batch(num_heads=8, num_kv_heads=2, seqlens=[2, 2, 12], seed=1)
    out2 = varlen_attention(q2, k2, v2, meta2, backend=flashinfer_cpu, causal=False)
    torch.testing.assert_close(
        out2, reference(q2, k2, v2, meta2.cu_seqlens, False, None), atol=1e-5, rtol=1e-5
    )
    second_set = flashinfer_cpu._slots[flashinfer_cpu._turn]
    assert second_set is not first_set
    assert [slot.wrapper.plans for slot in second_set.values()] == [[([0, 2, 4, 16], 8, 2, 16, False, -1)]]


def test_flashinfer_plans_with_the_softmax_scale(flashinfer_cpu):
    """Gemma3's query_pre_attn_scalar ** -0.5 reaches plan(); a new scale is a new plan."""
    q, k, v, meta = batch(num_heads=8, num_kv_heads=2)
    scaled = varlen_attention(q, k, v, meta, backend=flashinfer_cpu, causal=True, scale=0.4)
    torch.testing.assert_close(
        scaled, reference(q, k, v, meta.cu_seqlens, True, None, 0.4), atol=1e-5, rtol=1e-5
    )
    default = varlen_attention(q, k, v, meta, backend=flashinfer_cpu, causal=True)
    assert (scaled - default).abs().max().item() > 1e-2


def test_flashinfer_refuses_a_batch_without_host_lengths(flashinfer_cpu):
    q, k, v, meta = batch()
    graph_meta = AttentionMetadata(
        cu_seqlens=meta.cu_seqlens,
        max_seqlen=16,
        seqlens=(0,) * 4,
        runs=(),
        segment_ids=meta.segment_ids,
        lengths=meta.lengths,
    )
    with pytest.raises(ValueError, match="host lengths"):
        varlen_attention(q, k, v, graph_meta, backend=flashinfer_cpu)


def graph_meta_of(meta):
    """`meta` as a CUDA graph holds it: no host lengths."""
    slots = meta.cu_seqlens.shape[0] - 1
    return AttentionMetadata(meta.cu_seqlens, 16, (0,) * slots, (), meta.segment_ids, meta.lengths)


def test_flashinfer_plans_a_graphs_batches_in_prepare(flashinfer_cpu):
    """A graph's metadata gets a graph-mode wrapper, planned first for the lengths `prepare` gave (the
    whole bucket) and again only when a later `prepare` brings other lengths; layers share it."""
    q, k, v, meta = batch(num_heads=8, num_kv_heads=2)  # lengths 3, 5, 1, 7
    graph_meta = graph_meta_of(meta)
    flashinfer_cpu.prepare(graph_meta, torch.tensor([0, 3, 8, 9, 16], dtype=torch.int32))
    for _ in range(2):  # two layers (the warm-up of a capture)
        out = varlen_attention(q, k, v, graph_meta, backend=flashinfer_cpu, causal=True)
    torch.testing.assert_close(out, reference(q, k, v, meta.cu_seqlens, True, None), atol=1e-5, rtol=1e-5)
    (wrapper,) = flashinfer_cpu._graphs[id(graph_meta)].wrappers.values()
    assert wrapper.use_cuda_graph and 0 < wrapper.schedule_bytes < 8 * 2**20
    assert [plan[0] for plan in wrapper.plans] == [[0, 3, 8, 9, 16]]

    flashinfer_cpu.prepare(graph_meta, torch.tensor([0, 3, 8, 9, 16], dtype=torch.int32))  # the same
    new_lengths = torch.tensor([0, 10, 10, 12, 16], dtype=torch.int32)  # a zero-length slot among them
    flashinfer_cpu.prepare(graph_meta, new_lengths)
    out = varlen_attention(q, k, v, graph_meta, backend=flashinfer_cpu, causal=True)
    torch.testing.assert_close(out, reference(q, k, v, new_lengths, True, None), atol=1e-5, rtol=1e-5)
    assert [plan[0] for plan in wrapper.plans] == [[0, 3, 8, 9, 16], [0, 10, 10, 12, 16]]
    # a batch of other metadata still plans from its own host lengths
    eager = varlen_attention(q, k, v, meta, backend=flashinfer_cpu, causal=True)
    torch.testing.assert_close(eager, reference(q, k, v, meta.cu_seqlens, True, None), atol=1e-5, rtol=1e-5)


def test_flashinfer_plans_a_graphs_shared_prefixes_with_their_key_lengths(flashinfer_cpu):
    """A graph of shared-prefix batches: `prepare` brings the key lengths beside the query lengths, the
    plan takes both, and a later `prepare` plans again when either changes."""
    packed = pack([[0] * 3, [0] * 5, [0] * 1, [0] * 7], prefix_of=[-1, 0, -1, 2])
    meta = AttentionMetadata.build(packed.cu_seqlens, packed.max_seqlen, packed.prefix_of)
    q, k, v, _ = batch(num_heads=8, num_kv_heads=2)
    expected = varlen_attention(q, k, v, meta, backend=TorchAttention(), causal=True)
    graph_meta = graph_meta_of(meta)
    graph_meta.keys = KeyLayout(meta.keys.index, meta.keys.cu_seqlens, (0,) * 4, 16)
    key_cu_seqlens = torch.tensor([0, 3, 11, 12, 20])
    assert meta.keys.cu_seqlens.tolist() == key_cu_seqlens.tolist()
    flashinfer_cpu.prepare(graph_meta, torch.tensor([0, 3, 8, 9, 16]), key_cu_seqlens)
    out = varlen_attention(q, k, v, graph_meta, backend=flashinfer_cpu, causal=True)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    (wrapper,) = flashinfer_cpu._graphs[id(graph_meta)].wrappers.values()
    assert wrapper.kv_indptrs == [[0, 3, 11, 12, 20]]
    flashinfer_cpu.prepare(graph_meta, torch.tensor([0, 3, 8, 9, 16]), key_cu_seqlens)  # the same
    assert len(wrapper.plans) == 1
    flashinfer_cpu.prepare(graph_meta, torch.tensor([0, 3, 8, 9, 16]), torch.tensor([0, 3, 8, 9, 16]))
    assert wrapper.kv_indptrs == [[0, 3, 11, 12, 20], None]  # keys as the queries: no layout


def test_flashinfer_graph_plans_must_first_cover_the_bucket(flashinfer_cpu):
    q, k, v, meta = batch()
    graph_meta = graph_meta_of(meta)
    flashinfer_cpu.prepare(graph_meta, torch.tensor([0, 3, 8, 9, 9], dtype=torch.int32))  # 9 of 16
    with pytest.raises(ValueError, match="covers 9 of 16 tokens"):
        varlen_attention(q, k, v, graph_meta, backend=flashinfer_cpu)


# ---- torch-varlen glue ------------------------------------------------------------------------------


def fake_varlen_attn(calls, native_gqa):
    """torch 2.11's varlen_attn (no enable_gqa), or a later one with it."""

    def attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size):
        calls.append({"max": (max_q, max_k), "window_size": window_size, "kv_heads": key.shape[1]})
        assert cu_seq_q is cu_seq_k and isinstance(window_size, tuple)
        causal = window_size == (-1, 0)
        window = None if causal or window_size == (-1, -1) else window_size
        return reference(query, key, value, cu_seq_q, causal, window)

    def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        assert key.shape[1] == query.shape[1]
        return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size)

    def varlen_attn_gqa(
        query,
        key,
        value,
        cu_seq_q,
        cu_seq_k,
        max_q,
        max_k,
        *,
        scale=None,
        window_size=(-1, -1),
        enable_gqa=False,
    ):
        assert enable_gqa == (key.shape[1] != query.shape[1])
        return attend(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size)

    return varlen_attn_gqa if native_gqa else varlen_attn


@pytest.mark.parametrize("native_gqa", [False, True])
@pytest.mark.parametrize(
    ("causal", "window", "window_size"),
    [(False, None, (-1, -1)), (True, None, (-1, 0)), (True, 3, (3, 0)), (False, (2, 1), (2, 1))],
)
def test_torch_varlen_arguments(monkeypatch, native_gqa, causal, window, window_size):
    calls = []
    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", fake_varlen_attn(calls, native_gqa))
    backend = TorchVarlenAttention()
    assert backend._native_gqa is native_gqa
    q, k, v, meta = batch(num_heads=8, num_kv_heads=2)
    meta.max_seqlen = 1  # below 2 is raised to 2: FlashAttention's one-token GQA shortcut needs real 1s
    out = varlen_attention(q, k, v, meta, backend=backend, causal=causal, window=window)
    expected_window = None if window_size in ((-1, -1), (-1, 0)) else window_size
    torch.testing.assert_close(
        out, reference(q, k, v, meta.cu_seqlens, causal, expected_window), atol=1e-5, rtol=1e-5
    )
    assert calls == [{"max": (2, 2), "window_size": window_size, "kv_heads": 2 if native_gqa else 8}]


def test_torch_varlen_needs_window_size(monkeypatch):
    def old_varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False):
        raise AssertionError("never called")

    monkeypatch.setattr(torch.nn.attention.varlen, "varlen_attn", old_varlen_attn)
    with pytest.raises(AttentionBackendUnavailable, match="no window_size"):
        TorchVarlenAttention()


def test_torch_varlen_check():
    backend = TorchVarlenAttention()
    backend.check(8, 2, 96, torch.bfloat16)
    with pytest.raises(AttentionBackendUnavailable, match="not float32"):
        backend.check(8, 2, 64, torch.float32)
    with pytest.raises(AttentionBackendUnavailable, match="not 12"):
        backend.check(8, 2, 12, torch.float16)


# ---- flash-attn glue --------------------------------------------------------------------------------


@pytest.fixture
def flash_attn_cute(monkeypatch):
    calls = []

    def flash_attn_varlen_func(
        q,
        k,
        v,
        qv=None,
        cu_seqlens_q=None,
        cu_seqlens_k=None,
        max_seqlen_q=None,
        max_seqlen_k=None,
        causal=False,
        window_size=(None, None),
        **rest,
    ):
        calls.append({"max": (max_seqlen_q, max_seqlen_k), "causal": causal, "window_size": window_size})
        left, right = (-1 if side is None else side for side in window_size)
        window = None if (left, right) == (-1, -1) else (left, 0 if causal else right)
        return reference(q, k, v, cu_seqlens_q, causal, window), None

    package = types.ModuleType("flash_attn")
    package.__path__ = []
    cute = types.ModuleType("flash_attn.cute")
    cute.flash_attn_varlen_func = flash_attn_varlen_func
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    monkeypatch.setitem(sys.modules, "flash_attn.cute", cute)
    return calls


@pytest.mark.parametrize(
    ("causal", "window", "window_size"),
    [(False, None, (None, None)), (True, None, (None, None)), (True, 3, (3, 0)), (False, 2, (2, None))],
)
def test_flash_attn_arguments(flash_attn_cute, causal, window, window_size):
    backend = FlashAttnAttention((9, 0))
    q, k, v, meta = batch(num_heads=8, num_kv_heads=2)
    out = varlen_attention(q, k, v, meta, backend=backend, causal=causal, window=window)
    left, right = (-1 if side is None else side for side in window_size)
    expected_window = None if (left, right) == (-1, -1) else (left, right)
    torch.testing.assert_close(
        out, reference(q, k, v, meta.cu_seqlens, causal, expected_window), atol=1e-5, rtol=1e-5
    )
    assert flash_attn_cute == [{"max": (7, 7), "causal": causal, "window_size": window_size}]


def test_flash_attn_head_dims_by_architecture(flash_attn_cute):
    FlashAttnAttention((9, 0)).check(8, 2, 256, torch.bfloat16)
    FlashAttnAttention((10, 0)).check(8, 2, 256, torch.bfloat16)
    with pytest.raises(AttentionBackendUnavailable, match="not 192"):
        FlashAttnAttention((10, 0)).check(8, 2, 192, torch.bfloat16)


def test_flash_attn_unavailable_when_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn.cute", None)
    with pytest.raises(AttentionBackendUnavailable, match="flash_attn.cute"):
        FlashAttnAttention((9, 0))


def test_a_head_size_runs_only_where_every_length_runs():
    # Qwen2-VL-2B's vision heads of 80 beside a decoder on Triton: Triton's kernel takes 80, but hands an
    # image's long sequence to FlashInfer, which has no 80 (the vision tower then takes torch's)
    from engine.attention.triton_backend import TritonAttention

    class NoEighty(TorchVarlenAttention):
        head_dims = frozenset({64, 128, 256})

    triton = TritonAttention(kernel=None, long_sequences=(NoEighty,))
    triton.check(num_heads=12, num_kv_heads=2, head_dim=128, dtype=torch.bfloat16)
    assert triton.long_sequences is not None
    assert triton.runs_head_dim(64) and not triton.runs_head_dim(80)
    alone = TritonAttention(kernel=None, long_sequences=())
    alone.check(num_heads=12, num_kv_heads=2, head_dim=128, dtype=torch.bfloat16)
    assert alone.runs_head_dim(80) and not alone.runs_head_dim(72)
