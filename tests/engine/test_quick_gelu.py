"""QuickGELU, x * sigmoid(1.702 x): the torch ops on CPU, the Triton kernel on CUDA (in float32, so within
bf16's rounding of the torch ops run in float32), as an activation by its config name."""

import pytest
import torch

from engine.layers.activations import get_activation
from engine.layers.quick_gelu import QuickGELU


def reference(x):
    x = x.float()
    return x * torch.sigmoid(1.702 * x)


def test_quick_gelu_is_named_by_clip_configs():
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0)) * 4
    activation = get_activation("quick_gelu")
    assert isinstance(activation, QuickGELU)
    assert torch.equal(activation(x), reference(x))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_matches_torch(dtype):
    from engine.layers.quick_gelu import _triton_kernel

    assert _triton_kernel() is not None, "Triton must be there on the GPU machine"
    x = (torch.randn(3001, 3072, generator=torch.Generator().manual_seed(1)) * 4).to("cuda", dtype)
    got = QuickGELU()(x)
    assert got.dtype == dtype and got.shape == x.shape
    expected = reference(x)
    tolerance = 1e-6 if dtype == torch.float32 else 4e-3
    assert ((got.float() - expected).norm() / expected.norm()).item() <= tolerance
