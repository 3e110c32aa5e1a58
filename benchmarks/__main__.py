"""`python -m benchmarks SUITE [--rounds N]` runs and records a suite; `... render` re-renders."""

from __future__ import annotations

import argparse
import importlib
import sys

from benchmarks.records import SuiteOutcome, append_records
from benchmarks.render import render

# suite name -> module with `run(options: argparse.Namespace) -> SuiteOutcome`; imported only when run
SUITES: dict[str, str] = {
    "cpu": "benchmarks.cpu",
    "engine": "benchmarks.engine",
    "qwen3": "benchmarks.qwen3",
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument(
        "suite", choices=[*SUITES, "render"], help="a suite to run, or render to only re-render"
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="timed rounds per side after one warm-up (median)"
    )
    parser.add_argument("--no-record", action="store_true", help="print only; write no results")
    parser.add_argument("--backend", default="auto", help="attention backend of the GPU suites")
    parser.add_argument(
        "--smoke", action="store_true", help="qwen3: a tiny shape on the CPU in seconds (code check only)"
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
    outcome: SuiteOutcome = importlib.import_module(SUITES[options.suite]).run(options)
    if not options.no_record:
        print(f"appended {len(outcome.records)} records to {append_records(options.suite, outcome.records)}")
        print(f"rendered {render()}")
    for failure in outcome.failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if outcome.failures else 0


if __name__ == "__main__":
    sys.exit(main())
