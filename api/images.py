"""Images a request sends: read from a data URI or bare base64 (or, with --allow-image-urls, fetched from a
URL within a size and time limit), decoded with Pillow, checked, and made into the patches a model takes
(its ImageLayout: made RGB, resized and cropped as its processor does, then cut into patches, channel, row
and column flattened, still 8-bit: the model rescales and normalizes them on the device, ImageLayout.affine).
Runs on the gateway's image threads: Pillow lets go of the GIL while it decodes and resizes, pybase64 while
it decodes base64 (api/base64_bytes.py)."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass

import numpy as np

from api.base64_bytes import decode_base64
from api.errors import InvalidInput
from engine.checkpoint.images import ImageLayout

# what Pillow decodes for posy; anything else (a PDF, an SVG, a PSD, ...) is refused by name
FORMATS = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")
MAX_ASPECT = 200  # Qwen2-VL's processors refuse an image longer than this many times its width; so does posy
MAX_IMAGE_PIXELS = 40_000_000  # width x height of a decoded image (a 100-megapixel photo is refused)


class InvalidImage(InvalidInput):
    """An image that cannot be read: not an image, a truncated one, too large, a format posy does not
    decode, a URL it may not fetch. `where` names it in the request ("input[3]"): the message starts with
    it, the error's param is its field."""

    def __init__(self, message: str, where: str):
        super().__init__(f"{where}: {message}", where.split("[")[0])


@dataclass(frozen=True, slots=True)
class ImageLimits:
    max_pixels: int = MAX_IMAGE_PIXELS
    allow_urls: bool = False  # --allow-image-urls: fetch http(s) URLs, else only data URIs and base64
    url_timeout_s: float = 10.0
    url_max_bytes: int = 20 * 2**20


def image_bytes(source: str, limits: ImageLimits, where: str) -> bytes:
    """The encoded image a request's string names: a data URI, bare base64, or an http(s) URL."""
    if source.startswith(("http://", "https://")):
        if not limits.allow_urls:
            raise InvalidImage(
                "image URLs are not fetched: send the image as a base64 data URI "
                "(data:image/png;base64,...), or start the server with --allow-image-urls",
                where,
            )
        return fetch(source, limits, where)
    data = source
    if source.startswith("data:"):
        header, comma, data = source.partition(",")
        if not comma or not header.endswith(";base64"):
            raise InvalidImage("an image data URI must be base64: data:image/<format>;base64,<data>", where)
        if not header.startswith("data:image/"):
            raise InvalidImage(
                f"a data URI of {header[5:].split(';')[0] or 'no type'!r} is not an image", where
            )
    try:
        return decode_base64(data)
    except ValueError:
        raise InvalidImage(
            "an image is a base64 data URI (data:image/png;base64,...) or base64", where
        ) from None


def fetch(url: str, limits: ImageLimits, where: str) -> bytes:
    import httpx

    try:
        with httpx.stream("GET", url, timeout=limits.url_timeout_s, follow_redirects=True) as response:
            if response.status_code != 200:
                raise InvalidImage(f"fetching the image at {url} gave HTTP {response.status_code}", where)
            chunks, size = [], 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > limits.url_max_bytes:
                    raise InvalidImage(
                        f"the image at {url} is larger than {limits.url_max_bytes} bytes", where
                    )
                chunks.append(chunk)
            return b"".join(chunks)
    except httpx.HTTPError as error:
        raise InvalidImage(
            f"the image at {url} could not be fetched: {type(error).__name__}", where
        ) from None


def decode(data: bytes, limits: ImageLimits, where: str):
    """A decoded PIL image (an animation's first frame), RGB, transparency composited over white as
    transformers' processors do."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except UnidentifiedImageError:
        raise InvalidImage(f"not an image in a supported format ({', '.join(FORMATS)})", where) from None
    except Image.DecompressionBombError:
        raise InvalidImage(f"the image exceeds {limits.max_pixels:,} pixels", where) from None
    width, height = image.size
    if width * height > limits.max_pixels:
        raise InvalidImage(
            f"an image of {width}x{height} pixels ({width * height / 1e6:.1f} megapixels) exceeds the limit "
            f"of {limits.max_pixels / 1e6:.0f} megapixels",
            where,
        )
    try:
        image.load()
    except (OSError, ValueError, SyntaxError) as error:
        raise InvalidImage(f"the {image.format} image is truncated or corrupt ({error})", where) from None
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        image = image.convert("RGBA")
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image).convert("RGB")
    return image if image.mode == "RGB" else image.convert("RGB")  # an RGB image as it is, not a copy


def pixels(image, layout: ImageLayout) -> np.ndarray:
    """[channels, height, width] uint8 of an RGB PIL image, resized and cropped as the model's processor
    does; its rescale and normalization are the model's (`normalized` on the host)."""
    check_aspect(image.height, image.width)
    if layout.pixel_range is not None:
        size = dynamic_size(image.height, image.width, layout.patch_size * layout.merge, *layout.pixel_range)
    elif layout.max_num_patches is not None:
        size = naflex_size(image.height, image.width, layout.patch_size, layout.max_num_patches)
    elif layout.resize_to is not None:
        size = layout.resize_to
    elif layout.shortest_edge is not None:
        size = shortest_edge_size(image.height, image.width, layout.shortest_edge)
    else:
        size = (image.height, image.width)
    if size != (image.height, image.width):
        image = image.resize((size[1], size[0]), resample=layout.resample)
    array = np.asarray(image).transpose(2, 0, 1)
    if layout.crop is not None:
        array = center_crop(array, layout.crop)
    return array


def normalized(values: np.ndarray, layout: ImageLayout) -> np.ndarray:
    """The float32 pixel values the model's processor gives (`pixels`' [channels, ...] rescaled and
    normalized), as the model computes them on the device: what transformers takes as pixel_values."""
    scale, shift = (np.asarray(part, dtype=np.float32)[:, None, None] for part in layout.affine)
    return values.astype(np.float32) * scale + shift


def dynamic_size(height: int, width: int, factor: int, low: int, high: int) -> tuple[int, int]:
    """Qwen2-VL's resize (its processors' smart_resize): each side rounded to a multiple of `factor`, then
    both scaled, the aspect kept, into `low` to `high` pixels (down rounding down, up rounding up)."""
    check_aspect(height, width)
    rows, columns = round(height / factor) * factor, round(width / factor) * factor
    if rows * columns > high:
        scale = math.sqrt(height * width / high)
        rows = max(factor, math.floor(height / scale / factor) * factor)
        columns = max(factor, math.floor(width / scale / factor) * factor)
    elif rows * columns < low:
        scale = math.sqrt(low / (height * width))
        rows = math.ceil(height * scale / factor) * factor
        columns = math.ceil(width * scale / factor) * factor
    return rows, columns


def naflex_size(height: int, width: int, patch_size: int, max_num_patches: int) -> tuple[int, int]:
    """SigLIP2's NaFlex resize (its processor's get_image_size_for_max_num_patches): the largest scale,
    found by bisection to 1e-5, at which both sides, each rounded up to whole patches (one at least), make
    at most `max_num_patches` patches."""

    def scaled(scale: float, size: int) -> int:
        return max(patch_size, math.ceil(size * scale / patch_size) * patch_size)

    low, high = 1e-6, 100.0
    while high - low >= 1e-5:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch_size) * (scaled(scale, width) / patch_size) <= max_num_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def check_aspect(height: int, width: int) -> None:
    """Refuse a sliver: one side more than MAX_ASPECT times the other (as Qwen2-VL's processors do). A
    resize of its shorter side to the model's would make the longer one huge: a 143-byte PNG of 20000x1
    pixels, resized to CLIP's 224, took 24 s and 9.6 GB."""
    if max(height, width) > MAX_ASPECT * min(height, width):
        raise ValueError(
            f"an image of {width}x{height} pixels: one side is more than {MAX_ASPECT} times the other"
        )


def shortest_edge_size(height: int, width: int, edge: int) -> tuple[int, int]:
    """The (height, width) that makes the shorter side `edge`, the longer one scaled and rounded down."""
    if width <= height:
        return int(edge * height / width), edge
    return edge, int(edge * width / height)


def center_crop(array: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[C, H, W] -> [C, *size], centred; an image smaller than that is padded with zeros first."""
    height, width = array.shape[1:]
    crop_height, crop_width = size
    if crop_height > height or crop_width > width:
        padded = np.zeros(
            (array.shape[0], max(height, crop_height), max(width, crop_width)), dtype=array.dtype
        )
        top, left = -(-(padded.shape[1] - height) // 2), -(-(padded.shape[2] - width) // 2)
        padded[:, top : top + height, left : left + width] = array
        array, height, width = padded, padded.shape[1], padded.shape[2]
    top, left = (height - crop_height) // 2, (width - crop_width) // 2
    return array[:, top : top + crop_height, left : left + crop_width]


def patches(values: np.ndarray, patch_size: int, channels_last: bool = False) -> np.ndarray:
    """[C, H, W] -> [H / patch, W / patch, C * patch * patch]: the grid of patches, row by row, each
    channel, row, column flattened (the order of the patch convolution's weight); `channels_last`: row,
    column, channel (SigLIP2's NaFlex patch Linear's)."""
    channels, height, width = values.shape
    rows, columns = height // patch_size, width // patch_size
    order = (1, 3, 2, 4, 0) if channels_last else (1, 3, 0, 2, 4)
    grid = values.reshape(channels, rows, patch_size, columns, patch_size).transpose(*order)
    return np.ascontiguousarray(grid.reshape(rows, columns, channels * patch_size * patch_size))


def image_patches(source: str, layout: ImageLayout, limits: ImageLimits, where: str) -> np.ndarray:
    """A request's image string -> the patches the model takes, uint8 [grid rows, grid columns, patch_dim]."""
    image = decode(image_bytes(source, limits, where), limits, where)
    try:
        values = pixels(image, layout)
    except ValueError as error:  # a shape the model's resize refuses
        raise InvalidImage(str(error), where) from None
    return patches(values, layout.patch_size, channels_last=layout.max_num_patches is not None)
