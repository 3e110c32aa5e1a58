"""A vision tower's patch convolution (stride = kernel = patch) as the projection of each patch's pixels,
flattened channel, row, column as the host lays them out (api/images.py), 8-bit: first rescaled and
normalized per channel in float32 (`affine`, the processor's: ImageLayout.affine). The weight keeps the
checkpoint's [hidden, channels, (frames,) patch, patch] shape; with frames (Qwen2-VL's temporal patches,
an image repeated over them) the host sends one frame, and the projection sums the weight over frames.
SigLIP2's NaFlex projects each patch with a Linear over its pixels row, column, channel (`channels_last`),
as the host lays them out for it."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class PatchEmbedding(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        channels: int,
        patch_size: int,
        bias: bool,
        affine: tuple[Sequence[float], Sequence[float]],
        frames: int = 1,
        channels_last: bool = False,
    ):
        super().__init__()
        size = (patch_size, patch_size)
        shape = (channels, frames, *size) if frames > 1 else (channels, *size)
        # a Linear's [hidden, patch * patch * channels] over pixels row, column, channel (SigLIP2's NaFlex)
        self.channels_last = channels_last
        if channels_last:
            shape = (patch_size * patch_size * channels,)
        self.weight = nn.Parameter(torch.empty(hidden_size, *shape))
        self.bias = nn.Parameter(torch.empty(hidden_size)) if bias else None
        self.affine = affine
        # [patch_dim] float32 each: a pixel's scale and shift by its channel; and the [hidden, patch_dim]
        # projection of one frame (filled by `prepare`)
        patch_dim = channels * patch_size * patch_size
        self.register_buffer("scale", torch.empty(patch_dim), persistent=False)
        self.register_buffer("shift", torch.empty(patch_dim), persistent=False)
        self.projection: torch.Tensor | None = None

    def prepare(self) -> None:
        """Once the weights are loaded (on the device, in the model's dtype): the scale and shift in float32,
        and the projection, its frames summed in float32."""
        for name, values in zip(("scale", "shift"), self.affine):
            values = torch.tensor(values, dtype=torch.float32)
            if self.channels_last:
                column = values.repeat(self.weight.shape[1] // len(values))
            else:
                column = values.repeat_interleave(self.weight.shape[-1] * self.weight.shape[-2])
            setattr(self, name, column.to(self.weight.device))
        frames = self.weight.dim() == 5
        weight = self.weight.float().sum(2).to(self.weight.dtype) if frames else self.weight
        self.projection = weight.flatten(1)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        # [num_patches, channels * patch * patch] uint8 -> [num_patches, hidden]
        values = torch.addcmul(self.shift, pixels.float(), self.scale)
        return F.linear(values.to(self.projection.dtype), self.projection, self.bias)
