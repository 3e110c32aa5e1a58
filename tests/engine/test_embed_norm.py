"""The fused embedding kernel against BERT's torch embeddings (gathers, sums, LayerNorm) in float32."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.embed_norm import embed_layer_norm


def tables(hidden, dtype, device, seed=0):
    generator = torch.Generator().manual_seed(seed)
    word, position, token_type = nn.Embedding(500, hidden), nn.Embedding(130, hidden), nn.Embedding(2, hidden)
    norm = nn.LayerNorm(hidden, eps=1e-12)
    with torch.no_grad():
        for module in (word, position, token_type):
            module.weight.copy_(torch.randn(module.weight.shape, generator=generator))
        norm.weight.copy_(torch.rand(hidden, generator=generator) + 0.5)
        norm.bias.copy_(torch.randn(hidden, generator=generator))
    return [module.to(device, dtype) for module in (word, position, token_type, norm)]


def plain(ids, positions, types, word, position, token_type, norm, offset):
    total = word.weight.float()[ids] + position.weight.float()[positions + offset]
    total = total + (token_type.weight.float()[types] if types is not None else token_type.weight.float()[0])
    return F.layer_norm(total, norm.normalized_shape, norm.weight.float(), norm.bias.float(), norm.eps)


def test_cpu_returns_none_so_the_torch_ops_run():
    word, position, token_type, norm = tables(32, torch.float32, "cpu")
    ids = torch.tensor([1, 2, 3])
    assert embed_layer_norm(ids, ids, ids, word, position, token_type, norm, 0) is None


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [384, 768, 1000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("with_types", "offset"), [(True, 0), (False, 2)])  # BERT; RoBERTa's pad offset
def test_triton_kernel_matches_torch(hidden, dtype, with_types, offset):
    word, position, token_type, norm = tables(hidden, dtype, "cuda", seed=hidden)
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 500, (300,), generator=generator).cuda()
    positions = torch.randint(0, 128, (300,), generator=generator).cuda()
    types = torch.randint(0, 2, (300,), generator=generator).cuda() if with_types else None
    with torch.no_grad():
        fused = embed_layer_norm(ids, positions, types, word, position, token_type, norm, offset)
        expected = plain(ids, positions, types, word, position, token_type, norm, offset)
    assert fused is not None and fused.dtype == dtype and fused.shape == (300, hidden)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert ((fused.float() - expected).norm() / expected.norm()).item() <= tolerance
