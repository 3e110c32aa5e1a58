"""Rerank with an image model, by its kind: an image embedder's cosines (CLIP, SigLIP, a vision-language
embedder), a vision-language ranker's pairs (jina-reranker-m0, Qwen3-VL-Reranker), a multi-vector image
retriever's MaxSim (ColQwen2). Each takes texts and images among its query and documents (ImageInput) and
what rerank reads of a query and of a document (`reads`: their tokens)."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from api.errors import InvalidInput
from api.guard import RequestGuard, together
from api.image_inputs import (
    ImageInput,
    Item,
    check_vision_free,
    decoded_images,
    embed_items,
    image_document,
    placed_groups,
    vision_ids,
)
from api.images import ImageLimits
from api.models import RERANK, ServedModel
from api.prompts import select_prompt
from engine.inline_images import image_entry
from scoring.heads import cosine_to_scores, logits_to_scores, max_sim_to_scores
from scoring.rerank import RerankOptions
from scoring.templates import IMAGE_MARK


async def image_embedder_scores(
    model: ServedModel, query: Item, items: list[Item], options: RerankOptions, guard: RequestGuard,
    limits: ImageLimits, reads: tuple[int, int],
) -> np.ndarray:  # fmt: skip
    """An image embedder's scores: (1 + cosine) / 2 of the query's vector and each document's (raw: the
    cosine), each with the model's query or document prompt; a text document cut to the window, or to
    max_tokens_per_doc of its own tokens where that is less."""
    spec, encoder, window = model.spec, model.encoder, model.encoder.window
    prompts = [select_prompt(spec.prompts, kind, None) for kind in ("query", "document")]
    cut = reads[1] < window and any(isinstance(item, str) for item in items)
    if not cut and not any(prompts):
        vectors, _ = await embed_items(model, [query, *items], guard, limits, window, True)
        return cosine_to_scores(vectors[0], vectors[1:], raw=options.raw_scores)
    # the query within the window, the documents within their own limit beside their layout's tokens: both
    # queued at once, so that they share the engine's batches
    layout_tokens = encoder.prompted([], prompts[1])[0].single.num_special_tokens
    document_limit = min(window, reads[1] + layout_tokens) if cut else window
    (query_vectors, _), (vectors, _) = await together([
        embed_items(model, [query], guard, limits, window, True, prompt=prompts[0]),
        embed_items(model, items, guard, limits, document_limit, True, prompt=prompts[1]),
    ])  # fmt: skip
    return cosine_to_scores(query_vectors[0], vectors, raw=options.raw_scores)


def documents_in_groups(score):
    """`score` of the documents in groups of as many images as the model's image threads decode at once
    (placed_groups), run together: the engine runs one group while the threads decode the next, as
    embed_items sends an embedder's (an image query is decoded with each group)."""

    @functools.wraps(score)
    async def grouped(model, query, items, options, guard, limits, reads) -> np.ndarray:
        same = (options, guard, limits, reads)
        groups = placed_groups(model, items)
        return np.concatenate(
            await together([score(model, query, group, *same, start) for group, start in groups])
        )

    return grouped


@documents_in_groups
async def ranker_scores(
    model: ServedModel, query: Item, items: list[Item], options: RerankOptions, guard: RequestGuard,
    limits: ImageLimits, reads: tuple[int, int], first: int,
) -> np.ndarray:  # fmt: skip
    """A vision-language ranker's scores (jina-reranker-m0's, Qwen3-VL-Reranker's): each (query, document)
    pair one sequence in the model's pair layout and prompts, an image's vision tokens where its text
    would be (an image query and an image document: both, in the pair's order). Texts are cut to what
    rerank reads of them. `first`: the first document's place in the request (documents_in_groups)."""
    inputs = [query, *items]
    images = [item for item in inputs if isinstance(item, ImageInput)]
    grids = iter(await decoded_images(model, images, guard, limits))
    cuts = [reads[0], *[reads[1]] * len(items)]
    bound, prompts = model.encoder.bound, model.rerank.prompts

    def prompted(item: Item, index: int) -> list[str]:
        # a text in its prompt (one text); an image's prompt around it (the texts before and after it)
        text = bound.cut(item, cuts[index]) if isinstance(item, str) else IMAGE_MARK
        text = prompts.query_text(text, options.instruction) if index == 0 else prompts.document_text(text)
        if isinstance(item, str):
            return [text]
        around = text.split(IMAGE_MARK)
        if len(around) != 2:  # the mark in the request's instruction
            raise InvalidInput("instruction holds a NUL-delimited mark this server keeps", "instruction")
        return around

    pieces = [prompted(item, index) for index, item in enumerate(inputs)]
    tokenizing = model.encoder.content_ids_off_loop(
        [piece for parts in pieces for piece in parts], guard, max(reads)
    )
    ids = iter(await guard.tokenized(tokenizing))
    contents, pair_images = [], []
    for index, (item, limit) in enumerate(zip(inputs, cuts)):
        where = "query" if index == 0 else f"documents[{first + index - 1}]"
        grid = next(grids) if isinstance(item, ImageInput) else None
        if grid is None:
            contents.append(check_vision_free(model, next(ids)[:limit], where))
        else:
            before, after = (check_vision_free(model, next(ids), where) for _ in range(2))
            contents.append([*before, *vision_ids(model, grid), *after])
        pair_images.append(grid)
    window, sequences = model.spec.max_seq_length, []
    for index, document_ids in enumerate(contents[1:]):
        sequence, _ = model.encoder.pair.apply(contents[0], document_ids)
        if len(sequence) > window:
            raise InvalidInput(
                f"documents[{first + index}] with the query takes {len(sequence)} tokens, more than the "
                f"model's window of {window}",
                "documents",
            )
        sequences.append(sequence)
    # each pair's images in the order its layout places them
    document_first = model.encoder.pair.document_first
    pair_grids = [
        image_entry([document, pair_images[0]] if document_first else [pair_images[0], document])
        for document in pair_images[1:]
    ]
    logits = await guard.run(sequences, rows=dataclasses.replace(model.rows(RERANK), images=pair_grids))
    return logits_to_scores(logits, raw=options.raw_scores)


@documents_in_groups
async def max_sim_scores(
    model: ServedModel, query: Item, items: list[Item], options: RerankOptions, guard: RequestGuard,
    limits: ImageLimits, reads: tuple[int, int], first: int,
) -> np.ndarray:  # fmt: skip
    """A multi-vector image retriever's scores (ColQwen2's): the query's token vectors' MaxSim against each
    document's, on the device, the query run once a batch (as ColBERT's rerank); each laid out as the
    model's processor lays it out (LateInteraction.layout), an image document's vision tokens in its own.
    Texts are cut to what rerank reads of them, then to the model's lengths. `first`: as ranker_scores'."""
    late = model.late_interaction
    if isinstance(query, ImageInput):
        raise InvalidInput(
            f"the query is an image: the model '{model.name}' embeds a query from its text (images are "
            "documents)",
            "query",
        )
    images = [item for item in items if isinstance(item, ImageInput)]
    grids = iter(await decoded_images(model, images, guard, limits))
    bound = model.encoder.bound
    texts = [late.query_text(bound.cut(query, late.content_room(True)))]
    for item in items:
        if isinstance(item, str):
            texts.append(late.document_text(bound.cut(item, min(reads[1], late.content_room(False)))))
    tokenizing = model.encoder.content_ids_off_loop([*texts, *late.image_texts()], guard, max(reads))
    *text_ids, before, after = await guard.tokenized(tokenizing)
    ids = iter(text_ids)
    query_ids, documents, document_images = late.query_ids(next(ids)), [], []
    for index, item in enumerate(items):
        grid = next(grids) if isinstance(item, ImageInput) else None
        if grid is None:
            documents.append(late.document_ids(late.cut(next(ids), reads[1])))
        else:
            documents.append(image_document(model, [before, after], grid, f"documents[{first + index}]"))
        document_images.append(grid)
    rows = dataclasses.replace(model.rows(RERANK), prefix=query_ids, images=document_images)
    max_sims = await guard.run(documents, rows=rows)
    return max_sim_to_scores(max_sims[:, 0], len(query_ids), raw=options.raw_scores)
