"""ImageLayout: how a model takes an image, read from its folder (preprocessor_config.json and the vision
config): the resize, crop, rescale and normalization its processor applies, and the patches and tokens
the result becomes: a fixed square (CLIP, SigLIP), any size within a pixel range, rounded to whole
merged patches (Qwen2-VL's dynamic resolution), or any size up to a number of patches (SigLIP2's NaFlex).
The gateway applies it (api/images.py); the engine counts its tokens."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.checkpoint.files import read_json
from engine.errors import UnsupportedModel

# PIL's resampling filters by the numbers processor configs give them
CHANNELS = 3  # images are made RGB
# OpenAI CLIP's normalization, Qwen2-VL's processors' default
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
RESAMPLING = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


@dataclass(frozen=True, slots=True)
class ImageLayout:
    # an image is first made RGB (transparency over white, as transformers does), then resized: its shorter
    # edge to `shortest_edge` (the aspect kept), or to (height, width); neither: not resized
    shortest_edge: int | None
    resize_to: tuple[int, int] | None
    resample: int  # PIL's filter number
    crop: tuple[int, int] | None  # a center crop (height, width) after the resize
    rescale: float | None  # pixel values times this (1 / 255), None: kept
    mean: tuple[float, ...] | None  # then (x - mean) / std per channel, None: not normalized
    std: tuple[float, ...] | None
    # the square the model's position table covers; None: any size (pixel_range, max_num_patches)
    image_size: int | None
    patch_size: int
    leading_tokens: int  # the model's own tokens before an image's patches (a class token)
    # Qwen2-VL's (min_pixels, max_pixels): resized, the aspect kept, to whole merge x merge groups of
    # patches within that many pixels (smart_resize); None: a fixed image_size
    pixel_range: tuple[int, int] | None = None
    merge: int = 1  # merge x merge patches make one token
    # SigLIP2's NaFlex: resized, the aspect kept, to at most this many whole patches (the processor's
    # max_num_patches), each patch's pixels row, column, channel (its patch embedding is a Linear over
    # them); None: neither
    max_num_patches: int | None = None

    @property
    def affine(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Per channel (scale, shift): the rescale and normalization of a pixel value x as x * scale + shift,
        which the model applies on the device to the 8-bit pixels the host sends (a quarter of the bytes of
        float32 ones to carry)."""
        rescale = self.rescale if self.rescale is not None else 1.0
        mean = self.mean if self.mean is not None else (0.0,) * CHANNELS
        std = self.std if self.std is not None else (1.0,) * CHANNELS
        return tuple(rescale / s for s in std), tuple(-m / s for m, s in zip(mean, std))

    @property
    def num_patches(self) -> int:
        """A fixed-size image's patches; a NaFlex image's most."""
        if self.max_num_patches is not None:
            return self.max_num_patches
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_tokens(self) -> int:
        """The tokens a fixed-size image takes in a batch; a NaFlex image's most."""
        return self.leading_tokens + self.num_patches

    def tokens_of(self, grid: tuple[int, int]) -> int:
        """The tokens an image of this grid of patches (rows, columns) takes."""
        return self.leading_tokens + grid[0] * grid[1] // self.merge**2


def read_image_layout(name: str, folder: Path, vision_config: Any, leading_tokens: int) -> ImageLayout:
    """The layout of a model whose vision tower takes square images of vision_config.image_size."""
    processor = read_processor(name, folder)
    size = processor.get("size") or {}
    if isinstance(size, int):
        size = {"shortest_edge": size}
    do_resize = processor.get("do_resize", True)
    shortest_edge = size.get("shortest_edge") if do_resize else None
    resize_to = (
        (size["height"], size["width"]) if do_resize and "height" in size and "width" in size else None
    )
    if do_resize and shortest_edge is None and resize_to is None:
        raise UnsupportedModel(f"model {name!r}: a resize of {size} is not supported")
    crop = None
    if processor.get("do_center_crop", False):
        crop_size = processor.get("crop_size") or {}
        if isinstance(crop_size, int):
            crop_size = {"height": crop_size, "width": crop_size}
        crop = (crop_size["height"], crop_size["width"])
    image_size = vision_config.image_size
    final = crop or resize_to
    if final is None or tuple(final) != (image_size, image_size):
        final = final or ("any", "any")
        raise UnsupportedModel(
            f"model {name!r}: its processor makes {final[0]}x{final[1]} images, its vision tower takes "
            f"{image_size}x{image_size}"
        )
    return ImageLayout(
        shortest_edge=shortest_edge,
        resize_to=resize_to,
        crop=crop,
        **pixel_values(name, processor, (0.5,) * CHANNELS, (0.5,) * CHANNELS),
        image_size=image_size,
        patch_size=vision_config.patch_size,
        leading_tokens=leading_tokens,
    )


def read_naflex_image_layout(name: str, folder: Path, vision_config: Any) -> ImageLayout:
    """The layout of a model whose vision tower takes images of any size and aspect up to a number of
    patches (SigLIP2's NaFlex): its processor's max_num_patches, patch size, resampling (bilinear by
    default), rescale and normalization."""
    processor = read_processor(name, folder)
    patch_size = processor.get("patch_size", vision_config.patch_size)
    if patch_size != vision_config.patch_size:
        raise UnsupportedModel(
            f"model {name!r}: its processor makes patches of {patch_size}, its vision tower takes "
            f"{vision_config.patch_size}"
        )
    if not processor.get("do_resize", True):
        raise UnsupportedModel(f"model {name!r}: a NaFlex processor that does not resize is not supported")
    return ImageLayout(
        shortest_edge=None,
        resize_to=None,
        crop=None,
        **pixel_values(name, {"resample": 2, **processor}, (0.5,) * CHANNELS, (0.5,) * CHANNELS),
        image_size=None,
        patch_size=patch_size,
        leading_tokens=0,
        max_num_patches=int(processor.get("max_num_patches", 256)),
    )


def read_dynamic_image_layout(name: str, folder: Path, vision_config: Any) -> ImageLayout:
    """The layout of a model whose vision tower takes images of any size (Qwen2-VL): its processor's pixel
    range (min_pixels, max_pixels, or size's shortest_edge and longest_edge, both in pixels), merged
    patches, rescale and normalization."""
    processor = read_processor(name, folder)
    size = processor.get("size") or {}
    low = processor.get("min_pixels") or size.get("shortest_edge") or 56 * 56
    high = processor.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280
    patch_size = processor.get("patch_size", vision_config.patch_size)
    merge = processor.get("merge_size", vision_config.spatial_merge_size)
    if (patch_size, merge) != (vision_config.patch_size, vision_config.spatial_merge_size):
        raise UnsupportedModel(
            f"model {name!r}: its processor makes patches of {patch_size} merged by {merge}, its vision "
            f"tower takes {vision_config.patch_size} merged by {vision_config.spatial_merge_size}"
        )
    return ImageLayout(
        shortest_edge=None,
        resize_to=None,
        crop=None,
        **pixel_values(name, processor, CLIP_MEAN, CLIP_STD),
        image_size=None,
        patch_size=patch_size,
        leading_tokens=0,
        pixel_range=(int(low), int(high)),
        merge=merge,
    )


def read_processor(name: str, folder: Path) -> dict[str, Any]:
    processor = read_json(folder / "preprocessor_config.json")
    if processor is None:
        raise UnsupportedModel(f"model {name!r}: an image model without preprocessor_config.json")
    return processor


def pixel_values(
    name: str, processor: dict[str, Any], mean: tuple[float, ...], std: tuple[float, ...]
) -> dict[str, Any]:
    """A processor's resampling filter, rescale and normalization (`mean`, `std`: its defaults), as
    ImageLayout's fields."""
    resample = processor.get("resample", 3)
    if resample not in RESAMPLING:
        raise UnsupportedModel(f"model {name!r}: unknown resampling filter {resample}")
    normalize = processor.get("do_normalize", True)
    return {
        "resample": resample,
        "rescale": processor.get("rescale_factor", 1 / 255) if processor.get("do_rescale", True) else None,
        "mean": tuple(processor.get("image_mean", mean)) if normalize else None,
        "std": tuple(processor.get("image_std", std)) if normalize else None,
    }
