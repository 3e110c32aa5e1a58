"""AddLayerNorm against LayerNorm(x + residual): the torch path on CPU, the Triton kernel on CUDA."""

import pytest
import torch
import torch.nn.functional as F

from engine.layers.add_norm import AddLayerNorm


def plain(norm, x, residual):
    return F.layer_norm(
        (x.float() + residual.float()),
        norm.normalized_shape,
        norm.weight.float(),
        norm.bias.float(),
        norm.eps,
    )


def make(hidden, dtype, device):
    generator = torch.Generator().manual_seed(hidden)
    norm = AddLayerNorm(hidden, eps=1e-12)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(hidden, generator=generator))
        norm.bias.copy_(torch.randn(hidden, generator=generator))
    x = torch.randn(37, hidden, generator=generator) * 3
    residual = torch.randn(37, hidden, generator=generator)
    return norm.to(device, dtype), x.to(device, dtype), residual.to(device, dtype)


def test_cpu_path_is_layer_norm_of_the_sum():
    norm, x, residual = make(384, torch.float32, "cpu")
    torch.testing.assert_close(norm(x, residual), plain(norm, x, residual))


@pytest.mark.gpu
@pytest.mark.parametrize("hidden", [32, 384, 768, 1000, 1024, 4096])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_matches_torch(hidden, dtype):
    from engine.layers.add_norm import _triton_kernel

    assert _triton_kernel() is not None, "Triton must be there on the GPU machine"
    norm, x, residual = make(hidden, dtype, "cuda")
    with torch.no_grad():
        fused = norm(x, residual).float()
    expected = plain(norm, x, residual)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert ((fused - expected).norm() / expected.norm()).item() <= tolerance


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_pre_norm_gives_the_norm_and_the_rounded_sum(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    norm, x, residual = make(768, dtype, device)
    with torch.no_grad():
        normed, total = norm.with_total(x, residual)
        first, same = norm.with_total(x, None)  # the first block: no residual yet
    assert torch.equal(total, x + residual) and same is x
    expected = F.layer_norm(x + residual, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert ((normed.float() - expected.float()).norm() / expected.float().norm()).item() <= tolerance
    plain_first = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    assert torch.equal(first, plain_first)
