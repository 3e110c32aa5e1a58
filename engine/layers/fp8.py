"""FP8 (W8A8) linear layers, opt-in (--quantization fp8): each weight quantized once at load to
float8_e4m3fn with a scale per output channel, each input row quantized with a scale of its own (per
token), and one scaled GEMM (torch._scaled_mm) that applies both scales and the bias in its epilogue.

A producer of the input may hand over rows it has quantized itself (Fp8Rows: a norm that writes them in
the pass that normalizes); any other input is quantized here first. The backbone's projections (attention
and MLP) are converted; embeddings, norms, attention itself and the heads stay in the model dtype."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.errors import QuantizationUnavailable
from engine.layers.linear_act import LinearActivation

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
MIN_SCALE = 1e-12  # a row of zeros keeps a finite scale
# the compute capability whose tensor cores take FP8 (Ada, Hopper and later)
MIN_CAPABILITY = (8, 9)
# what scaled GEMMs take on CUDA: inner and output sizes divisible by 16
ALIGNMENT = 16


@dataclass(frozen=True, slots=True)
class Fp8Rows:
    """Rows quantized to FP8, each with its scale: row i stands for values[i] * scales[i]."""

    values: torch.Tensor  # [num_rows, features] float8_e4m3fn
    scales: torch.Tensor  # [num_rows, 1] float32
    dtype: torch.dtype  # the dtype the rows stand for, which the GEMM gives back

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


def quantize_rows(x: torch.Tensor) -> Fp8Rows:
    """[num_rows, features] -> Fp8Rows, each row scaled so its largest magnitude is FP8_MAX."""
    scales = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=MIN_SCALE)
    values = (x.float() / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return Fp8Rows(values, scales, x.dtype)


class Fp8Linear(nn.Module):
    """An nn.Linear (or LinearActivation) whose weight is FP8 with a float32 scale per output channel;
    the bias and the output stay in the model dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
        # [out, in] row-major: its transpose is the column-major operand the scaled GEMM takes
        self.register_buffer("weight", (weight / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8))
        self.register_buffer("weight_scales", scales.t().contiguous())  # [1, out] float32
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.act = linear.act if isinstance(linear, LinearActivation) else None
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor:
        # [num_tokens, in_features] (or its Fp8Rows) -> [num_tokens, out_features] in the model dtype
        rows = x if isinstance(x, Fp8Rows) else quantize_rows(x)
        out = torch._scaled_mm(
            rows.values,
            self.weight.t(),
            scale_a=rows.scales,
            scale_b=self.weight_scales,
            bias=self.bias,
            out_dtype=rows.dtype,
        )
        return out if self.act is None else self.act(out)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, fp8 (per channel, per token)"
        )


def quantize_linears(module: nn.Module, names: tuple[str, ...]) -> int:
    """Replace every nn.Linear under `module` whose attribute name is one of `names` by an Fp8Linear;
    how many were replaced. Layers whose sizes a scaled GEMM does not take stay as they are."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if name in names and isinstance(child, nn.Linear) and aligned(child):
                setattr(parent, name, Fp8Linear(child))
                replaced += 1
    return replaced


def aligned(linear: nn.Linear) -> bool:
    return linear.in_features % ALIGNMENT == 0 and linear.out_features % ALIGNMENT == 0


def check_fp8(device: torch.device) -> None:
    """FP8 GEMMs need a GPU with FP8 tensor cores (compute capability 8.9 or later); on the CPU they are
    emulated (slow: for checking accuracy, not for serving)."""
    if device.type != "cuda":
        return
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        name = torch.cuda.get_device_name(device)
        raise QuantizationUnavailable(
            f"--quantization fp8 needs a GPU of compute capability {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} "
            f"or later (Ada, Hopper, Blackwell); {name} is {capability[0]}.{capability[1]}"
        )
