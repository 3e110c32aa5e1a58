"""The online suite: what a client reaches through HTTP, side by side with the engine's own figures in the
same run, on the BERT-base shape (random weights), with clients that cost next to nothing (raw
keep-alive HTTP/1.1, one request in flight each, in processes of their own; an httpx client beside them as
"a Python SDK client"). `posy serve` runs in its default layout for the host, then with the engine in a
process of its own beside one gateway and inside it, and under an open-loop overload; Infinity, where
POSY_INFINITY_SITE holds it, serves the same checkpoint under the same loads. The server's timing
headers (x-queue-time, ...) are recorded beside each case. `--smoke`: tiny shapes on the CPU."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.baseline import min_cosine
from benchmarks.checkpoints import BERT_SHAPES, words
from benchmarks.gateway import process_rss_mib, rss_mib, server_pid
from benchmarks.infinity_peer import infinity_site, sentence_transformers_v3_files, serve_infinity
from benchmarks.load import LoadResult, embed_over_http, run_clients
from benchmarks.open_loop import run_open_loop
from benchmarks.records import RunContext, SuiteOutcome, engine_backend

SERVED_NAME = "bench"
MIN_COSINE = 0.999  # bf16 against the fp32 reference
NUM_SPECIAL_TOKENS = 2
HOP_ROUNDS = 4
PARTS = ("default", "hop", "overload", "infinity")  # --parts
IDLE_BETWEEN_S = 0.001  # about the pause between a batch-1 client's requests, on the engine's side


@dataclass(frozen=True, slots=True)
class Plan:
    shape: str
    device: str
    dtype: str
    one_tokens: int  # the batch-1 text, special tokens included
    many_texts: int  # texts a request of the throughput case
    many_tokens: int
    window_s: float  # timed window of each closed-loop case
    warmup_s: float
    levels: tuple[int, ...]  # raw client processes of the concurrency case
    num_many_clients: int
    overload_s: float
    overload_timeout_s: float
    overload_factor: float  # the offered rate over the measured saturation rate
    overload_senders: int


FULL = Plan("bert-base", "cuda", "bfloat16", 128, 100, 50, 5.0, 1.0, (1, 16), 4, 30.0, 5.0, 4.0, 8)
SMOKE = Plan("smoke", "cpu", "float32", 16, 8, 12, 1.0, 0.2, (1, 2), 2, 2.0, 5.0, 2.0, 2)


def body(texts: list[str] | str) -> bytes:
    return json.dumps({"model": SERVED_NAME, "input": texts, "encoding_format": "base64"}).encode()


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    from benchmarks.baseline import Baseline
    from benchmarks.checkpoints import save_bert
    from benchmarks.live_server import serve

    plan = SMOKE if getattr(options, "smoke", False) else FULL
    rng = random.Random(0)
    folder = Path(tempfile.mkdtemp(prefix="posy-online-"))
    checkpoint = save_bert(folder / "model", plan.shape)
    sentence_transformers_v3_files(checkpoint.folder, BERT_SHAPES[plan.shape]["hidden_size"], 512)
    one = words(plan.one_tokens - NUM_SPECIAL_TOKENS, rng)
    many = [
        [words(plan.many_tokens - NUM_SPECIAL_TOKENS, rng) for _ in range(plan.many_texts)] for _ in range(8)
    ]
    gpu = torch.cuda.get_device_name() if plan.device == "cuda" else None
    records, failures = [], []

    engine_one_ms, engine_idle_ms, engine_rate, backend = engine_figures(
        checkpoint, plan, one, many[0], options
    )
    context = RunContext(options.suite, f"{plan.shape}-shape (random weights)", gpu, backend)
    records += [
        context.record("engine-b1", "latency_p50_ms", engine_one_ms, "ms"),
        context.record("engine-b1-after-idle", "latency_p50_ms", engine_idle_ms, "ms"),
        context.record(
            f"engine-{plan.many_texts}x{plan.many_tokens}", "tokens_per_s", engine_rate, "tokens/s"
        ),
    ]
    print(
        f"engine: batch 1 x {plan.one_tokens} p50 {engine_one_ms:.3f} ms ({engine_idle_ms:.3f} after "
        f"{1000 * IDLE_BETWEEN_S:g} ms idle); {engine_rate / 1e6:.3f}M tokens/s"
    )

    baseline = Baseline(checkpoint, plan.device, torch.float32)
    flags = ("--device", plan.device, "--dtype", plan.dtype, "--served-model-name", SERVED_NAME)
    one_bodies, many_bodies = [body(one)], [body(texts) for texts in many]
    posy: dict[str, float] = {}

    parts = set(PARTS if getattr(options, "parts", None) is None else options.parts.split(","))
    if parts - set(PARTS):
        raise ValueError(f"the online suite's parts are {', '.join(PARTS)}")
    saturation = None
    if "default" in parts:
        saturation, context = default_layout(
            checkpoint, plan, flags, baseline, one_bodies, many_bodies, many[0], engine_one_ms,
            engine_rate, context, gpu, options, records, failures, posy,
        )  # fmt: skip
    if "hop" in parts:
        records += replica_hop(checkpoint, plan, flags, one_bodies, engine_one_ms, context)
    if "overload" in parts:
        if saturation is None:
            raise ValueError("the online suite's overload part needs its default part's saturation")
        # open loop at a multiple of the measured saturation, a short timeout
        timeout = str(int(plan.overload_timeout_s))
        with serve(checkpoint.folder, *flags, "--request-timeout", timeout) as url:
            records += overload(url, many_bodies, saturation, plan, context)
    if "infinity" in parts:
        failures += infinity_cases(
            checkpoint.folder, plan, one_bodies, many_bodies, baseline, many[0], posy, context, records
        )
    return SuiteOutcome(records, failures)


def default_layout(
    checkpoint,
    plan,
    flags,
    baseline,
    one_bodies,
    many_bodies,
    texts,
    engine_one_ms,
    engine_rate,
    context,
    gpu,
    options,
    records,
    failures,
    posy,
):
    """The default layout for this host: parity, batch 1 (raw and httpx), the concurrency levels and the
    throughput case; (the throughput case's requests/s, the context of the served backend)."""
    from benchmarks.live_server import serve, served_info

    with serve(checkpoint.folder, *flags) as url:
        layout = (
            f"{served_info(url, 'gateways')} gateways, engine process {served_info(url, 'engine_process')}"
        )
        print(f"posy default layout: {layout}")
        context = RunContext(options.suite, context.model, gpu, served_info(url, "attention_backend"))
        failures += parity(url, baseline, texts, "posy")
        b1 = run_clients(url, [one_bodies], duration_s=plan.window_s, warmup_s=plan.warmup_s)
        records += case_records(context, "b1-raw", b1, engine_one_ms)
        posy["b1_p50_ms"] = b1.latency_ms(50)
        sdk = run_clients(url, [one_bodies], duration_s=plan.window_s, warmup_s=plan.warmup_s, client="httpx")
        records += case_records(context, "b1-httpx", sdk, engine_one_ms)
        for level in plan.levels[1:]:
            load = run_clients(url, [one_bodies] * level, duration_s=plan.window_s, warmup_s=plan.warmup_s)
            records += case_records(context, f"clients-{level}-raw", load)
            posy[f"clients_{level}_per_s"] = load.requests_per_s
        throughput = run_clients(
            url, [many_bodies] * plan.num_many_clients, duration_s=plan.window_s, warmup_s=plan.warmup_s
        )
        many_case = f"clients-{plan.num_many_clients}-{plan.many_texts}x{plan.many_tokens}"
        records += case_records(context, many_case, throughput, tokens_baseline=engine_rate)
        posy["many_tokens_per_s"] = throughput.tokens_per_s
        saturation = throughput.requests_per_s
    return saturation, context


def replica_hop(checkpoint, plan, flags, one_bodies, engine_one_ms, context) -> list:
    """The engine in a replica process beside one gateway, and inside it: the replica hop's cost. Both
    servers run at once and take turns, HOP_ROUNDS windows each: the hop is the median of the rounds'
    differences (two servers measured one after the other differed by up to 0.18 ms, the processes
    landing on other cores of the host)."""
    from benchmarks.live_server import serve

    records = []
    layouts = {"replica": "on", "in-process": "off"}
    rounds: dict[str, list] = {name: [] for name in layouts}
    with contextlib.ExitStack() as servers:
        urls = {
            name: servers.enter_context(
                serve(checkpoint.folder, *flags, "--api-workers", "1", "--engine-process", engine_process)
            )
            for name, engine_process in layouts.items()
        }
        window = plan.window_s / HOP_ROUNDS
        for _ in range(HOP_ROUNDS):
            for name, url in urls.items():
                rounds[name].append(run_clients(url, [one_bodies], duration_s=window, warmup_s=plan.warmup_s))
    hops = {}
    for name, results in rounds.items():
        load = LoadResult.joined(results)
        records += case_records(context, f"b1-raw-{name}", load, engine_one_ms)
        hops[name] = load.latency_ms(50)
    hop = statistics.median(
        replica.latency_ms(50) - in_process.latency_ms(50)
        for replica, in_process in zip(rounds["replica"], rounds["in-process"])
    )
    records.append(context.record("replica-hop", "latency_p50_ms", hop, "ms"))
    print(
        f"replica hop: {hop:.3f} ms (b1 p50 {hops['replica']:.3f} with the engine in its own process, "
        f"{hops['in-process']:.3f} in process)"
    )
    return records


def engine_figures(
    checkpoint, plan: Plan, one: str, many: list[str], options
) -> tuple[float, float, float, str]:
    """The engine's own figures, as the latency and bulk suites take them: batch-1 step to pooled row on
    the host (p50 ms; back to back, then each after IDLE_BETWEEN_S of idling), and tokens/s at saturation
    on requests like the throughput case's."""
    from api.tokenize import TextEncoder
    from benchmarks.timing import timed
    from engine.batch import pack
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import sized_for

    spec = resolve_model(str(checkpoint.folder))
    encoder = TextEncoder(spec.tokenizer_path, spec.max_seq_length, spec.vocab_size)
    engine = build_engine(spec, sized_for(spec.max_seq_length, plan.device, plan.dtype, options.backend))
    sequence = encoder.encode([one], None, False)
    requests = [encoder.encode(many, None, False)] * 128  # within the default queue of 64 full batches
    loop = asyncio.new_event_loop()

    async def saturate() -> None:
        await asyncio.gather(*(engine.run(request) for request in requests))

    try:
        for _ in range(3):  # eager, capture, replay
            engine.runner.step(pack(sequence)).result()
        repeats = 200 if plan.device == "cuda" else 20
        step = lambda: engine.runner.step(pack(sequence)).result()  # noqa: E731
        samples = timed(step, repeats, plan.device)
        # the same after a pause like the one between a client's requests (the engine waits in between)
        after_idle = timed(step, repeats, plan.device, idle_s=IDLE_BETWEEN_S)
        loop.run_until_complete(saturate())
        seconds = []
        for _ in range(max(3, options.rounds)):
            started = time.perf_counter()
            loop.run_until_complete(saturate())
            seconds.append(time.perf_counter() - started)
        num_tokens = sum(map(len, requests[0])) * len(requests)
        return (
            1000 * statistics.median(samples),
            1000 * statistics.median(after_idle),
            num_tokens / statistics.median(seconds),
            engine_backend(engine),
        )
    finally:
        engine.stop()
        loop.close()


def parity(url: str, baseline, texts: list[str], server: str) -> list[str]:
    vectors, _ = embed_over_http(url, texts, SERVED_NAME)
    cosine = min_cosine(vectors, baseline.embed(texts))
    print(f"{server}: min cosine {cosine:.6f} against the fp32 reference")
    return [] if cosine >= MIN_COSINE else [f"{server}: min cosine {cosine:.6f} < {MIN_COSINE}"]


def case_records(
    context: RunContext,
    case: str,
    load: LoadResult,
    latency_baseline: float | None = None,
    tokens_baseline: float | None = None,
) -> list:
    """A closed-loop case: latency (against the engine's batch-1 figure), throughput (against the
    engine's rate), errors, and the server's stage timings."""
    p50, p99 = load.latency_ms(50), load.latency_ms(99)
    records = [
        context.record(case, "latency_p50_ms", p50, "ms", latency_baseline),
        context.record(case, "latency_p99_ms", p99, "ms"),
        context.record(case, "requests_per_s", load.requests_per_s, "requests/s"),
        context.record(case, "tokens_per_s", load.tokens_per_s, "tokens/s", tokens_baseline),
        context.record(case, "errors", len(load.errors), "requests"),
    ]
    stages = []
    for stage in ("total", "tokenization", "queue", "inference"):
        value = load.stage_ms(stage)
        if value is not None:
            records.append(context.record(case, f"server_{stage}_p50_ms", value, "ms"))
            stages.append(f"{stage} {value:.3f}")
    over = f", {p50 - latency_baseline:+.3f} ms over the engine" if latency_baseline else ""
    rate = f", {load.tokens_per_s / tokens_baseline:.3f} of the engine's rate" if tokens_baseline else ""
    print(
        f"{case}: p50 {p50:.3f} ms{over}, p99 {p99:.3f} ms, {load.requests_per_s:.0f} req/s, "
        f"{load.tokens_per_s / 1e6:.3f}M tokens/s{rate}, {len(load.errors)} errors; server p50s: "
        + ", ".join(stages)
    )
    if load.errors:
        print(f"  first error: {load.errors[0]}")
    return records


def overload(url: str, bodies: list[bytes], saturation: float, plan: Plan, context: RunContext) -> list:
    rate = plan.overload_factor * saturation
    pid = server_pid(url)
    # the allocators grow once, to what the work in flight holds at the deadline: a window as long as the
    # measured one first (on the CPU, one gateway grew 100 MiB in a first window of 20 s, < 10 in each next)
    run_open_loop(url, bodies, rate, plan.overload_s, plan.overload_senders)
    before, each_before = rss_mib(pid), process_rss_mib(pid)
    # memory sampled through the window: in-flight work holds memory while the queue fills up to the
    # deadline, so flat means no growth over the window's second half
    samples: list[float] = []
    done = threading.Event()
    sampler = threading.Thread(target=_sample_rss, args=(pid, plan.overload_s / 10, done, samples))
    sampler.start()
    result = run_open_loop(url, bodies, rate, plan.overload_s, plan.overload_senders)
    done.set()
    sampler.join()
    growth, each_after = rss_mib(pid) - before, process_rss_mib(pid)
    second_half = samples[-1] - samples[len(samples) // 2] if len(samples) > 2 else 0.0
    print(f"  memory through the window (MiB): {[round(sample) for sample in samples]}")
    grew = {name: round(each_after[name] - mib) for name, mib in each_before.items() if name in each_after}
    print(f"  memory by process (MiB, growth): {grew}")
    if result.failures:
        print(f"  no answer for {len(result.failures)}: {sorted(set(result.failures))[:5]}")
    others = len(result.answers) - result.count(200) - result.count(429)
    p99 = result.latency_ms(200, 99)
    server_p99 = result.server_ms(200, 99)  # the rest of the client's p99 is outside the server's clock
    refused_p99 = result.latency_ms(429, 99)  # refusals up front are answered at once, not after a wait
    tail = result.slowest_stages_ms(200, 0.01)
    case = f"overload-{plan.overload_factor:g}x"
    print(
        f"{case}: {rate:.0f} requests/s offered for {plan.overload_s:.0f} s: {result.count(200)} x 200, "
        f"{result.count(429)} x 429 ({result.num_429_without_retry_after} without Retry-After), {others} "
        f"others {sorted(result.statuses)}, admitted p99 {p99 or 0:.0f} ms (the server's own "
        f"{server_p99 or 0:.0f}), refused p99 {refused_p99 or 0:.0f} ms, memory {growth:+.0f} MiB"
    )
    print("  the slowest 1% of admitted, the server's stages (ms, means): " + ", ".join(
        f"{stage} {ms:.0f}" for stage, ms in tail.items()
    ))  # fmt: skip
    return [
        context.record(case, "offered_requests_per_s", rate, "requests/s"),
        context.record(case, "answered_200", result.count(200), "requests"),
        context.record(case, "answered_429", result.count(429), "requests"),
        context.record(case, "other_answers", others, "requests"),
        context.record(
            case, "answered_429_without_retry_after", result.num_429_without_retry_after, "requests"
        ),
        context.record(case, "admitted_latency_p99_ms", p99 or 0.0, "ms"),
        context.record(case, "admitted_server_total_p99_ms", server_p99 or 0.0, "ms"),
        context.record(case, "refused_latency_p99_ms", refused_p99 or 0.0, "ms"),
        *(context.record(case, f"slowest_1pct_{stage}_ms", ms, "ms") for stage, ms in tail.items()),
        context.record(case, "memory_growth_mib", growth, "MiB"),
        context.record(case, "memory_growth_second_half_mib", second_half, "MiB"),
    ]


def _sample_rss(pid: int, every_s: float, done: threading.Event, samples: list[float]) -> None:
    while not done.wait(every_s):
        samples.append(rss_mib(pid))


def infinity_cases(
    model: Path, plan, one_bodies, many_bodies, baseline, texts, posy, context, records
) -> list:
    """Infinity under the batch-1, 16-client and throughput loads; posy's figures against its."""
    site, why = infinity_site()
    if site is None:
        print(f"infinity: not run ({why})")
        return []
    with serve_infinity(site, model, SERVED_NAME, plan.device, plan.dtype) as url:
        failures = parity_at(url, baseline, texts)
        peer = RunContext(context.suite, context.model, context.gpu, "infinity 0.0.78 (torch)")
        path = "/embeddings"
        b1 = run_clients(url, [one_bodies], duration_s=plan.window_s, warmup_s=plan.warmup_s, path=path)
        records += case_records(peer, "infinity-b1-raw", b1)
        records.append(
            context.record("b1-raw-vs-infinity", "latency_p50_ms", posy["b1_p50_ms"], "ms", b1.latency_ms(50))
        )
        for level in plan.levels[1:]:
            load = run_clients(
                url, [one_bodies] * level, duration_s=plan.window_s, warmup_s=plan.warmup_s, path=path
            )
            records += case_records(peer, f"infinity-clients-{level}-raw", load)
            posy_rate = posy[f"clients_{level}_per_s"]
            case = f"clients-{level}-raw-vs-infinity"
            records.append(
                context.record(case, "requests_per_s", posy_rate, "requests/s", load.requests_per_s)
            )
        many = run_clients(
            url,
            [many_bodies] * plan.num_many_clients,
            duration_s=plan.window_s,
            warmup_s=plan.warmup_s,
            path=path,
        )
        name = f"clients-{plan.num_many_clients}-{plan.many_texts}x{plan.many_tokens}"
        records += case_records(peer, f"infinity-{name}", many)
        records.append(
            context.record(
                f"{name}-vs-infinity",
                "tokens_per_s",
                posy["many_tokens_per_s"],
                "tokens/s",
                many.tokens_per_s,
            )
        )
        print(
            f"posy against Infinity: batch-1 p50 {posy['b1_p50_ms'] / b1.latency_ms(50):.2f}x, "
            f"throughput {posy['many_tokens_per_s'] / max(many.tokens_per_s, 1e-9):.2f}x"
        )
    return failures


def parity_at(url: str, baseline, texts: list[str]) -> list[str]:
    """Infinity's vectors against the same reference (its /embeddings route)."""
    import base64

    import httpx
    import numpy as np

    response = httpx.post(
        f"{url}/embeddings",
        json={"model": SERVED_NAME, "input": texts, "encoding_format": "base64"},
        timeout=60,
    )
    response.raise_for_status()
    items = sorted(response.json()["data"], key=lambda item: item["index"])
    vectors = np.stack([np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4") for item in items])
    cosine = min_cosine(vectors, baseline.embed(texts))
    print(f"infinity: min cosine {cosine:.6f} against the fp32 reference")
    return [] if cosine >= MIN_COSINE else [f"infinity: min cosine {cosine:.6f} < {MIN_COSINE}"]
