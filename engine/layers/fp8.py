"""FP8 (W8A8) linear layers, opt-in (--quantization fp8): each weight quantized once at load to
float8_e4m3fn with a scale per output channel, each input row quantized with a scale of its own (per
token), and one scaled GEMM (torch._scaled_mm) that applies both scales and the bias in its epilogue.

A producer of the input may hand over rows it has quantized itself (Fp8Rows: a norm that writes them in
the pass that normalizes); any other input is quantized here first. The backbone's projections (attention
and MLP) are converted; embeddings, norms, attention itself and the heads stay in the model dtype.

Each projection keeps its model-dtype layer too, for inputs of fewer rows than `min_rows`: on the GPU
engine/layers/fp8_choice.py measures at start-up from how many rows its FP8 GEMM (with its input's
quantization) beats the model dtype's (a batch of one never does)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.errors import QuantizationUnavailable
from engine.layers.triton_kernel import triton_kernel

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value
MIN_SCALE = 1e-12  # a row of zeros keeps a finite scale
# the compute capability whose tensor cores take FP8 (Ada, Hopper and later)
MIN_CAPABILITY = (8, 9)
# what scaled GEMMs take on CUDA: inner and output sizes divisible by 16
ALIGNMENT = 16
NEVER = float("inf")  # a min_rows (or quantize_from) no input reaches


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
    """[num_rows, features] -> Fp8Rows, each row scaled so its largest magnitude is FP8_MAX: one Triton
    kernel on CUDA (a row a program: one read, one write; torch's six passes took 3.6 of a BERT-base step's
    9.9 ms at 16k tokens on the H200), torch's ops elsewhere (torch_quantize_rows, which defines it)."""
    kernel = _quantize_kernel() if x.is_cuda else None
    if kernel is None or x.dim() != 2 or x.shape[-1] > MAX_FUSED_COLUMNS:
        return torch_quantize_rows(x)
    return quantize_by_kernel(kernel, x)


def torch_quantize_rows(x: torch.Tensor) -> Fp8Rows:
    """quantize_rows by torch's ops: the definition the kernels are held to."""
    scales = (x.abs().amax(dim=-1, keepdim=True).float() / FP8_MAX).clamp(min=MIN_SCALE)
    values = (x.float() / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return Fp8Rows(values, scales, x.dtype)


def quantize_by_kernel(kernel, x: torch.Tensor) -> Fp8Rows:
    """quantize_rows by the Triton kernel, on the device x is on (the interpreter's CPU in the tests)."""
    x = x.contiguous()
    num_rows, width = x.shape
    values = torch.empty(num_rows, width, dtype=FP8, device=x.device)
    scales = torch.empty(num_rows, 1, dtype=torch.float32, device=x.device)
    block = 1 << (width - 1).bit_length()
    kernel[(num_rows,)](x, values, scales, width, BLOCK=block, num_warps=row_warps(block))
    return Fp8Rows(values, scales, x.dtype)


class Fp8Linear(nn.Module):
    """An nn.Linear (or LinearActivation) whose weight is FP8 with a float32 scale per output channel;
    the bias and the output stay in the model dtype. Inputs of fewer than `min_rows` rows (0 by default)
    run through `linear`, the layer it was made from."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear
        self.min_rows: float = 0
        weight = linear.weight.detach().float()
        scales = (weight.abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp(min=MIN_SCALE)
        # [out, in] row-major: its transpose is the column-major operand the scaled GEMM takes
        self.register_buffer("weight", (weight / scales).clamp(-FP8_MAX, FP8_MAX).to(FP8))
        self.register_buffer("weight_scales", scales.t().contiguous())  # [1, out] float32
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach(), requires_grad=False)
        # a LinearActivation's activation (its name: the fused kernel's), applied after the GEMM
        self.activation: str | None = getattr(linear, "activation", None)
        self.act = getattr(linear, "act", None)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        # the rows from which the next projection runs in FP8 too, where it does: the activation and that
        # projection's quantization run as one kernel on CUDA, which hands over Fp8Rows
        # (Backbone.fuse_fp8_inputs)
        self.quantize_output_from: float = NEVER

    def forward(self, x: torch.Tensor | Fp8Rows) -> torch.Tensor | Fp8Rows:
        # [num_tokens, in_features] (or its Fp8Rows) -> [num_tokens, out_features] in the model dtype,
        # or from quantize_output_from rows on its Fp8Rows
        if isinstance(x, Fp8Rows):
            rows = x
        elif x.shape[0] < self.min_rows:
            return self.linear(x)
        else:
            rows = quantize_rows(x)
        out = torch._scaled_mm(
            rows.values,
            self.weight.t(),
            scale_a=rows.scales,
            scale_b=self.weight_scales,
            bias=self.bias,
            out_dtype=rows.dtype,
        )
        if out.shape[0] >= self.quantize_output_from:
            return activated_rows(out, self.activation, self.act)
        return out if self.act is None else self.act(out)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, fp8 (per channel, per token) "
            f"from {self.min_rows} rows"
        )


def fp8_rows_from(module: nn.Module) -> float:
    """The rows from which `module` takes its input in FP8: an Fp8Linear's min_rows, NEVER for others."""
    return module.min_rows if isinstance(module, Fp8Linear) else NEVER


@triton_kernel
def _quantize_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""
    global quantized_row  # jitted code calls module globals, not closures (the interpreter too)
    from engine.layers.fp8_row import quantized_row

    @triton.jit
    def quantize(x_ptr, values_ptr, scales_ptr, width, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        columns = tl.arange(0, BLOCK)
        mask = columns < width
        x = tl.load(x_ptr + row * width + columns, mask=mask, other=0.0).to(tl.float32)
        quantized_row(x, mask, values_ptr + row * width + columns, scales_ptr + row)

    return quantize


def activated_rows(x: torch.Tensor, activation: str | None, act) -> Fp8Rows:
    """act(x) rounded to x's dtype, quantized per row: one Triton kernel on CUDA for the GELUs (a row in
    one program), the torch ops elsewhere."""
    kernel = _activation_kernel() if x.is_cuda else None
    if kernel is None or activation not in KERNEL_ACTIVATIONS or x.shape[-1] > MAX_FUSED_COLUMNS:
        return quantize_rows(x if act is None else act(x))
    return activate_and_quantize(kernel, x, activation)


# activations the fused kernel computes (name -> in its tanh form): BERT's erf "gelu" too, as the bf16 path's
# cuBLASLt epilogue computes it (engine/layers/linear_act.py: within 4.7e-4 of erf, under a bf16 step), since
# libdevice's erf made the kernel compute-bound (156 us for BERT-base's 16k x 3,072 on the H200)
KERNEL_ACTIVATIONS = {"gelu": True, "gelu_new": True, "gelu_pytorch_tanh": True, "gelu_fast": True}
# a row in one program; wider ones take the torch ops (Qwen2-1.5B's gated product is 8,960 wide: at 8,192 its
# torch passes left FP8 at 1.74x HF against bf16's 2.59x on the H200)
MAX_FUSED_COLUMNS = 16384


def row_warps(block: int) -> int:
    """The warps of a program that holds a row of `block` columns."""
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def activate_and_quantize(kernel, x: torch.Tensor, activation: str) -> Fp8Rows:
    """activated_rows by the Triton kernel, on the device x is on (the interpreter's CPU in the tests)."""
    x = x.contiguous()
    num_tokens, width = x.shape
    values = torch.empty(num_tokens, width, dtype=FP8, device=x.device)
    scales = torch.empty(num_tokens, 1, dtype=torch.float32, device=x.device)
    block = 1 << (width - 1).bit_length()
    tanh = KERNEL_ACTIVATIONS[activation]
    kernel[(num_tokens,)](x, values, scales, width, TANH=tanh, BLOCK=block, num_warps=row_warps(block))
    return Fp8Rows(values, scales, x.dtype)


@triton_kernel
def _activation_kernel(triton, tl):
    """The kernel, compiled on first use; None where Triton is missing (the torch ops then run)."""
    global quantized_row  # jitted code calls module globals, not closures (the interpreter too)
    from engine.layers.fp8_row import quantized_row

    @triton.jit
    def activate_and_quantize(x_ptr, values_ptr, scales_ptr, width, TANH: tl.constexpr, BLOCK: tl.constexpr):
        token = tl.program_id(0).to(tl.int64)
        columns = tl.arange(0, BLOCK)
        mask = columns < width
        x = tl.load(x_ptr + token * width + columns, mask=mask, other=0.0).to(tl.float32)
        if TANH:  # 0.5 x (1 + tanh(y)) = x * sigmoid(2 y), y = sqrt(2 / pi) (x + 0.044715 x^3)
            inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            activated = x / (1.0 + tl.exp(-2.0 * inner))
        else:  # 0.5 x (1 + erf(x / sqrt(2)))
            activated = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
        activated = activated.to(x_ptr.dtype.element_ty).to(tl.float32)  # as the unfused op rounds it
        quantized_row(activated, mask, values_ptr + token * width + columns, scales_ptr + token)

    return activate_and_quantize


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


def fp8_layers(module: nn.Module) -> list[Fp8Linear]:
    return [layer for layer in module.modules() if isinstance(layer, Fp8Linear)]


def unquantize_linears(module: nn.Module) -> None:
    """Put back each Fp8Linear's model-dtype layer."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Fp8Linear):
                setattr(parent, name, child.linear)


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
