"""The start-up summary: one log block that says what the server serves, how and within which limits."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from api.config import ServerConfig
from engine.checkpoint.spec import ModelSpec
from engine.config import LARGE_TOKEN_STEP, SMALL_TOKEN_LIMIT, SMALL_TOKEN_STEP, EngineConfig

# how the start-up summary names the implementation a model runs on
IMPLEMENTATIONS = {"posy": "posy's packed model", "transformers": "through transformers"}


def startup_summary(
    config: ServerConfig,
    engine_config: EngineConfig,
    models: Sequence[tuple[Sequence[str], ModelSpec, Mapping[str, str]]],
    num_replicas: int,
) -> str:
    """`models`: each model's served names, spec and its engine's describe()."""
    scheme_host = f"http://{config.host}:{config.port}"
    auth = "API key required" if config.api_key else "no API key"
    lines = [f"posy serving on {scheme_host} ({auth})"]
    for names, spec, description in models:
        others = [name for name in names if name != spec.name]
        aliases = f" as {', '.join(others)}" if others else ""
        lines.append(
            f"  model {spec.name}{aliases}: {spec.architecture} ({IMPLEMENTATIONS[spec.implementation]}), "
            f"{_task(spec)}, window {spec.max_seq_length}"
        )
        out = config.engine_process or config.api_workers > 1 or num_replicas > 1
        replicas = (
            f"{num_replicas} replica"
            + ("s" if num_replicas > 1 else "")
            + (
                " in processes of their own"
                if out and num_replicas > 1
                else " in its own process"
                if out
                else ""
            )
        )
        gateways = f"{config.api_workers} gateway process" + ("es" if config.api_workers > 1 else "")
        if spec.images is not None:
            gateways += f" (images decoded on {config.image_threads} threads each)"
        lines.append(
            f"    {engine_config.device} {engine_config.dtype}"
            + (
                " with fp8 projections (weights per channel, inputs per token), "
                if engine_config.quantization == "fp8"
                else ", "
            )
            + f"attention {description.get('attention_backend')}, "
            f"CUDA graphs {description.get('cuda_graphs', 'off')}, {replicas}, {gateways}"
        )
    batch = engine_config.max_batch_tokens
    lines.append(
        f"  batches: up to {batch} tokens and {engine_config.max_batch_seqs} sequences"
        + (
            f"; graph token buckets by {SMALL_TOKEN_STEP} up to {min(SMALL_TOKEN_LIMIT, batch)}"
            + (f", then by {LARGE_TOKEN_STEP} up to {batch}" if batch > SMALL_TOKEN_LIMIT else "")
            if engine_config.uses_cuda_graphs
            else ""
        )
    )
    timeout = f"{config.request_timeout:g} s timeout" if config.request_timeout > 0 else "no timeout"
    lines.append(
        f"  limits: {engine_config.max_queue_tokens} queued tokens per replica (then 429), "
        f"{config.max_inputs} inputs and {config.max_request_tokens} tokens a request, "
        f"{config.max_body_bytes // 2**20} MiB bodies, {timeout}"
        + (", over-long inputs truncated" if config.auto_truncate else ", over-long inputs refused")
        + (", OpenAI token-id inputs taken" if config.accept_token_ids else "")
    )
    return "\n".join(lines)


def _task(spec: ModelSpec) -> str:
    if spec.task == "embed":
        normalized = ", normalized" if spec.normalize else ""
        return f"embeddings of {spec.output_dim} dimensions ({spec.pooling} pooling{normalized})"
    if spec.task == "token_embed":
        return f"token vectors of {spec.output_dim} dimensions (ColBERT)"
    if spec.task == "sparse_embed":
        return f"sparse weights over {spec.output_dim} tokens"
    if spec.listwise is not None:
        return "rerank scores, listwise (the documents in one prompt)"
    if spec.task == "score":
        return "rerank scores"
    return f"{spec.task} rows of {spec.output_dim} values (/pooling with task {spec.task})"  # a head's own
