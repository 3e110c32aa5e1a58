"""`posy serve ...`: flags (each with a POSY_* environment twin) -> ServerConfig -> uvicorn; `posy embed`
in api/bulk/cli.py."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from api.config import (
    BODY_TIMEOUT_S,
    DRAIN_GRACE_S,
    HEADER_TIMEOUT_S,
    MAX_BODY_BYTES,
    MAX_INPUTS,
    MAX_REQUEST_TOKENS,
    REQUEST_TIMEOUT_S,
    SHUTDOWN_TIMEOUT_S,
    EngineFlags,
    ServerConfig,
)
from api.images import MAX_IMAGE_PIXELS, ImageLimits
from api.refusal import cannot_serve, serve_or_refuse
from engine.checkpoint.source import POOLING_FLAGS, ModelFlags
from engine.config import MODEL_IMPLS


def build_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The `posy` parser and its `serve` subcommand."""
    parser, serve, _ = build_parsers()
    return parser, serve


def build_parsers() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, argparse.ArgumentParser]:
    """The `posy` parser and its `serve` and `embed` subcommands."""
    from api.bulk.cli import add_embed_command

    parser = argparse.ArgumentParser(prog="posy", description="Embedding and reranking server")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve OpenAI embeddings and Cohere / TEI rerank APIs")
    serve.add_argument(
        "--model",
        action="append",
        help="model folder or hub id; repeat to serve several (default: the bundled all-MiniLM-L6-v2, which "
        "'bundled' or 'all-MiniLM-L6-v2' names beside others)",
    )
    serve.add_argument(
        "--served-model-name",
        action="append",
        help="name(s) clients use; with several "
        "--model, the Nth value names the Nth model and may list aliases as a,b",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--replicas",
        type=int,
        help="engine replicas per model (default: one per visible GPU, one on CPU); more than one run as "
        "worker processes that large requests are split over",
    )
    serve.add_argument(
        "--api-workers",
        type=_at_least(1, int),
        help="gateway processes serving the port, so that JSON and tokenization use several cores; above 1 "
        "the engines run as replica processes shared by all of them (default: from the host's usable cores "
        "on a GPU host, 1 on the CPU)",
    )
    serve.add_argument(
        "--engine-process",
        choices=["auto", "on", "off"],
        default="auto",
        help="on: the engine runs in a process of its own even beside one gateway; off: inside the gateway "
        "(one gateway, one replica); auto: from the host",
    )
    serve.add_argument(
        "--auto-truncate", action="store_true", help="truncate over-long inputs instead of a 400"
    )
    serve.add_argument(
        "--shared-prefixes",
        choices=["on", "off"],
        default="on",
        help="on: a causal judge's rerank pairs run their shared prompt and query once a batch, where the "
        "tokens that saves make it pay (400 with CUDA graphs); off: always as whole pairs",
    )
    serve.add_argument(
        "--accept-token-ids",
        action="store_true",
        help="let /v1/embeddings take token ids (the served model's own; by default a 400)",
    )
    serve.add_argument(
        "--allow-image-urls",
        action="store_true",
        help="fetch images that requests name by http(s) URL (by default only data URIs and base64)",
    )
    serve.add_argument(
        "--max-image-pixels",
        type=int,
        default=MAX_IMAGE_PIXELS,
        help="the largest image a request may send, in decoded pixels (width x height)",
    )
    serve.add_argument("--api-key", help="require Authorization: Bearer KEY")
    serve.add_argument("--max-inputs", type=int, default=MAX_INPUTS, help="inputs per embeddings request")
    serve.add_argument("--max-body-bytes", type=int, default=MAX_BODY_BYTES)
    serve.add_argument(
        "--max-request-tokens",
        type=_at_least(1, int),
        default=MAX_REQUEST_TOKENS,
        help="tokens a request may send to the model after tokenization, rerank pairs included "
        "(larger: 400, TEI 413)",
    )
    serve.add_argument(
        "--request-timeout",
        type=_at_least(0, float),
        default=REQUEST_TIMEOUT_S,
        help="seconds from a request's arrival after which, still waiting on the model, it gets a 504 "
        "and its queued work is dropped; 0: no limit",
    )
    serve.add_argument(
        "--header-timeout",
        type=_at_least(0, float),
        default=HEADER_TIMEOUT_S,
        help="seconds a request's head may take to arrive whole, from its connection's accept (on a "
        "kept-alive connection, from its first byte): then a 408 and the connection closes (one that sent "
        "nothing just closes); 0: no limit",
    )
    serve.add_argument(
        "--body-timeout",
        type=_at_least(0, float),
        default=BODY_TIMEOUT_S,
        help="seconds a request's body may take to arrive whole from the end of its head, however steadily "
        "it comes: then a 408 and the connection closes; 0: no limit",
    )
    serve.add_argument(
        "--max-connections",
        type=_at_least(1, int),
        help="connections each gateway process holds open; past it a new connection's request gets a 503 "
        "with Retry-After and the connection closes (default: half the process's open-file limit)",
    )
    serve.add_argument(
        "--drain-grace",
        type=float,
        default=DRAIN_GRACE_S,
        help="seconds after SIGTERM during which /ready and new requests get 503 before the listener closes",
    )
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=SHUTDOWN_TIMEOUT_S,
        help="seconds admitted requests get to finish once the listener has closed",
    )
    serve.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="serve as a Ray Serve deployment, replicas across the cluster's hosts (no ADDRESS: the "
        "cluster this machine belongs to, or a local one)",
    )
    serve.add_argument(
        "--ray-min-replicas", type=_at_least(1, int), help="Serve replicas (default: one per GPU, 1 on CPUs)"
    )
    serve.add_argument(
        "--ray-max-replicas", type=_at_least(1, int), help="autoscale up to this many (default: the minimum)"
    )
    add_engine_flags(serve)
    embed = add_embed_command(commands, add_engine_flags)
    return parser, serve, embed


def add_engine_flags(command: argparse.ArgumentParser) -> None:
    """The model and engine flags `posy serve` and `posy embed` share."""
    command.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    command.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    command.add_argument(
        "--attention-backend",
        default="auto",
        choices=["auto", "torch", "torch-varlen", "flashinfer", "flash-attn", "triton"],
        help="chosen once at start-up and logged; auto picks by device, head size and graphs",
    )
    command.add_argument(
        "--cuda-graphs",
        default="lazy",
        choices=["off", "lazy", "eager-warmup"],
        help="whole-model CUDA graphs: captured on a bucket's second hit, or all at start-up",
    )
    command.add_argument(
        "--quantization",
        default="none",
        choices=["none", "fp8"],
        help="fp8: the layers' projections in FP8 (weights per channel, inputs per token), on a GPU of "
        "compute capability 8.9 or later; off by default (on the CPU it is emulated, for accuracy checks)",
    )
    command.add_argument(
        "--bidirectional",
        action="store_true",
        help="run a decoder embedder (Qwen3) without its causal mask, mean-pooled (pplx-embed style); "
        "a config with is_causal: false does this by itself",
    )
    command.add_argument("--max-model-len", type=int, help="cap every model's window at this many tokens")
    command.add_argument(
        "--pooling",
        choices=list(POOLING_FLAGS),
        help="as TEI's --pooling: cls, mean or last-token pool an embedding model in place of its folder's "
        "pooling; splade serves a *ForMaskedLM checkpoint as SPLADE (the max over its tokens of "
        "log(1 + relu(logits)), as sentence-transformers' SparseEncoder runs such a folder)",
    )
    command.add_argument(
        "--model-impl",
        default="auto",
        choices=list(MODEL_IMPLS),
        help="posy's packed model, or transformers' own for any architecture it loads; auto: posy's where "
        "posy has the family, transformers' otherwise",
    )
    command.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="let the transformers fallback run modeling code that ships inside the checkpoint folder",
    )
    command.add_argument(
        "--max-batch-tokens",
        type=int,
        help="tokens per forward pass (16384 on GPU, 4096 on CPU, raised to the largest model window)",
    )
    command.add_argument("--max-batch-seqs", type=int, default=512)
    command.add_argument(
        "--max-queue-tokens", type=int, help="queued tokens before 429 (64 x max-batch-tokens)"
    )
    command.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def _at_least(minimum: float, kind: type) -> Callable[[str], float]:
    def parse(value: str) -> float:
        number = kind(value)
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return number

    parse.__name__ = kind.__name__  # argparse's "invalid int value"
    return parse


def apply_environment(command: argparse.ArgumentParser, environ: Mapping[str, str]) -> None:
    """POSY_PORT=9000 works like --port 9000 (repeated flags: ;-separated); the command line wins."""
    defaults: dict[str, object] = {}
    for action in command._actions:
        value = environ.get("POSY_" + action.dest.upper())
        if value is None or not action.option_strings or action.dest == "help":
            continue
        if isinstance(action, argparse._StoreTrueAction):
            defaults[action.dest] = value.lower() in ("1", "true", "yes", "on")
        elif isinstance(action, argparse._AppendAction):
            defaults[action.dest] = [part for part in value.split(";") if part]
        else:
            defaults[action.dest] = action.type(value) if action.type else value
    command.set_defaults(**defaults)


# --model values that name the bundled all-MiniLM-L6-v2 (where no folder of that name is at hand)
BUNDLED_NAMES = ("bundled", "all-MiniLM-L6-v2")


def bundled_or(model: str) -> str | None:
    """None (the bundled model) for a name of it, else the value as given."""
    return None if model in BUNDLED_NAMES and not Path(model).is_dir() else model


def engine_flags(args: argparse.Namespace) -> EngineFlags:
    """add_engine_flags' engine flags; --shared-prefixes is `posy serve`'s."""
    shared_prefixes = getattr(args, "shared_prefixes", "on") == "on"
    return EngineFlags(
        device=args.device,
        dtype=args.dtype,
        attention_backend=args.attention_backend,
        cuda_graphs=args.cuda_graphs,
        quantization=args.quantization,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_seqs=args.max_batch_seqs,
        max_queue_tokens=args.max_queue_tokens,
        shared_prefixes=shared_prefixes,
    )


def model_flags(args: argparse.Namespace) -> ModelFlags:
    """add_engine_flags' flags of how a model is read."""
    return ModelFlags(
        bidirectional=args.bidirectional,
        max_model_len=args.max_model_len,
        model_impl=args.model_impl,
        trust_remote_code=args.trust_remote_code,
        pooling=args.pooling,
    )


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    models = tuple(map(bundled_or, args.model)) if args.model else (None,)
    names = tuple(tuple(part for part in value.split(",") if part) for value in args.served_model_name or ())
    return ServerConfig(
        models=models,
        served_model_names=names,
        host=args.host,
        port=args.port,
        engine=engine_flags(args),
        model_flags=model_flags(args),
        replicas=args.replicas,
        api_workers=args.api_workers or 1,
        auto_truncate=args.auto_truncate,
        accept_token_ids=args.accept_token_ids,
        images=ImageLimits(max_pixels=args.max_image_pixels, allow_urls=args.allow_image_urls),
        api_key=args.api_key,
        max_inputs=args.max_inputs,
        max_body_bytes=args.max_body_bytes,
        max_request_tokens=args.max_request_tokens,
        request_timeout=args.request_timeout,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        max_connections=args.max_connections,
        log_level=args.log_level,
        drain_grace=args.drain_grace,
        shutdown_timeout=args.shutdown_timeout,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser, serve, embed = build_parsers()
    apply_environment(serve, os.environ)
    apply_environment(embed, os.environ)
    args = parser.parse_args(argv)
    log_format = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=args.log_level.upper(), format=log_format)
    if args.command == "embed":
        from api.bulk.cli import run_embed

        return run_embed(args)
    config = config_from_args(args)
    if args.ray is not None:
        from api.ray_serve import serve_on_ray

        return serve_on_ray(config, args.ray, args.ray_min_replicas, args.ray_max_replicas)
    from api.layout import OMP_WAIT_POLICY, choose_layout, image_threads, tokenizer_threads, usable_cores
    from api.tokenize import TOKENIZERS_PARALLELISM

    os.environ.setdefault(*OMP_WAIT_POLICY)  # before torch is first imported, here and in what starts here
    from engine.device import resolve_device
    from engine.replicas.replica_set import replica_count

    try:
        device = resolve_device(config.engine.device)
        num_replicas = replica_count(config.replicas, device)
    except ValueError as error:
        return cannot_serve(error)
    engine_process = {"auto": None, "on": True, "off": False}[args.engine_process]
    if engine_process is False and (num_replicas > 1 or (args.api_workers or 1) > 1):
        return cannot_serve("--engine-process off needs one replica and one gateway")
    cores = usable_cores()
    layout = choose_layout(device, cores, num_replicas, args.api_workers, engine_process)
    config = dataclasses.replace(
        config,
        api_workers=layout.api_workers,
        engine_process=layout.engine_process,
        tokenizer_threads=tokenizer_threads(cores, layout.api_workers),
        image_threads=image_threads(cores),
    )
    where = "in its own process" if layout.engine_process else "in process"
    plural = "es" if layout.api_workers > 1 else ""
    logging.getLogger("api.layout").info(
        "layout: %d gateway process%s, engine %s (%s)", layout.api_workers, plural, where, layout.reason
    )
    # the encoders split large inputs over their own threads (api/tokenize.py); for every gateway spawned
    # from here too
    os.environ.setdefault(TOKENIZERS_PARALLELISM, "false")
    several_processes = config.api_workers > 1 or num_replicas > 1 or config.engine_process
    shared_metrics = None
    if several_processes:
        # before prometheus_client is first imported, here and in every process spawned from here
        shared_metrics = tempfile.mkdtemp(prefix="posy-metrics-")
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = shared_metrics
    try:
        return _serve(config)
    finally:
        if shared_metrics is not None:
            shutil.rmtree(shared_metrics, ignore_errors=True)


def _serve(config: ServerConfig) -> int:
    from api.app import create_app
    from api.drain import run_server
    from api.server import Server
    from api.workers import GatewaySupervisor
    from engine.device import DTYPES
    from engine.errors import EngineError
    from engine.weights import check_checkpoint

    server = Server(config)
    try:
        specs = server.resolve()
        dtype = DTYPES[server.engine_config(max(spec.max_seq_length for spec in specs)).dtype]
        # a checkpoint posy refuses fails here, before the port opens or a replica process starts
        for spec in specs:
            check_checkpoint(spec, dtype)
    except (EngineError, ValueError) as error:
        return cannot_serve(error)
    if config.api_workers > 1:
        try:
            return GatewaySupervisor(config).run()
        except EngineError as refusal:  # a replica that would not start
            return cannot_serve(refusal)
    app = create_app(config, server)
    return serve_or_refuse(server, lambda: run_server(app, server, config))


if __name__ == "__main__":
    sys.exit(main())
