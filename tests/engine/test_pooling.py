"""Pooling over packed segments: mean, CLS and last token on a hand-made batch, exact."""

import pytest
import torch

from engine.attention import AttentionMetadata
from engine.errors import UnsupportedModel
from engine.layers.pooling import Pooler

# three sequences of lengths 2, 1 and 3
HIDDEN = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0], [9.0, 10.0], [11.0, 0.0]])


@pytest.fixture
def meta():
    return AttentionMetadata.build(torch.tensor([0, 2, 3, 6], dtype=torch.int32), max_seqlen=3)


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        ("mean", [[2.0, 3.0], [5.0, 6.0], [9.0, 6.0]]),
        ("cls", [[1.0, 2.0], [5.0, 6.0], [7.0, 8.0]]),
        ("last", [[3.0, 4.0], [5.0, 6.0], [11.0, 0.0]]),
    ],
)
def test_pooling_methods(meta, method, expected):
    pooled = Pooler(method, normalize=False)(HIDDEN, meta)
    assert pooled.dtype == torch.float32
    torch.testing.assert_close(pooled, torch.tensor(expected))


def test_normalize_in_float32(meta):
    pooled = Pooler("mean", normalize=True)(HIDDEN.to(torch.bfloat16), meta)
    assert pooled.dtype == torch.float32
    torch.testing.assert_close(pooled.norm(dim=-1), torch.ones(3))
    expected = torch.nn.functional.normalize(torch.tensor([[2.0, 3.0], [5.0, 6.0], [9.0, 6.0]]), dim=-1)
    torch.testing.assert_close(pooled, expected)


def test_unknown_method():
    with pytest.raises(UnsupportedModel, match="unknown pooling method"):
        Pooler("max", normalize=False)


@pytest.mark.gpu
@pytest.mark.parametrize("hidden_size", [384, 768, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_mean_matches_the_torch_path(hidden_size, dtype):
    from engine.layers.pooling import _triton_kernel, mean_pool

    assert _triton_kernel() is not None, "Triton must be there on the GPU machine"
    generator = torch.Generator().manual_seed(hidden_size)
    # ragged lengths with zero-length slots (a CUDA graph's padding) among them
    lengths = [1, 0, 33, 512, 0, 7, 64, 65, 0]
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    hidden = torch.randn(sum(lengths), hidden_size, generator=generator).to(dtype)
    host_meta = AttentionMetadata.build(cu_seqlens, max_seqlen=512)
    expected = mean_pool(hidden, host_meta)  # the index_add path, on the CPU
    got = mean_pool(hidden.cuda(), host_meta.to("cuda"))
    assert got.dtype == torch.float32 and got.shape == (len(lengths), hidden_size)
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-5, atol=1e-5)
    assert (got[torch.tensor(lengths) == 0] == 0).all()


@pytest.mark.parametrize("method", ["mean", "cls", "last"])
def test_a_zero_length_slot_after_a_full_bucket_pools_without_reading_past_the_tokens(method):
    # a CUDA graph's layout when real sequences fill the token bucket exactly: the spare slot starts
    # (and ends) at num_tokens; the real rows are unchanged and nothing indexes past the last token
    full = AttentionMetadata.build(torch.tensor([0, 2, 3, 6, 6], dtype=torch.int32), max_seqlen=3)
    alone = AttentionMetadata.build(torch.tensor([0, 2, 3, 6], dtype=torch.int32), max_seqlen=3)
    pooled = Pooler(method, normalize=False)(HIDDEN, full)
    assert pooled.shape == (4, 2)
    torch.testing.assert_close(pooled[:3], Pooler(method, normalize=False)(HIDDEN, alone))
