"""LinearActivation: act(x @ W^T + b) as one cuBLASLt GEMM whose epilogue adds the bias and applies
the activation, on CUDA; the plain ops elsewhere. An nn.Linear, so checkpoints map onto it unchanged.

cuBLASLt has GELU (its tanh form) and ReLU epilogues. The tanh form is exact for the tanh GELUs. For
the exact (erf) GELU, BERT's "gelu", it runs only in bf16/fp16: the two forms differ by at most
4.7e-4 (at x = 2.70, where a bf16 value is only good to 7.8e-3), and applied to the float32
accumulator it lands nearer the float32 erf result than the unfused bf16 GEMM + erf GELU does
(measured on the H200: relative error 1.7e-3 against 2.6e-3). TEI fuses the same epilogue. float32
on CUDA keeps the exact erf, unfused.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.activations import get_activation

# activation name -> (cuBLASLt epilogue, whether the epilogue is exactly that activation)
EPILOGUES: dict[str, tuple[str, bool]] = {
    "gelu": ("gelu", False),
    "gelu_new": ("gelu", True),
    "gelu_pytorch_tanh": ("gelu", True),
    "gelu_fast": ("gelu", True),
    "relu": ("relu", True),
}
HALF_DTYPES = (torch.bfloat16, torch.float16)


class LinearActivation(nn.Linear):
    def __init__(self, in_features: int, out_features: int, activation: str):
        super().__init__(in_features, out_features)
        self.activation = activation
        self.act = get_activation(activation)
        self.epilogue, self.exact = EPILOGUES.get(activation, (None, False))

    def fused(self, x: torch.Tensor) -> bool:
        """Whether this input runs as one GEMM with the activation in its epilogue."""
        return (
            x.is_cuda
            and x.dim() == 2
            and self.epilogue is not None
            and self.bias is not None
            and (self.exact or x.dtype in HALF_DTYPES)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # [num_tokens, in_features] -> [num_tokens, out_features]
        if self.fused(x):
            return torch._addmm_activation(self.bias, x, self.weight.t(), use_gelu=self.epilogue == "gelu")
        return self.act(F.linear(x, self.weight, self.bias))

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, activation={self.activation}"
