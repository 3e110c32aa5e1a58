"""Inputs that are texts or images, as the embeddings routes take them (OpenAI's `input` parts and
`messages` as vLLM takes them, Cohere v2's `images` and `inputs`): each one a vector. Texts are tokenized,
images decoded and made into patches on the model's image threads; an image's sequence is a placeholder of the
tokens it takes, so that budgets and admission count it, and its patches ride along (RowRequest.images)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from api.errors import InvalidInput
from api.guard import RequestGuard
from api.images import ImageLimits, image_patches
from api.models import EMBED, ServedModel


@dataclass(frozen=True, slots=True)
class ImageInput:
    source: str  # a data URI, bare base64 or (with --allow-image-urls) a URL
    param: str  # where the request named it, for errors ("input[3]")


Item = str | ImageInput


def content_item(part: Any, where: str) -> Item:
    """One content part as OpenAI's chat and Cohere's v2 inputs spell it: {"type": "text", "text": ...} or
    {"type": "image_url", "image_url": {"url": ...}} (its url a string also)."""
    kind = part.get("type") if isinstance(part, dict) else None
    if kind == "text" and isinstance(part.get("text"), str) and part["text"]:
        return part["text"]
    if kind == "image_url":
        url = part.get("image_url")
        url = url.get("url") if isinstance(url, dict) else url
        if isinstance(url, str) and url:
            return ImageInput(url, where)
    raise InvalidInput(
        f'{where} must be a part {{"type": "text", "text": "..."}} or {{"type": "image_url", "image_url": '
        '{"url": "data:image/png;base64,..."}}',
        where.split("[")[0],
    )


def single_part(parts: Any, where: str) -> Item:
    """An input given as a list of content parts: one part, a text or an image (a dual encoder embeds
    each alone: it has no joint vector of a text and an image)."""
    if not isinstance(parts, list) or len(parts) != 1:
        raise InvalidInput(
            f"{where}: each input is one part, a text or an image (this server does not fuse several parts "
            "into one vector)",
            where.split("[")[0],
        )
    return content_item(parts[0], where)


async def embed_items(
    model: ServedModel,
    items: Sequence[Item],
    guard: RequestGuard,
    limits: ImageLimits,
    max_tokens: int,
    truncate: bool,
    keep_end: bool = False,
    prompt: str = "",
) -> tuple[np.ndarray, int]:
    """Each item's vector, in order, and the tokens the model ran (an image's count as the tokens it
    takes); texts are prompted, then tokenized and limited as the route says."""
    layout = model.spec.images
    positions = [index for index, item in enumerate(items) if isinstance(item, ImageInput)]
    if positions and layout is None:
        first = items[positions[0]]
        raise InvalidInput(
            f"{first.param} is an image, and the model '{model.name}' embeds text only: images need an image "
            "model (CLIP, SigLIP, Qwen2-VL)",
            first.param.split("[")[0],
        )
    texts = [prompt + item for item in items if isinstance(item, str)]
    encoder = model.encoder
    sequences: list[Sequence[int]] = [[]] * len(items)
    if texts:
        encoded = iter(
            await guard.tokenized(encoder.encode_off_loop(texts, max_tokens, truncate, keep_end, guard))
        )
        for index, item in enumerate(items):
            if isinstance(item, str):
                sequences[index] = next(encoded)
    rows = model.rows(EMBED)
    if positions:
        images: list[ImageInput] = [items[index] for index in positions]  # type: ignore[misc]

        def work(part: Sequence[str], first: int) -> list[np.ndarray]:
            return [
                image_patches(source, layout, limits, images[first + offset].param)
                for offset, source in enumerate(part)
            ]

        sources = [image.source for image in images]
        decoded = await guard.tokenized(decode_all(model.image_pool, work, sources))
        grids: list[np.ndarray | None] = [None] * len(items)
        for index, image, grid in zip(positions, images, decoded):
            grids[index], sequences[index] = grid, image_sequence(model, grid, image.param)
        rows = dataclasses.replace(rows, images=grids)
    vectors = await guard.run(sequences, rows=rows)
    return vectors, sum(map(len, sequences))


def image_sequence(model: ServedModel, grid: np.ndarray, where: str) -> list[int]:
    """The token ids of an image of this grid of patches: a dual encoder's placeholder, a token for each
    (the class token's too); a vision-language model's input layout (TextEncoder.single) of its vision
    start, a placeholder for each merged patch, and its vision end."""
    spec = model.spec
    tokens = spec.images.tokens_of(grid.shape[:2])
    if spec.input_layout is None:
        return [0] * tokens
    config = spec.config
    placeholders = [config.image_token_id] * tokens
    ids = model.encoder.single.apply([config.vision_start, *placeholders, config.vision_end])
    if len(ids) > spec.max_seq_length:
        raise InvalidInput(
            f"{where}: an image of {grid.shape[0] * grid.shape[1]} patches takes {len(ids)} tokens, more "
            f"than the model's window of {spec.max_seq_length}",
            where.split("[")[0],
        )
    return ids


async def decode_all(pool, work, sources: list[str]) -> list[np.ndarray]:
    """The images' patches, decoded on the model's image threads; the first failure (in order) is raised."""
    joined: list[np.ndarray] = []
    for part in await pool.map(work, sources):
        if isinstance(part, BaseException):
            raise part
        joined += part
    return joined
