"""`python -m benchmarks SUITE [--rounds N]` runs and records a suite; `... all` runs the four serving
suites (latency, scoring, throughput, concurrency) one after another; `... render` re-renders."""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
import time

from benchmarks.records import SuiteOutcome, append_records, results_path
from benchmarks.render import render

# suite name -> module with `run(options: argparse.Namespace) -> SuiteOutcome`; imported only when run
SUITES: dict[str, str] = {
    "cpu": "benchmarks.cpu",
    "engine": "benchmarks.engine",
    "qwen3": "benchmarks.qwen3",
    "families": "benchmarks.families",
    "latency": "benchmarks.latency",
    "scoring": "benchmarks.scoring",
    "throughput": "benchmarks.throughput",
    "concurrency": "benchmarks.concurrency",
    "gateway": "benchmarks.gateway",
    "scaling": "benchmarks.scaling",
    "bulk": "benchmarks.bulk",
    "online": "benchmarks.online",
    "tokens": "benchmarks.token_outputs",
    "fp8": "benchmarks.fp8",
    "images": "benchmarks.images",
    "seed": "benchmarks.seed",
}
# the four serving suites, in the order `all` runs them
SERVING_SUITES = ("latency", "scoring", "throughput", "concurrency")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "suite", choices=[*SUITES, "all", "render"], help="a suite, all four serving suites, or render"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="timed rounds per side after one warm-up (median)"
    )
    parser.add_argument("--no-record", action="store_true", help="print only; write no results")
    parser.add_argument("--backend", default="auto", help="attention backend of the GPU suites")
    parser.add_argument(
        "--shapes",
        default=None,
        help="comma-separated shapes of the families suite, cases of the images suite, or models of the seed "
        "suite (default: all)",
    )
    parser.add_argument(
        "--parts",
        default=None,
        help="comma-separated parts of the online suite (default, hop, overload, infinity) or of the seed "
        "suite (latency, throughput, concurrency, scoring); default: all",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny shapes on the CPU in seconds: checks the code, measures nothing",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    options = parse_args(sys.argv[1:] if argv is None else argv)
    if options.suite == "render":
        print(f"rendered {render()}")
        return 0
    if options.rounds < 1:
        print("--rounds must be at least 1", file=sys.stderr)
        return 2
    if options.smoke:  # a code check: its figures are not measurements
        options.no_record = True
    suites = SERVING_SUITES if options.suite == "all" else (options.suite,)
    failures = []
    started = time.perf_counter()
    for suite in suites:
        suite_started = time.perf_counter()
        # suites of cases append each case's records as it ends (run_cases); the others', here at the end
        append = None if options.no_record else functools.partial(append_records, suite)
        outcome: SuiteOutcome = importlib.import_module(SUITES[suite]).run(
            argparse.Namespace(**{**vars(options), "suite": suite, "append": append})
        )
        print(f"{suite}: {time.perf_counter() - suite_started:.0f} s")
        if append is not None:
            path = results_path(suite) if outcome.appended else append(outcome.records)
            print(f"appended {len(outcome.records)} records to {path}")
        failures += [f"{suite}: {failure}" for failure in outcome.failures]
    if len(suites) > 1:
        print(f"all: {time.perf_counter() - started:.0f} s")
    if not options.no_record:
        print(f"rendered {render()}")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
