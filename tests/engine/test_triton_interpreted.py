"""posy's Triton kernels on the CPU through Triton's interpreter (TRITON_INTERPRET=1), in float32,
against their torch versions: the masks, segments, windows, padding and launch code of every kernel
are checked in CI, where there is no GPU. The compiled kernels have their GPU tests beside these."""

import math
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata, normalize_window
from engine.attention import triton_backend as attention_module
from engine.attention.torch_backend import TorchAttention
from engine.layers import add_norm, embed_norm, fp8, pooling, rms_norm, swiglu
from engine.layers import qk_norm_rotary as qk_norm_rotary_module
from engine.layers import quick_gelu as quick_gelu_module
from engine.layers.fp8 import quantize_rows
from engine.layers.qk_norm_rotary import QKNormRotary, qk_norm_rotary
from engine.layers.quick_gelu import quick_gelu
from engine.layers.rotary import rotary_tables


@pytest.fixture
def interpreted():
    """Skips unless Triton's interpreter is on (tests/conftest.py turns it on where there is no GPU)."""
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("with a GPU the compiled kernels run in the GPU tests")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton was imported before tests/conftest.py could turn its interpreter on")


def relative_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


@pytest.mark.parametrize("hidden", [32, 96, 384])
def test_add_layer_norm(interpreted, hidden):
    generator = torch.Generator().manual_seed(hidden)
    norm = nn.LayerNorm(hidden, eps=1e-12)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=generator))
        norm.bias.copy_(torch.randn(hidden, generator=generator))
    x, residual = torch.randn(2, 37, hidden, generator=generator)
    kernel = add_norm._triton_kernel()
    got, same, none = add_norm.add_layer_norm(kernel, x, residual, norm.weight, norm.bias, norm.eps)
    expected = F.layer_norm(x + residual, (hidden,), norm.weight, norm.bias, norm.eps)
    assert relative_error(got.detach(), expected.detach()) <= 1e-5 and same is got and none is None
    # with the next projection in FP8: the same rows, and their Fp8Rows from the same pass
    weight, bias, eps = norm.weight, norm.bias, norm.eps
    got, rows, _ = add_norm.add_layer_norm(kernel, x, residual, weight, bias, eps, quantize=True)
    assert relative_error(got.detach(), expected.detach()) <= 1e-5
    assert_quantized_like_torch(rows, got)
    # a pre-norm block's: the sum written too, the norm of that sum
    got, _, total = add_norm.add_layer_norm(kernel, x, residual, weight, bias, eps, total=True)
    assert torch.equal(total, x + residual)
    assert relative_error(got.detach(), expected.detach()) <= 1e-5


def test_quick_gelu(interpreted):
    x = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0)) * 4
    got = quick_gelu(x, quick_gelu_module._triton_kernel())
    assert relative_error(got, x * torch.sigmoid(1.702 * x)) <= 1e-6


def assert_quantized_like_torch(rows, x):
    """A kernel's Fp8Rows against quantize_rows of the same rows: the same scales and values (rounded to
    nearest even, as torch rounds), but where Triton 3.x's interpreter rounds wrongly (its own bugs, not
    the GPU's): it drops the carry of a mantissa that rounds up into the next power of two (127.9 -> 64,
    not 128), in subnormals too (below 2^-6), which it also truncates to the step below."""
    expected = quantize_rows(x)
    assert rows.dtype == x.dtype and rows.values.dtype == torch.float8_e4m3fn
    assert torch.equal(rows.scales, expected.scales)
    got, want = rows.values.float(), expected.values.float()
    power_of_two = (expected.values.view(torch.uint8) & 0b111) == 0  # e4m3: 3 mantissa bits
    subnormal_slip = (want.abs() <= 2**-6) & ((got - want).abs() <= torch.clamp(want.abs() / 2, min=2**-9))
    misrounded = (power_of_two & (got * 2 == want)) | subnormal_slip
    assert torch.equal(got[~misrounded], want[~misrounded])
    assert misrounded.float().mean() < 0.05


@pytest.mark.parametrize("width", [96, 200])
def test_row_quantization(interpreted, width):
    x = torch.randn(31, width, generator=torch.Generator().manual_seed(width)) * 3
    x[4] = 0  # a row of zeros keeps a finite scale
    rows = fp8.quantize_by_kernel(fp8._quantize_kernel(), x)
    assert rows.scales[4].item() == pytest.approx(fp8.MIN_SCALE) and not rows.values[4].float().any()
    others = torch.arange(31) != 4  # zeros would count as the interpreter's dropped carries
    assert_quantized_like_torch(fp8.Fp8Rows(rows.values[others], rows.scales[others], rows.dtype), x[others])


@pytest.mark.parametrize(("with_types", "offset"), [(True, 0), (False, 2), (None, 0)])
def test_embed_layer_norm(interpreted, with_types, offset):
    """with_types None: a model without a type table (DistilBERT)."""
    generator = torch.Generator().manual_seed(offset)
    word, position = nn.Embedding(50, 96), nn.Embedding(40, 96)
    token_type = nn.Embedding(2, 96) if with_types is not None else None
    norm = nn.LayerNorm(96, eps=1e-12)
    ids = torch.randint(0, 50, (30,), generator=generator)
    positions = torch.randint(0, 30, (30,), generator=generator)
    types = torch.randint(0, 2, (30,), generator=generator) if with_types else None
    with torch.no_grad():
        tables = (word, position, token_type, norm)
        got = embed_norm.embed_layer_norm(ids, positions, types, *tables, offset, embed_norm._triton_kernel())
        total = word(ids) + position(positions + offset)
        if token_type is not None:
            total = total + (token_type(types) if with_types else token_type.weight[0])
        expected = norm(total)
    assert got is not None and relative_error(got, expected) <= 1e-5


def test_segment_mean_with_empty_slots(interpreted):
    lengths = [1, 0, 33, 70, 0, 7]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    hidden = torch.randn(sum(lengths), 200, generator=torch.Generator().manual_seed(0))
    meta = AttentionMetadata.build(cu_seqlens, max_seqlen=70)
    got = pooling.segment_mean(pooling._triton_kernel(), hidden, cu_seqlens, len(lengths))
    torch.testing.assert_close(got, pooling.mean_pool(hidden, meta), rtol=1e-5, atol=1e-6)
    assert (got[torch.tensor(lengths) == 0] == 0).all()


def packed_attention():
    return attention_module.TritonAttention(attention_module._triton_kernel(), long_sequences=())


def random_qkv(num_tokens, num_heads, num_kv_heads, head_dim, seed):
    """q, and k and v side by side in one tensor (take strided views of it)."""
    generator = torch.Generator().manual_seed(seed)
    heads = (num_heads, 2 * num_kv_heads)
    return (torch.randn(num_tokens, count, head_dim, generator=generator) for count in heads)


CASES = [
    # (lengths, query heads, key/value heads, head dim, causal, window)
    ([5, 1, 17, 9, 64, 3], 4, 4, 32, False, None),  # every sequence <= 64 tokens: 16-row tiles
    ([5, 1, 17, 0, 9, 64, 3, 0], 4, 2, 32, True, None),  # and empty slots, as a graph's
    ([50, 64, 41, 60, 33], 4, 4, 32, False, None),  # 30 or more on average: one program a sequence
    ([50, 64, 0, 60, 58, 7, 64], 4, 2, 64, True, None),
    ([50, 64, 0, 60, 58], 2, 1, 128, False, (8, 4)),
    ([100, 1, 30, 128, 2], 4, 2, 64, False, None),  # longer ones: 64-row tiles spanning sequences
    ([100, 1, 30, 128, 2], 4, 1, 48, True, None),  # head dim 48 pads to 64 with a mask
    ([90, 40, 7], 2, 2, 32, True, 16),
    ([90, 40, 7], 2, 2, 32, False, (8, 4)),
    ([90, 40, 7], 3, 1, 256, False, (16, 16)),  # EmbeddingGemma's heads and its two-sided window
]


@pytest.mark.parametrize(("lengths", "num_heads", "num_kv_heads", "head_dim", "causal", "window"), CASES)
def test_packed_attention_matches_the_reference(
    interpreted, lengths, num_heads, num_kv_heads, head_dim, causal, window
):
    q, kv = random_qkv(sum(lengths), num_heads, num_kv_heads, head_dim, seed=len(lengths) + head_dim)
    k, v = kv[:, :num_kv_heads], kv[:, num_kv_heads:]  # strided views, as a fused projection gives them
    meta = AttentionMetadata.build(
        torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32), max(lengths)
    )
    normalized = normalize_window(window, causal)
    got = packed_attention().forward(q, k, v, meta, causal, normalized)
    expected = TorchAttention().forward(q, k, v, meta, causal, normalized)
    assert torch.isfinite(got).all()
    start = 0
    for length in lengths:
        end = start + length
        if length:
            assert relative_error(got[start:end], expected[start:end]) <= 1e-4, (length, start)
        start = end


@pytest.mark.parametrize(
    ("lengths", "causal", "window"),
    [
        ([5, 1, 60, 9, 40], False, None),
        ([60, 45, 50], False, None),
        ([5, 1, 70, 9, 40], False, None),
        ([150, 3, 90], False, None),
        ([90, 40, 7], True, 16),
    ],
)
def test_packed_attention_adds_the_position_bias(interpreted, lengths, causal, window):
    """MPNet's bias by offset, clamped past max_offset (8 here, so that long sequences reach the clamp),
    one program a sequence and in 16- and 64-row tiles that span sequences; the torch backend's bias is
    checked in test_attention."""
    from engine.attention.position_bias import PositionBias

    q, kv = random_qkv(sum(lengths), 3, 3, 32, seed=sum(lengths))
    k, v = kv[:, :3], kv[:, 3:]
    meta = AttentionMetadata.build(
        torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32), max(lengths)
    )
    bias = PositionBias(torch.randn(3, 17, generator=torch.Generator().manual_seed(5)) * 3.0, max_offset=8)
    normalized = normalize_window(window, causal)
    got = packed_attention().forward(q, k, v, meta, causal, normalized, bias=bias)
    expected = TorchAttention().forward(q, k, v, meta, causal, normalized, bias=bias)
    unbiased = TorchAttention().forward(q, k, v, meta, causal, normalized)
    assert relative_error(got, expected) <= 1e-4
    assert relative_error(unbiased, expected) > 1e-2


def test_packed_attention_takes_a_softmax_scale(interpreted):
    """Gemma3's query_pre_attn_scalar ** -0.5 in place of 1 / sqrt(head_dim)."""
    lengths = [30, 5, 17]
    q, kv = random_qkv(sum(lengths), 4, 2, 32, seed=11)
    k, v = kv[:, :2], kv[:, 2:]
    meta = AttentionMetadata.build(
        torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32), max(lengths)
    )
    got = packed_attention().forward(q, k, v, meta, True, (8, 0), 0.3)
    expected = TorchAttention().forward(q, k, v, meta, True, (8, 0), 0.3)
    assert relative_error(got, expected) <= 1e-4


def test_packed_attention_with_empty_slots_and_an_upper_bound(interpreted):
    """As a CUDA graph runs it: zero-length slots in cu_seqlens, max_seqlen only an upper bound."""
    lengths = [20, 0, 44, 0, 0, 9]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    exact = AttentionMetadata.build(cu_seqlens, max(lengths))
    bounded = AttentionMetadata(
        cu_seqlens=cu_seqlens,
        max_seqlen=64,
        seqlens=(0,) * len(lengths),
        runs=(),
        segment_ids=exact.segment_ids,
        lengths=torch.zeros(len(lengths), dtype=torch.int64),
    )
    q, kv = random_qkv(sum(lengths), 2, 2, 32, seed=9)
    k, v = kv[:, :2], kv[:, 2:]
    got = packed_attention().forward(q, k, v, bounded, False, None)
    expected = TorchAttention().forward(q, k, v, exact, False, None)
    assert relative_error(got, expected) <= 1e-4


def test_the_tile_follows_the_length_bucket_and_the_mean_length():
    one_program_a_sequence = attention_module.PER_SEQUENCE_TILES
    assert one_program_a_sequence[0] >= attention_module.PER_SEQUENCE_SEQLEN  # its queries in one tile
    tile = attention_module.tile_config
    assert tile(64, 64, 16384, 328) == one_program_a_sequence  # 50 tokens on average
    assert tile(128, 64, 16384, 328) == one_program_a_sequence
    assert tile(64, 64, 16384, 832) == (16, 32, 1, 2, False)  # 20 tokens on average
    assert tile(128, 64, 16384, 832) == (64, 32, 4, 2, False)
    assert tile(64, 128, 16384, 128) == (64, 32, 4, 2, False)  # a sequence may be longer than a tile
    assert math.isclose(attention_module.LOG2_E, 1 / math.log(2))


@pytest.mark.parametrize("hidden", [24, 96, 384])
@pytest.mark.parametrize("with_residual", [True, False])
@pytest.mark.parametrize("offset", [False, True])
def test_add_rms_norm(interpreted, hidden, with_residual, offset):
    """offset: Gemma3's 1 + weight."""
    generator = torch.Generator().manual_seed(hidden)
    x, residual = torch.randn(2, 37, hidden, generator=generator)
    weight = torch.rand(hidden, generator=generator) + (-0.5 if offset else 0.5)
    got, total = rms_norm.add_rms_norm(
        rms_norm._triton_kernel(), x, residual if with_residual else None, weight, 1e-6, offset
    )
    expected_total = x + residual if with_residual else x
    assert torch.equal(total, expected_total)
    assert relative_error(got, rms_norm.rms_norm(expected_total, weight, 1e-6, offset)) <= 1e-5
    # feeding an FP8 projection: the same rows as its Fp8Rows instead, and the same sum
    rows, total = rms_norm.add_rms_norm(
        rms_norm._triton_kernel(), x, residual if with_residual else None, weight, 1e-6, offset, quantize=True
    )
    assert torch.equal(total, expected_total)
    assert_quantized_like_torch(rows, got)


@pytest.mark.parametrize(("qk_norm", "norm_offset"), [(True, False), (False, False), (True, True)])
@pytest.mark.parametrize(
    ("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 24), (2, 2, 64), (8, 1, 32), (3, 3, 80)]
)
def test_qk_norm_rotary_in_place(interpreted, num_heads, num_kv_heads, head_dim, qk_norm, norm_offset):
    """qk_norm False: rotary alone (Qwen2, Llama, Mistral, and with heads of 80 and as many keys as
    queries, Qwen2-VL's vision tower); norm_offset: Gemma3's 1 + weight."""
    generator = torch.Generator().manual_seed(head_dim)
    layer = QKNormRotary(num_heads, num_kv_heads, head_dim, 1e-6, qk_norm, norm_offset)
    if qk_norm:
        with torch.no_grad():
            layer.q_norm.weight.copy_(torch.rand(head_dim, generator=generator) + 0.5)
            layer.k_norm.weight.copy_(torch.rand(head_dim, generator=generator) + 0.5)
    qkv = torch.randn(29, (num_heads + 2 * num_kv_heads) * head_dim, generator=generator)
    positions = torch.cat([torch.arange(20), torch.arange(9)])  # two packed sequences
    cos, sin = rotary_tables(positions, head_dim, 1_000_000.0, torch.float32)
    with torch.no_grad():
        expected = [tensor.clone() for tensor in layer(qkv, cos, sin)]  # the torch ops on the CPU
        fused = qkv.clone()
        qk_norm_rotary(qk_norm_rotary_module._triton_kernel(), fused, cos, sin, layer)
    for got, want in zip(layer.split(fused), expected):
        assert relative_error(got, want) <= 1e-5
    assert torch.equal(layer.split(fused)[2], layer.split(qkv)[2])  # values untouched


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("intermediate", [96, 1100])
def test_a_gated_product_feeding_an_fp8_projection_comes_quantized(interpreted, intermediate, activation):
    gate_up = torch.randn(13, 2 * intermediate, generator=torch.Generator().manual_seed(intermediate))
    kernel = swiglu._triton_kernel()
    product = swiglu.gated(gate_up, activation, kernel=kernel)
    assert_quantized_like_torch(swiglu.gated(gate_up, activation, kernel=kernel, quantize=True), product)
    unfused = swiglu.gated(gate_up, activation, quantize=True)  # the torch ops
    assert (
        torch.equal(unfused.scales, quantize_rows(product).scales)
        or relative_error(unfused.scales, quantize_rows(product).scales) < 1e-6
    )


@pytest.mark.parametrize("activation", ["gelu", "gelu_new"])
def test_a_gelu_feeding_an_fp8_projection_comes_quantized(interpreted, activation):
    """BERT's up projection: its GELU (the tanh form, for BERT's erf "gelu" too, as the bf16 path's epilogue)
    and the down projection's quantization in one pass; against torch's tanh GELU then quantize_rows: scales
    within 1e-6, values within a step of e4m3."""
    x = torch.randn(11, 1536, generator=torch.Generator().manual_seed(3)) * 3
    rows = fp8.activate_and_quantize(fp8._activation_kernel(), x, activation)
    expected = quantize_rows(F.gelu(x, approximate="tanh"))
    assert relative_error(rows.scales, expected.scales) < 1e-6
    got, want = rows.values.float() * rows.scales, expected.values.float() * expected.scales
    # a value may land a step of e4m3 apart (1/8 relative), or twice the step where the interpreter
    # drops a carry (see assert_quantized_like_torch)
    assert ((got - want).abs() <= want.abs() / 2 + expected.scales * 2**-8).all()
    assert ((got - want).abs() <= want.abs() / 8 + expected.scales * 2**-8).float().mean() > 0.95


@pytest.mark.parametrize("intermediate", [96, 1100])
def test_silu_and_mul(interpreted, intermediate):
    gate_up = torch.randn(13, 2 * intermediate, generator=torch.Generator().manual_seed(intermediate))
    got = swiglu.silu_and_mul(gate_up, kernel=swiglu._triton_kernel())
    gate, up = gate_up.chunk(2, dim=-1)
    assert relative_error(got, F.silu(gate) * up) <= 1e-5


@pytest.mark.parametrize("intermediate", [96, 1152])
def test_gelu_tanh_and_mul(interpreted, intermediate):
    """Gemma3's gate: GELU with the tanh approximation, as F.gelu(approximate="tanh")."""
    gate_up = 3 * torch.randn(13, 2 * intermediate, generator=torch.Generator().manual_seed(intermediate))
    got = swiglu.gated(gate_up, "gelu_tanh", kernel=swiglu._triton_kernel())
    gate, up = gate_up.chunk(2, dim=-1)
    assert relative_error(got, F.gelu(gate, approximate="tanh") * up) <= 1e-5
