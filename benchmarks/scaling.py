"""The scaling suite, over HTTP: the throughput suite's 16..512-token load and the concurrency suite's 16
clients against posy serving the BERT-base shape with 1, 2 and (where there are more GPUs) one replica per
GPU; tokens/s per GPU, the scaling efficiency rate(R) / (R x rate(1)), and a 2048-text request split over
the replicas whose rows must equal, in order, the one-replica server's. `--smoke`: 1 and 2 CPU replicas."""

from __future__ import annotations

import argparse
import os
import random
from dataclasses import dataclass, replace

import numpy as np

from benchmarks import concurrency, throughput
from benchmarks.baseline import min_cosine
from benchmarks.checkpoints import words
from benchmarks.live_server import ServerFailed, serve_random_bert, served_info
from benchmarks.load import LoadResult, embed_over_http, run_clients
from benchmarks.records import Record, RunContext, SuiteOutcome

SERVED_NAME = throughput.SERVED_NAME
LOAD_CASE = "http-100x16-512"  # the throughput suite's variant whose lengths the high-throughput load uses
NUM_SPLIT_TEXTS = 2048  # the server's default --max-inputs


@dataclass(frozen=True, slots=True)
class Plan:
    throughput: throughput.Plan  # the high-throughput load at one replica; its clients scale with replicas
    concurrency: concurrency.Plan  # one level: the high-concurrency load, the same at every replica count
    # gateway processes (--api-workers) per replica, capped at half the cores; 0: one, whatever the count
    api_workers_per_replica: int
    split_tokens: tuple[int, int]  # of each text of the split request, special tokens included
    split_min_cosine: float  # of each row against the one-replica server's
    split_max_abs_diff: float | None  # of any element against the one-replica server's; None: unchecked


# on the H200s: per replica count ~15 s of each load, the split request and the server's start (~1 min);
# the suite with 1 and 2 replicas in ~3.5 min. 4 gateways per replica: on 2 H200s, 2 replicas behind 4
# gateways served 4.25M tokens/s (efficiency 0.893), behind 8 4.67M (0.994); one replica served the same
# behind 2 or 4 (2.38M, 2.35M). 8 clients per replica keep every gateway busy. bf16 rows of different
# batches differ slightly.
FULL = Plan(
    replace(throughput.FULL, num_clients=8),
    replace(concurrency.FULL, levels=(16,), warmup_s=3.0, duration_s=10.0), 4, (16, 512), 0.9999, None,
)  # fmt: skip
# fp32 on the CPU: the replicas' rows are the one replica's up to summation order
SMOKE = Plan(throughput.SMOKE, replace(concurrency.SMOKE, levels=(2,)), 0, (3, 8), 0.99999, 1e-5)


@dataclass(frozen=True, slots=True)
class Layout:
    """One server: its engine replicas, its gateway processes, the devices the replicas run on."""

    num_replicas: int
    num_workers: int
    num_devices: int  # the GPUs the replicas share (two may share one), or on the CPU the replicas

    @property
    def name(self) -> str:
        return f"r{self.num_replicas}-w{self.num_workers}"

    def hardware(self, gpu: str | None) -> str | None:
        """The records' GPU: "2x NVIDIA H200" where the replicas run on two."""
        return f"{self.num_devices}x {gpu}" if gpu is not None and self.num_devices > 1 else gpu

    @property
    def flags(self) -> tuple[str, ...]:
        # --api-workers only when more than one, so that a server without the flag serves the smoke run
        workers = ("--api-workers", str(self.num_workers)) if self.num_workers > 1 else ()
        return ("--replicas", str(self.num_replicas), *workers)


def layouts(plan: Plan, num_gpus: int) -> list[Layout]:
    """1 and 2 replicas, and one per GPU where there are more than two; the first is the reference."""
    counts = (1, 2, num_gpus) if num_gpus > 2 else (1, 2)
    max_workers = (os.cpu_count() or 2) // 2
    return [
        Layout(
            count,
            max(1, min(plan.api_workers_per_replica * count, max_workers)),
            min(count, num_gpus) if num_gpus else count,
        )
        for count in counts
    ]


@dataclass(frozen=True, slots=True)
class Requests:
    """What every server gets: the same bodies and texts at every replica count."""

    load: list[list[bytes]]  # [client][request]: 100-text bodies, for the most clients of any count
    concurrency: list[list[bytes]]  # [client][request]: one-text bodies
    split: list[str]  # the split request's texts
    num_split_tokens: int  # theirs, special tokens included


def requests(plan: Plan, max_replicas: int, rng: random.Random) -> Requests:
    most_clients = replace(plan.throughput, num_clients=plan.throughput.num_clients * max_replicas)
    load = throughput.request_texts(most_clients, *throughput.VARIANTS[LOAD_CASE], rng)
    single = concurrency.client_texts(plan.concurrency, rng)
    lengths = [rng.randint(*plan.split_tokens) for _ in range(NUM_SPLIT_TEXTS)]
    return Requests(
        load=[[throughput.body(texts) for texts in client] for client in load],
        concurrency=[[concurrency.body(text) for text in client] for client in single],
        split=[words(length - throughput.NUM_SPECIAL_TOKENS, rng) for length in lengths],
        num_split_tokens=sum(lengths),
    )


def run(options: argparse.Namespace) -> SuiteOutcome:
    import torch

    plan = SMOKE if getattr(options, "smoke", False) else FULL
    num_gpus = torch.cuda.device_count() if plan.throughput.device == "cuda" else 0
    servers = layouts(plan, num_gpus)
    bodies = requests(plan, servers[-1].num_replicas, random.Random(0))
    setup = (options.suite, plan.throughput.shape, plan.throughput.device, plan.throughput.dtype)
    records: list[Record] = []
    failures: list[str] = []
    one_replica: dict[str, float] = {}  # load case -> tokens/s with one replica
    reference = None  # the one-replica server's rows of the split request
    for layout in servers:
        try:
            with serve_random_bert(*setup, options.backend, SERVED_NAME, *layout.flags) as (url, _, context):
                context = replace(context, gpu=layout.hardware(context.gpu))
                measured, errors, rates, vectors = measure(url, context, plan, bodies, layout)
        except ServerFailed as error:  # the records so far are kept; without one replica, nothing scales
            failures.append(f"{layout.name}: {error}")
            if layout.num_replicas == 1:
                break
            continue
        records += measured
        failures += errors
        if layout.num_replicas == 1:
            one_replica, reference = rates, vectors
            continue
        for load, rate in rates.items():
            case = f"{load}-{layout.name}"
            records.append(efficiency_record(context, case, rate, one_replica[load], layout.num_replicas))
        case = f"split-{NUM_SPLIT_TEXTS}-{layout.name}"
        measured, errors = check_split(context, plan, case, vectors, reference)
        records += measured
        failures += errors
    return SuiteOutcome(records, failures)


def measure(url: str, context: RunContext, plan: Plan, bodies: Requests, layout: Layout):
    """One server's records, failures, tokens/s per load, and its rows of the split request."""
    failures = []
    served = served_info(url, "replicas")
    if served != str(layout.num_replicas):
        failures.append(f"{layout.name}: the server runs {served} replicas, not {layout.num_replicas}")
    num_clients = plan.throughput.num_clients * layout.num_replicas
    heavy = run_clients(
        url, bodies.load[:num_clients], warmup_s=plan.throughput.warmup_s,
        duration_s=plan.throughput.duration_s, num_requests=plan.throughput.num_requests,
    )  # fmt: skip
    records = throughput_records(context, f"{LOAD_CASE}-{layout.name}", heavy, num_clients, layout)
    level = plan.concurrency.levels[0]
    many = run_clients(
        url, bodies.concurrency[:level], warmup_s=plan.concurrency.warmup_s,
        duration_s=plan.concurrency.duration_s,
    )  # fmt: skip
    case = f"clients-{level}-{layout.name}"
    records += concurrency.level_records(context, level, many, case)
    records.append(per_gpu_record(context, case, many, layout))
    loads = {LOAD_CASE: heavy, f"clients-{level}": many}
    for load, result in loads.items():
        if result.errors:
            errors = result.errors
            failures.append(f"{load}-{layout.name}: {len(errors)} failed requests, the first: {errors[0]}")
    vectors, num_tokens = embed_over_http(url, bodies.split, SERVED_NAME)
    if num_tokens != bodies.num_split_tokens:
        sent = bodies.num_split_tokens
        failures.append(f"split-{layout.name}: usage.prompt_tokens {num_tokens} != the {sent} tokens sent")
    return records, failures, {load: result.tokens_per_s for load, result in loads.items()}, vectors


def throughput_records(context: RunContext, case: str, load: LoadResult, num_clients: int, layout: Layout):
    print(
        f"{case}: {num_clients} clients: {load.tokens_per_s / 1e3:.1f}k tokens/s, "
        f"{load.tokens_per_s / layout.num_devices / 1e3:.1f}k per GPU ({load.num_requests} requests in "
        f"{load.wall_s:.1f} s, p50 {load.latency_ms(50):.1f} ms, {len(load.errors)} errors)"
    )
    return [
        context.record(case, "tokens_per_s", load.tokens_per_s, "tokens/s"),
        per_gpu_record(context, case, load, layout),
        context.record(case, "latency_p50_ms", load.latency_ms(50), "ms"),
        context.record(case, "errors", len(load.errors), "requests"),
    ]


def per_gpu_record(context: RunContext, case: str, load: LoadResult, layout: Layout) -> Record:
    """Tokens/s over the GPUs the replicas run on (on the CPU: over the replicas)."""
    return context.record(case, "tokens_per_s_per_gpu", load.tokens_per_s / layout.num_devices, "tokens/s")


def efficiency_record(
    context: RunContext, case: str, tokens_per_s: float, one_replica: float, num_replicas: int
) -> Record:
    """rate(R) / (R x rate(1)): 1.0 is perfect scaling; the target is >= 0.9 at 2 GPUs."""
    efficiency = tokens_per_s / (num_replicas * one_replica) if one_replica else 0.0
    print(f"{case}: scaling efficiency {efficiency:.3f} against {num_replicas} x one replica")
    return context.record(case, "scaling_efficiency", efficiency, "ratio")


def check_split(context: RunContext, plan: Plan, case: str, vectors: np.ndarray, reference: np.ndarray):
    """The split request's rows, in input order, against the one-replica server's."""
    if vectors.shape != reference.shape:
        return [], [f"{case}: rows of shape {vectors.shape}, the one-replica server's {reference.shape}"]
    cosine = min_cosine(vectors, reference)
    difference = float(np.abs(vectors - reference).max())
    print(f"{case}: min cosine {cosine:.7f}, max abs difference {difference:.2e} against one replica")
    records = [
        context.record(case, "min_cosine_vs_one_replica", cosine, "cosine"),
        context.record(case, "max_abs_diff_vs_one_replica", difference, "abs"),
    ]
    failures = []
    if cosine < plan.split_min_cosine:
        failures.append(f"{case}: min cosine {cosine:.7f} < {plan.split_min_cosine} against one replica")
    if plan.split_max_abs_diff is not None and difference > plan.split_max_abs_diff:
        failures.append(f"{case}: max abs difference {difference:.2e} > {plan.split_max_abs_diff}")
    return records, failures
