"""Inputs that are texts or images, as the embeddings routes take them (OpenAI's `input` parts as vLLM takes
them, Cohere v2's `images` and `inputs`): each one a vector; a vision-language model's input may also fuse
images and texts (Cohere v2's input of several content parts). Texts are tokenized, images decoded and
made into patches on the model's image threads; an image's sequence is a placeholder of the tokens it
takes, so that budgets and admission count it, and its patches ride along (RowRequest.images)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import numpy as np

from api.errors import InputTooLong, InvalidInput
from api.guard import RequestGuard, together
from api.images import ImageLimits, image_patches
from api.models import EMBED, ServedModel
from api.tokenize import TextEncoder
from api.tokenizer_pool import StartBy
from engine.inline_images import image_entry

# a request's images are decoded in up to this many parts a thread (one image a part where they are fewer)
PARTS_PER_THREAD = 4


@dataclass(frozen=True, slots=True)
class ImageInput:
    source: str  # a data URI, bare base64 or (with --allow-image-urls) a URL
    param: str  # where the request named it, for errors ("input[3]")


@dataclass(frozen=True, slots=True)
class FusedInput:
    """Content parts embedded as one vector, in order: a vision-language model's images among its texts."""

    parts: tuple[str | ImageInput, ...]
    param: str  # where the request named it ("inputs[2]")


Item = str | ImageInput | FusedInput


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


def content_parts(parts: Any, where: str) -> Item:
    """An input given as a list of content parts: one part, a text or an image; or several, fused into one
    vector (a vision-language model's: embed_items refuses them for other models)."""
    if not isinstance(parts, list) or not parts:
        raise InvalidInput(f"{where} must have a non-empty list of content parts", where.split("[")[0])
    items = [content_item(part, where) for part in parts]
    return items[0] if len(items) == 1 else FusedInput(tuple(items), where)  # type: ignore[arg-type]


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
    first: int = 0,
) -> tuple[np.ndarray, int]:
    """Each item's vector, in order, and the tokens the model ran (an image's count as the tokens it
    takes); texts are prompted (a vision-language embedder's prompt is the system turn of every input:
    TextEncoder.prompted), then tokenized and limited as the route says (a text too long named by its
    place in the request: `first` is the first item's). More images than the model's image threads decode
    at once go to the engine in groups of that many, each as it is decoded: the engine runs one while the
    threads decode the next."""
    groups = placed_groups(model, items, first)
    if len(groups) > 1:
        options = (guard, limits, max_tokens, truncate, keep_end, prompt)
        done = await together([embed_items(model, group, *options, first=start) for group, start in groups])
        return np.concatenate([vectors for vectors, _ in done]), sum(tokens for _, tokens in done)
    layout = model.spec.images
    images = [
        (index, image)
        for index, item in enumerate(items)
        for image in (item.parts if isinstance(item, FusedInput) else (item,))
        if isinstance(image, ImageInput)
    ]
    if images and layout is None:
        first = images[0][1]
        raise InvalidInput(
            f"{first.param} is an image, and the model '{model.name}' embeds text only: images need an image "
            "model (CLIP, SigLIP, Qwen2-VL, Qwen3-VL)",
            first.param.split("[")[0],
        )
    fused = [item for item in items if isinstance(item, FusedInput)]
    for item in fused:
        check_fused(model, item)
    encoder, texts = model.encoder.prompted([item for item in items if isinstance(item, str)], prompt)
    sequences: list[Sequence[int]] = [[]] * len(items)
    if texts:
        try:
            encoded = iter(
                await guard.tokenized(encoder.encode_off_loop(texts, max_tokens, truncate, keep_end, guard))
            )
        except InputTooLong as error:  # numbered among the texts: renumbered among the request's inputs
            places = [first + index for index, item in enumerate(items) if isinstance(item, str)]
            raise error.renumbered(places[error.index]) from None
        for index, item in enumerate(items):
            if isinstance(item, str):
                sequences[index] = next(encoded)
    rows = model.rows(EMBED)
    grids: list[list[np.ndarray]] = [[] for _ in items]  # each input's images, in order
    if images:
        decoded = await decoded_images(model, [image for _, image in images], guard, limits)
        for (index, image), grid in zip(images, decoded):
            grids[index].append(grid)
            if not isinstance(items[index], FusedInput):
                sequences[index] = image_sequence(model, encoder, grid, image.param)
        rows = dataclasses.replace(rows, images=[image_entry(given) for given in grids])
    if fused:
        pieces = [part for item in fused for part in item.parts if isinstance(part, str)]
        ids = iter(await guard.tokenized(encoder.content_ids_off_loop(pieces, guard, encoder.window)))
        for index, item in enumerate(items):
            if isinstance(item, FusedInput):
                own = iter(grids[index])
                content = [
                    token
                    for part in item.parts
                    for token in (
                        check_vision_free(model, next(ids), item.param)
                        if isinstance(part, str)
                        else vision_ids(model, next(own))
                    )
                ]
                sequences[index] = laid_out(model, encoder, content, item.param)
    vectors = await guard.run(sequences, rows=rows)
    return vectors, sum(map(len, sequences))


def placed_groups(
    model: ServedModel, items: Sequence[Item], first: int = 0
) -> list[tuple[Sequence[Item], int]]:
    """`items` in groups of as many images as the model's image threads decode at once (image_groups), each
    with the place of its first item in the request (`first`: the first item's)."""
    groups = image_groups(items, model.image_pool.num_threads if model.image_pool is not None else 0)
    return list(zip(groups, accumulate(map(len, groups[:-1]), initial=first)))


def image_groups(items: Sequence[Item], size: int) -> list[Sequence[Item]]:
    """`items` in consecutive groups of at most `size` images (an input of more alone), each text in the
    group of the images beside it; one group where they hold no more than that, or `size` is 0."""
    groups: list[Sequence[Item]] = []
    start = count = 0
    for index, item in enumerate(items):
        parts = item.parts if isinstance(item, FusedInput) else (item,)
        num_images = sum(isinstance(part, ImageInput) for part in parts)
        if size and num_images and count and count + num_images > size:
            groups.append(items[start:index])
            start, count = index, 0
        count += num_images
    groups.append(items[start:])
    return groups


def check_fused(model: ServedModel, item: FusedInput) -> None:
    """A fused input is a vision-language model's (its images and texts in order, one sequence)."""
    if model.spec.input_layout is None:
        raise InvalidInput(
            f"{item.param} fuses {len(item.parts)} content parts into one vector, which only a "
            f"vision-language model does (Qwen2-VL, Qwen3-VL): the model '{model.name}' embeds each part "
            "alone, send each as an input of its own",
            item.param.split("[")[0],
        )


def image_sequence(model: ServedModel, encoder: TextEncoder, grid: np.ndarray, where: str) -> list[int]:
    """The token ids of an image of this grid of patches: a dual encoder's placeholder, a token for each
    (the class token's too); a vision-language model's input layout (`encoder`'s) of its vision tokens."""
    spec = model.spec
    if spec.input_layout is None:
        return [0] * spec.images.tokens_of(grid.shape[:2])
    return laid_out(model, encoder, vision_ids(model, grid), where)


def vision_ids(model: ServedModel, grid: np.ndarray) -> list[int]:
    """A vision-language model's image: its vision start, a placeholder for each merged patch, its end (a
    model without start and end tokens, PaliGemma, has the placeholders alone)."""
    config = model.spec.config
    placeholders = [config.image_token_id] * model.spec.images.tokens_of(grid.shape[:2])
    marks = (config.vision_start, *placeholders, config.vision_end)
    return [token for token in marks if token is not None]


def check_vision_free(model: ServedModel, ids: list[int], where: str) -> list[int]:
    """A text's ids that share a sequence with an image: none of the model's vision tokens (a text that
    spells "<|image_pad|>" tokenizes to the image placeholder, which the image's run would not match)."""
    config = model.spec.config
    if {config.image_token_id, config.vision_start, config.vision_end}.intersection(ids):
        raise InvalidInput(
            f"{where} holds a token the model '{model.name}' keeps for images (such as <|image_pad|>): "
            "send images as image parts",
            where.split("[")[0],
        )
    return ids


def image_document(model: ServedModel, around: list[list[int]], grid: np.ndarray, where: str) -> list[int]:
    """An image document in a multi-vector model's layout (the ids before and after its vision tokens, as
    LateInteraction.image_texts gives them), within the model's window."""
    ids = [*around[0], *vision_ids(model, grid), *around[1]]
    window = model.spec.max_seq_length
    if len(ids) > window:
        raise InvalidInput(
            f"{where} takes {len(ids)} tokens, more than the model's window of {window}", where.split("[")[0]
        )
    return ids


def laid_out(model: ServedModel, encoder: TextEncoder, content: list[int], where: str) -> list[int]:
    """An input's content in the model's input layout (`encoder`'s single template), within its window."""
    ids = encoder.single.apply(content)
    window = model.spec.max_seq_length
    if len(ids) > window:
        raise InvalidInput(
            f"{where} takes {len(ids)} tokens as the model lays it out, more than its window of {window}",
            where.split("[")[0],
        )
    return ids


async def decoded_images(
    model: ServedModel, images: Sequence[ImageInput], guard: RequestGuard, limits: ImageLimits
) -> list[np.ndarray]:
    """Each image's grid of patches, decoded on the model's image threads (counted as the request's
    tokenization, and admitted as it is: decoding behind what is queued on the threads, at their measured
    rate, must fit the request's deadline beside the engine's queue, else a 429 before it waits); the first
    bad one (in order) raises its 400."""
    layout = model.spec.images

    def work(part: Sequence[str], first: int) -> list[np.ndarray]:
        return [
            image_patches(source, layout, limits, images[first + offset].param)
            for offset, source in enumerate(part)
        ]

    sources = [image.source for image in images]
    pool, num_chars = model.image_pool, sum(map(len, sources))
    # a fixed-size image's tokens are known before it is decoded, a NaFlex one's at most; a dynamic one's
    # are not (none guessed)
    sized = layout.image_size is not None or layout.max_num_patches is not None
    tokens = len(images) * layout.num_tokens if sized else 0
    start_by = guard.admit_tokenization(
        pool.seconds_for(num_chars), pool.seconds_for(num_chars, behind_queued=False), tokens
    )
    return await guard.tokenized(decode_all(pool, work, sources, start_by))


async def decode_all(pool, work, sources: list[str], start_by: StartBy | None = None) -> list[np.ndarray]:
    """The images' patches, decoded on the model's image threads, each part started by `start_by`; the
    first failure (in order) is raised."""
    joined: list[np.ndarray] = []
    # small parts, the largest first: an image takes milliseconds and images differ in size, and a part a
    # thread would leave the threads given small images idle while one works through large ones
    part_size = -(-len(sources) // (PARTS_PER_THREAD * pool.num_threads))
    for part in await pool.map(work, sources, start_by, part_size):
        if isinstance(part, BaseException):
            raise part
        joined += part
    return joined
