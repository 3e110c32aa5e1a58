"""text-embeddings-inference's routes: POST /embed (a bare list of vectors), /embed_sparse (a bare list of
{index, value} lists: a SPLADE model's vocabulary weights, bge-m3's lexical weights), /rerank (a bare list
of {index, score[, text]}), /tokenize, and GET /info. Errors come in TEI's shape (api/errors.py)."""

from __future__ import annotations

import numpy as np
from litestar import Request, get, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.config import DEFAULT_MAX_CHUNKS_PER_DOC, MAX_SPARSE_ROWS_FLOATS
from api.encoding import check_dimensions, truncate_dimensions
from api.errors import InvalidInput, OutputTooLarge
from api.guard import RequestGuard
from api.inputs import check_query, check_texts
from api.models import EMBED, RERANK, SPARSE_EMBED
from api.openapi import package_version
from api.prompts import select_prompt
from api.quantize import float_json, sparse_json
from api.responses import EncodedJson, documented
from api.routes.rerank import check_documents, ranking, score_texts
from api.schemas.cohere import TeiRank, TeiRerankRequest
from api.schemas.tei import (
    TeiEmbedRequest,
    TeiEmbedSparseRequest,
    TeiInfo,
    TeiSparseValue,
    TeiToken,
    TeiTokenizeRequest,
)
from api.server import Server
from scoring.lexical import nonzero_weights
from scoring.m3_rows import lexical_outputs, unused_token_ids
from scoring.rerank import RerankOptions

# posy's pooling -> TEI's name for it in /info
TEI_POOLINGS = {"cls": "cls", "mean": "mean", "last": "last_token"}


@post(
    "/embed",
    status_code=200,
    request_body=TeiEmbedRequest,
    responses=documented(list[list[float]], "the vectors, in input order"),
)
async def embed_tei(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """text-embeddings-inference's embed: a bare list of vectors."""
    data = await decode_body(request, TeiEmbedRequest)
    model = server.registry().get(None, EMBED)
    spec, encoder = model.spec, model.encoder
    texts = [data.inputs] if isinstance(data.inputs, str) else data.inputs
    if not texts:
        raise InvalidInput("inputs must not be empty", "inputs")
    check_texts(texts, server.config.max_inputs, "inputs")
    check_dimensions(data.dimensions, spec.output_dim)
    if not data.normalize and spec.normalize:
        raise InvalidInput(
            "normalize=false is not available for this model: its own pipeline normalizes the vectors "
            "inside the engine",
            "normalize",
        )
    prompt = select_prompt(spec.prompts, None, data.prompt_name, spec.default_prompt_name)
    prompted, texts = encoder.prompted(texts, prompt)
    truncate = server.config.auto_truncate if data.truncate is None else data.truncate
    keep_end = data.truncation_direction == "Left"
    guard = RequestGuard(model.engine, request, server.config)
    sequences = await guard.tokenized(prompted.encode_off_loop(texts, None, truncate, keep_end, guard))
    vectors = await guard.run(sequences, rows=model.rows(EMBED))
    server.metrics.count_prompt_tokens(model.name, sum(map(len, sequences)))
    if data.normalize and not spec.normalize:  # TEI normalizes whatever the model does
        vectors = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return EncodedJson(float_json(truncate_dimensions(vectors, data.dimensions)))  # a bare list of them


@post(
    "/embed_sparse",
    status_code=200,
    request_body=TeiEmbedSparseRequest,
    responses=documented(list[list[TeiSparseValue]], "each text's non-zero weights by token id"),
)
async def embed_sparse_tei(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """text-embeddings-inference's sparse embed: each text's non-zero weights by token id (SPLADE,
    bge-m3's lexical weights)."""
    data = await decode_body(request, TeiEmbedSparseRequest)
    model = server.registry().get(None, SPARSE_EMBED)
    spec, encoder = model.spec, model.encoder
    texts = [data.inputs] if isinstance(data.inputs, str) else data.inputs
    if not texts:
        raise InvalidInput("inputs must not be empty", "inputs")
    check_texts(texts, server.config.max_inputs, "inputs")
    prompt = select_prompt(spec.prompts, None, data.prompt_name, spec.default_prompt_name)
    prompted, texts = encoder.prompted(texts, prompt)
    truncate = server.config.auto_truncate if data.truncate is None else data.truncate
    keep_end = data.truncation_direction == "Left"
    guard = RequestGuard(model.engine, request, server.config)
    sequences = await guard.tokenized(prompted.encode_off_loop(texts, None, truncate, keep_end, guard))
    # the engine's rows as the head declares them: a weight a token (bge-m3), or the vocabulary's a text
    output, asked = model.engine.output, model.rows(SPARSE_EMBED)
    num_rows, rows_of = (len(sequences), "texts")
    if output.token_rows:
        num_rows, rows_of = sum(map(len, sequences)), "tokens"
    width = asked.width(output)
    if num_rows * width > MAX_SPARSE_ROWS_FLOATS:
        raise OutputTooLarge(num_rows, rows_of, width, MAX_SPARSE_ROWS_FLOATS, "inputs")
    rows = await guard.run(sequences, rows=asked)
    server.metrics.count_prompt_tokens(model.name, sum(map(len, sequences)))
    if output.token_rows:
        lexical = lexical_outputs(rows, sequences, unused_token_ids(encoder.tokenizer, spec.path))
        weights = [(sorted(text), [text[token] for token in sorted(text)]) for text in lexical]
    else:
        weights = [nonzero_weights(row) for row in rows]
    return EncodedJson(sparse_json(weights))


@post(
    "/rerank",
    status_code=200,
    request_body=TeiRerankRequest,
    responses=documented(list[TeiRank], "the texts' indexes and scores, most relevant first"),
)
async def rerank_tei(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """text-embeddings-inference's rerank: a bare list of {index, score[, text]}, most relevant first;
    `raw_scores` gives the model's raw score."""
    data = await decode_body(request, TeiRerankRequest)
    model = server.registry().get(None, RERANK)
    check_query(data.query)
    check_documents(data.texts, server.config.max_documents, "texts")
    check_texts(data.texts, server.config.max_documents, "texts")
    truncate = server.config.auto_truncate if data.truncate is None else data.truncate
    # truncation keeps one window per text; otherwise long texts score the max of their chunks
    options = RerankOptions(
        max_chunks_per_doc=1 if truncate else DEFAULT_MAX_CHUNKS_PER_DOC,
        raw_scores=data.raw_scores,
        instruction=data.instruction,
    )
    guard = RequestGuard(model.engine, request, server.config)
    scores = await score_texts(model, data.query, data.texts, options, guard)
    return EncodedJson(
        [
            TeiRank(
                index=index, score=float(scores[index]), text=data.texts[index] if data.return_text else None
            )
            for index in ranking(scores, None)
        ]
    )


@post("/tokenize", status_code=200, request_body=TeiTokenizeRequest)
async def tokenize_tei(request: Request, server: NamedDependency[Server]) -> list[list[TeiToken]]:
    """text-embeddings-inference's tokenize: each text's tokens with their ids, text and character
    offsets."""
    data = await decode_body(request, TeiTokenizeRequest)
    model = server.registry().models[0]
    texts = [data.inputs] if isinstance(data.inputs, str) else data.inputs
    if not texts:
        raise InvalidInput("inputs must not be empty", "inputs")
    check_texts(texts, server.config.max_inputs, "inputs")
    spec = model.spec
    prompt = select_prompt(spec.prompts, None, data.prompt_name, None) if data.prompt_name else ""
    texts = [prompt + text for text in texts]
    max_chars = model.encoder.bound.max_chars(spec.max_seq_length)
    for index, text in enumerate(texts):  # as TEI refuses them: past what the window's tokens can span
        if len(text) > max_chars:
            raise InvalidInput(
                f"inputs[{index}] has {len(text)} characters, more than the {max_chars} that the model's "
                f"window of {spec.max_seq_length} tokens reads",
                "inputs",
            )
    encodings = model.encoder.tokenizer.encode_batch(texts, add_special_tokens=data.add_special_tokens)
    return [
        [
            TeiToken(id=token_id, text=token, special=True, start=None, stop=None)
            if special
            else TeiToken(id=token_id, text=text[start:stop], special=False, start=start, stop=stop)
            for token_id, token, special, (start, stop) in zip(
                encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets
            )
        ]
        for text, encoding in zip(texts, encodings)
    ]


@get("/info", sync_to_thread=False)
def info_tei(server: NamedDependency[Server]) -> TeiInfo:
    """text-embeddings-inference's info: the first served model, its dtype, pooling and limits."""
    model = server.registry().models[0]
    spec = model.spec
    if spec.task == "embed":
        model_type = {"embedding": {"pooling": TEI_POOLINGS[spec.pooling]}}
    elif spec.task == SPARSE_EMBED:
        model_type = {"embedding": {"pooling": "splade"}}
    else:
        labels = {str(index): f"LABEL_{index}" for index in range(spec.num_labels or 1)}
        model_type = {"reranker": {"id2label": labels, "label2id": {v: int(k) for k, v in labels.items()}}}
    engine_config = server.engine_settings
    return TeiInfo(
        model_id=model.name,
        model_dtype=engine_config.dtype,
        model_type=model_type,
        max_input_length=spec.max_seq_length,
        max_batch_tokens=engine_config.max_batch_tokens,
        max_client_batch_size=server.config.max_inputs,
        auto_truncate=server.config.auto_truncate,
        version=package_version(),
    )
