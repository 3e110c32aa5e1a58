"""LinearActivation against act(linear(x)): the plain ops on CPU; on CUDA the cuBLASLt epilogue, exact
for the tanh GELUs and ReLU, and for BERT's erf GELU in bf16 no further from the float32 erf result
than the unfused bf16 ops are."""

import pytest
import torch
import torch.nn.functional as F

from engine.layers.linear_act import LinearActivation


def make(activation, dtype, device, in_features=768, out_features=3072, rows=200):
    generator = torch.Generator().manual_seed(7)
    layer = LinearActivation(in_features, out_features, activation)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(out_features, in_features, generator=generator) * 0.03)
        layer.bias.copy_(torch.randn(out_features, generator=generator) * 0.5)
    x = torch.randn(rows, in_features, generator=generator)
    return layer.to(device, dtype), x.to(device, dtype)


def relative_error(got, want):
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


REFERENCE = {
    "gelu": lambda y: F.gelu(y),
    "gelu_new": lambda y: F.gelu(y, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}


@pytest.mark.parametrize("activation", sorted(REFERENCE))
def test_cpu_runs_the_plain_ops(activation):
    layer, x = make(activation, torch.float32, "cpu")
    assert not layer.fused(x)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), REFERENCE[activation](F.linear(x, layer.weight, layer.bias)))


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [1, 128, 4096])
@pytest.mark.parametrize("activation", ["gelu_new", "relu"])
def test_exact_epilogues_match_the_plain_ops(activation, rows):
    layer, x = make(activation, torch.bfloat16, "cuda", rows=rows)
    assert layer.fused(x)
    with torch.no_grad():
        fused = layer(x)
        want = REFERENCE[activation](F.linear(x.float(), layer.weight.float(), layer.bias.float()))
    assert fused.dtype == torch.bfloat16 and torch.isfinite(fused).all()
    assert relative_error(fused, want) <= 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [128, 4096])
def test_erf_gelu_in_bf16_is_as_close_to_float32_as_the_unfused_ops(rows):
    layer, x = make("gelu", torch.bfloat16, "cuda", rows=rows)
    assert layer.fused(x)
    with torch.no_grad():
        fused = layer(x)
        unfused = F.gelu(F.linear(x, layer.weight, layer.bias))
        want = F.gelu(F.linear(x.double(), layer.weight.double(), layer.bias.double()))
    assert relative_error(fused, want) <= 1.1 * relative_error(unfused, want)
    assert (fused.double() - want).abs().max().item() <= 0.05


@pytest.mark.gpu
def test_float32_on_cuda_keeps_the_exact_erf_gelu():
    layer, x = make("gelu", torch.float32, "cuda")
    assert not layer.fused(x)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), F.gelu(F.linear(x, layer.weight, layer.bias)))
