"""POST /classify and /v1/classify: vLLM's classify API. A sequence classifier labels each text: its
probabilities over the labels (softmax; sigmoid of a single logit) and the most probable label's name."""

from __future__ import annotations

import time
import uuid

import numpy as np
from litestar import Request, post
from litestar.di import NamedDependency

from api.body import decode_body
from api.errors import InvalidInput
from api.guard import RequestGuard
from api.inputs import check_texts
from api.models import CLASSIFY
from api.responses import EncodedJson, documented
from api.routes.embeddings import truncation
from api.schemas.vllm import ClassifyData, ClassifyRequest, ClassifyResponse, ScoreUsage
from api.server import Server


@post(
    ["/classify", "/v1/classify"],
    status_code=200,
    request_body=ClassifyRequest,
    responses=documented(ClassifyResponse, "each text's label and probabilities, in input order"),
)
async def classify(request: Request, server: NamedDependency[Server]) -> EncodedJson:
    """vLLM's classify: a sequence classifier's label and probabilities for each text."""
    data = await decode_body(request, ClassifyRequest)
    texts = [data.input] if isinstance(data.input, str) else data.input
    if not texts:
        raise InvalidInput("input must not be empty", "input")
    check_texts(texts, server.config.max_inputs, "input")
    model = server.registry().get(data.model, CLASSIFY)
    encoder = model.encoder
    auto_truncate = server.config.auto_truncate
    max_tokens, truncate = truncation(data.truncate_prompt_tokens, encoder.window, auto_truncate)
    guard = RequestGuard(model.engine, request, server.config)
    sequences = await guard.tokenized(encoder.encode_off_loop(texts, max_tokens, truncate, admission=guard))
    probabilities = probabilities_of(await guard.run(sequences))
    labels = label_names(model.spec.hf_config, probabilities.shape[1])
    num_tokens = sum(map(len, sequences))
    server.metrics.count_prompt_tokens(model.name, num_tokens)
    response = ClassifyResponse(
        id=f"classify-{uuid.uuid4().hex}",
        created=int(time.time()),
        model=data.model or model.name,
        data=[
            ClassifyData(index, labels[int(np.argmax(row))], row.tolist(), len(row))
            for index, row in enumerate(probabilities)
        ],
        usage=ScoreUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
    )
    return EncodedJson(response)


def probabilities_of(logits: np.ndarray) -> np.ndarray:
    """[n, num_labels] logits -> probabilities: softmax over two or more labels, sigmoid of one."""
    logits = logits.astype(np.float64)
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logits))
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def label_names(hf_config, num_labels: int) -> list[str]:
    """The config's id2label, LABEL_i where it names none."""
    names = {int(key): value for key, value in (getattr(hf_config, "id2label", None) or {}).items()}
    return [names.get(index, f"LABEL_{index}") for index in range(num_labels)]
