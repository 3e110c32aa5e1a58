"""POST /v1/embeddings (and /embeddings): OpenAI's embeddings API, and Perplexity's (its int8 and binary
encodings, its usage cost)."""

from __future__ import annotations

import numpy as np
from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.encoding import PERPLEXITY_ENCODINGS, check_dimensions, encode_vectors, truncate_dimensions
from api.errors import InvalidInput
from api.guard import RequestGuard
from api.image_inputs import embed_items
from api.inputs import normalize_input
from api.late_chunking import late_chunked_vectors
from api.models import EMBED, ServedModel
from api.prompts import select_prompt
from api.responses import EncodedJson, documented
from api.schemas.openai import Embedding, EmbeddingRequest, EmbeddingResponse, Usage
from api.schemas.perplexity import Cost
from api.server import Server

# LangChain's OpenAIEmbeddings sends tiktoken's ids unless told otherwise; ids < the vocabulary size would
# pass every check and embed other text, so that ids are taken only where the operator said they fit
TOKEN_IDS_REFUSED = (
    "input is token ids, and this server takes text: ids from another tokenizer (tiktoken's, which "
    "LangChain's OpenAIEmbeddings sends unless check_embedding_ctx_length=False) would embed other text. "
    "Send the texts as strings, or, for ids of {model}'s own tokenizer (POST /tokenize gives them), start "
    "the server with --accept-token-ids"
)


@post(
    ["/v1/embeddings", "/embeddings"],
    status_code=200,
    request_body=EmbeddingRequest,
    responses=documented(EmbeddingResponse, "the embeddings, in input order"),
)
async def create_embeddings(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """OpenAI's embeddings: one vector a text (or token-id list, or, for an image model, an image part),
    float or base64, or Perplexity's base64_int8 and base64_binary (base64_int8 by default for a model that
    quantizes natively, pplx-embed); `dimensions` shortens them. With `late_chunking`, the inputs are one
    document's chunks, read together."""
    data = await decode_body(request, EmbeddingRequest)
    inputs = normalize_input(data.input, server.config.max_inputs)
    model = server.registry().get(data.model, EMBED)
    check_dimensions(data.dimensions, model.spec.output_dim)
    encoder = model.encoder
    max_tokens, truncate = truncation(
        data.truncate_prompt_tokens, encoder.window, server.config.auto_truncate
    )
    guard = RequestGuard(model.engine, request, server.config)
    if data.late_chunking:
        vectors, num_tokens = await _late_chunked(model, inputs.texts, data, guard, max_tokens, truncate)
    elif inputs.parts is not None:  # texts and images
        spec = model.spec
        prompt = select_prompt(spec.prompts, data.input_type, data.prompt_name, spec.default_prompt_name)
        vectors, num_tokens = await embed_items(
            model, inputs.parts, guard, server.config.images, max_tokens, truncate, prompt=prompt or ""
        )
    else:
        if inputs.texts is not None:
            spec = model.spec
            prompt = select_prompt(spec.prompts, data.input_type, data.prompt_name, spec.default_prompt_name)
            prompted, texts = encoder.prompted(inputs.texts, prompt)
            sequences = await guard.tokenized(
                prompted.encode_off_loop(texts, max_tokens, truncate, admission=guard)
            )
        else:
            if not server.config.accept_token_ids:
                raise InvalidInput(TOKEN_IDS_REFUSED.format(model=model.name), "input")
            sequences = encoder.check_token_ids(inputs.token_ids or [], max_tokens, truncate)
        num_tokens = sum(map(len, sequences))
        vectors = await guard.run(sequences, rows=model.rows(EMBED))
    native = model.spec.native_quantization
    vectors = truncate_dimensions(vectors, data.dimensions, model.spec.normalize)
    server.metrics.count_prompt_tokens(model.name, num_tokens)
    # Perplexity's default where the model quantizes natively (its SDK sends no encoding_format: UNSET, falsy)
    encoding_format = data.encoding_format or ("base64_int8" if native is not None else "float")
    encoded = encode_vectors(vectors, encoding_format, native)
    # Perplexity's usage cost only in its shape, so that OpenAI's stays exactly OpenAI's
    perplexity = encoding_format in PERPLEXITY_ENCODINGS or native is not None
    response = EmbeddingResponse(
        data=[Embedding(index=index, embedding=vector) for index, vector in enumerate(encoded)],
        model=data.model or model.name,
        usage=Usage(prompt_tokens=num_tokens, total_tokens=num_tokens, cost=Cost() if perplexity else None),
    )
    return EncodedJson(response)


async def _late_chunked(
    model: ServedModel,
    texts: list[str] | None,
    data: EmbeddingRequest,
    guard: RequestGuard,
    max_tokens: int,
    truncate: bool,
) -> tuple[np.ndarray, int]:
    spec = model.spec
    if texts is None:
        raise InvalidInput("late_chunking takes texts, the chunks of one document", "late_chunking")
    if not model.engine.output.pools_spans:
        raise InvalidInput(
            f"late_chunking pools each chunk's tokens by their mean; the model '{model.name}' pools by "
            f"{spec.pooling}", "late_chunking",
        )  # fmt: skip
    prompt = select_prompt(spec.prompts, data.input_type, data.prompt_name, spec.default_prompt_name)
    return await late_chunked_vectors(model.encoder, texts, prompt, guard, max_tokens, truncate)


def truncation(truncate_prompt_tokens: int | None, window: int, auto_truncate: bool) -> tuple[int, bool]:
    """(token limit, whether to truncate to it instead of rejecting)."""
    if truncate_prompt_tokens is None:
        return window, auto_truncate
    if truncate_prompt_tokens == -1:
        return window, True
    if not 1 <= truncate_prompt_tokens <= window:
        raise InvalidInput(
            f"truncate_prompt_tokens must be -1 or between 1 and the model's window of {window}, "
            f"not {truncate_prompt_tokens}",
            "truncate_prompt_tokens",
        )
    return truncate_prompt_tokens, True
