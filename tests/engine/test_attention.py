"""The torch attention backend vs a naive per-sequence softmax(QK^T / sqrt(d)) V; fp32, atol 1e-5."""

import math

import pytest
import torch

from engine.attention import AttentionMetadata, select_backend, varlen_attention
from engine.errors import AttentionBackendUnavailable

SEQLENS = [1, 5, 5, 7, 3, 3, 3, 12]


def naive_attention(
    q, k, v, seqlens, causal=False, window=(-1, -1), scale=None, by_offset=None, max_offset=0
):
    repeat = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    outputs, start = [], 0
    for seqlen in seqlens:
        sq, sk, sv = (x[start : start + seqlen].transpose(0, 1) for x in (q, k, v))
        scores = sq @ sk.transpose(1, 2) * (scale if scale is not None else 1 / math.sqrt(q.shape[-1]))
        query, key = torch.arange(seqlen)[:, None], torch.arange(seqlen)[None, :]
        if by_offset is not None:  # [heads, 2 * max_offset + 1], by key - query
            scores = scores + by_offset[:, (key - query).clamp(-max_offset, max_offset) + max_offset]
        allowed = torch.ones(seqlen, seqlen, dtype=torch.bool)
        left, right = window
        if causal:
            right = 0
        if left >= 0:
            allowed &= key >= query - left
        if right >= 0:
            allowed &= key <= query + right
        scores = scores.masked_fill(~allowed, float("-inf"))
        outputs.append((scores.softmax(-1) @ sv).transpose(0, 1))
        start += seqlen
    return torch.cat(outputs)


@pytest.fixture
def meta():
    cu_seqlens = torch.tensor([0, *torch.tensor(SEQLENS).cumsum(0).tolist()], dtype=torch.int32)
    return AttentionMetadata.build(cu_seqlens, max(SEQLENS))


def random_qkv(num_heads=4, num_kv_heads=4, head_dim=16):
    generator = torch.Generator().manual_seed(0)
    num_tokens = sum(SEQLENS)
    q = torch.randn(num_tokens, num_heads, head_dim, generator=generator)
    k = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)
    v = torch.randn(num_tokens, num_kv_heads, head_dim, generator=generator)
    return q, k, v


def test_metadata_groups_runs_of_equal_lengths(meta):
    assert meta.seqlens == tuple(SEQLENS)
    assert meta.runs == ((0, 1, 1), (1, 2, 5), (11, 1, 7), (18, 3, 3), (27, 1, 12))
    assert meta.segment_ids.tolist() == [i for i, n in enumerate(SEQLENS) for _ in range(n)]


@pytest.mark.parametrize(
    ("causal", "window", "naive_window"),
    [
        (False, None, (-1, -1)),
        (True, None, (-1, -1)),
        (True, 2, (2, 0)),
        (False, (2, 1), (2, 1)),
        (False, 3, (3, -1)),
    ],
)
def test_torch_backend_matches_naive(meta, causal, window, naive_window):
    q, k, v = random_qkv()
    backend = select_backend("torch", "cpu")
    out = varlen_attention(q, k, v, meta, backend=backend, causal=causal, window=window)
    expected = naive_attention(q, k, v, SEQLENS, causal=causal, window=naive_window)
    assert out.shape == q.shape
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("causal", "window"), [(False, None), (True, None), (False, (2, 1))])
def test_torch_backend_adds_the_position_bias(meta, causal, window):
    from engine.attention.position_bias import PositionBias

    q, k, v = random_qkv()
    by_offset = torch.randn(4, 7, generator=torch.Generator().manual_seed(2)) * 2.0  # clamped past 3
    bias = PositionBias(by_offset, max_offset=3)
    backend = select_backend("torch", "cpu", position_bias=True)
    out = varlen_attention(q, k, v, meta, backend=backend, causal=causal, window=window, bias=bias)
    naive_window = window or (-1, -1)
    expected = naive_attention(q, k, v, SEQLENS, causal, naive_window, by_offset=by_offset, max_offset=3)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, naive_attention(q, k, v, SEQLENS, causal, naive_window), atol=1e-3)


@pytest.mark.parametrize("causal", [False, True])
def test_a_softmax_scale_replaces_one_over_sqrt_head_dim(meta, causal):
    """Gemma3's query_pre_attn_scalar ** -0.5, here not 1 / sqrt(head_dim); with a two-sided window."""
    q, k, v = random_qkv(num_heads=4, num_kv_heads=1)
    out = varlen_attention(
        q, k, v, meta, backend=select_backend("torch", "cpu"), causal=causal, window=(2, 2), scale=0.4
    )
    expected = naive_attention(q, k, v, SEQLENS, causal=causal, window=(2, 2), scale=0.4)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    default = naive_attention(q, k, v, SEQLENS, causal=causal, window=(2, 2))
    assert (out - default).abs().max().item() > 1e-2


def test_grouped_query_attention(meta):
    q, k, v = random_qkv(num_heads=8, num_kv_heads=2)
    out = varlen_attention(q, k, v, meta, backend=select_backend("torch", "cpu"), causal=True)
    torch.testing.assert_close(out, naive_attention(q, k, v, SEQLENS, causal=True), atol=1e-5, rtol=1e-5)


def test_strided_views_of_a_fused_qkv(meta):
    qkv = torch.randn(sum(SEQLENS), 3, 4, 16, generator=torch.Generator().manual_seed(1))
    q, k, v = qkv.unbind(1)
    out = varlen_attention(q, k, v, meta, backend=select_backend("auto", "cpu"))
    torch.testing.assert_close(out, naive_attention(q, k, v, SEQLENS), atol=1e-5, rtol=1e-5)


def test_backend_selection():
    assert select_backend("auto", "cpu").name == "torch"
    assert select_backend("torch", torch.device("cpu")).name == "torch"
    with pytest.raises(AttentionBackendUnavailable, match="unknown attention backend"):
        select_backend("no-such-backend", "cpu")
    assert issubclass(AttentionBackendUnavailable, ValueError)
