"""Benchmark records: one JSON object per measurement, appended to benchmarks/results/SUITE.jsonl."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

BENCHMARKS_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCHMARKS_DIR / "results"
REPO_ROOT = BENCHMARKS_DIR.parent
# the record schema of DESIGN.md, in order; nothing else goes into a record
FIELDS = (
    "suite", "case", "model", "gpu", "torch", "backend", "commit",
    "date", "metric", "value", "unit", "baseline", "ratio",
)  # fmt: skip
# benchmark outputs do not make the tree dirty, or every second run would say "+dirty"
GENERATED_PATHS = (":(exclude)benchmarks/results", ":(exclude)benchmarks/RESULTS.md")


@dataclass(frozen=True, slots=True)
class Record:
    suite: str
    case: str
    model: str
    gpu: str | None
    torch: str
    backend: str
    commit: str
    date: str
    metric: str
    value: float
    unit: str
    baseline: float | None = None
    ratio: float | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=False)


@dataclass(frozen=True, slots=True)
class RunContext:
    """What every record of one suite run shares."""

    suite: str
    model: str
    gpu: str | None
    backend: str
    torch: str = field(default_factory=lambda: torch_version())
    commit: str = field(default_factory=lambda: git_commit())
    date: str = field(default_factory=lambda: datetime.date.today().isoformat())

    def record(
        self, case: str, metric: str, value: float, unit: str, baseline: float | None = None
    ) -> Record:
        """A measurement; with a baseline, ratio = value / baseline."""
        ratio = value / baseline if baseline else None
        return Record(
            suite=self.suite, case=case, model=self.model, gpu=self.gpu, torch=self.torch,
            backend=self.backend, commit=self.commit, date=self.date, metric=metric,
            value=value, unit=unit, baseline=baseline, ratio=ratio,
        )  # fmt: skip


@dataclass(slots=True)
class SuiteOutcome:
    records: list[Record]
    failures: list[str]  # guard violations; any makes `python -m benchmarks SUITE` exit non-zero
    appended: bool = False  # its records were appended case by case as they were measured (run_cases)


def run_cases(
    cases: Sequence[Any],
    name_of: Callable[[Any], str],
    measure: Callable[[Any, str, str | None, bool], tuple[list[Record], str | None]],
    smoke: bool,
    append: Callable[[list[Record]], object] | None = None,
) -> SuiteOutcome:
    """A suite of cases on CUDA (on the CPU with `smoke`): `measure(case, device, gpu, smoke)` gives its
    records and a failure (or None); a case that raises fails alone and the next one runs; memory is
    freed between cases. `append` takes each case's records as it ends, so that a run cut short (a GPU
    call's time limit) keeps the cases it finished."""
    import gc

    import torch

    device = "cpu" if smoke else "cuda"
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    records, failures = [], []
    for case in cases:
        try:
            measured, failure = measure(case, device, gpu, smoke)
        except Exception as error:  # the case's failure; the next case still runs
            measured, failure = [], f"{type(error).__name__}: {error}"
        finally:
            gc.collect()
            if device == "cuda":
                torch.cuda.empty_cache()
        records += measured
        if append is not None and measured:
            append(measured)
        if failure:
            failures.append(f"{name_of(case)}: {failure}")
            print(failures[-1])
    return SuiteOutcome(records, failures, appended=append is not None)


def engine_backend(engine) -> str:
    """The name of the attention backend an engine's model runs, for its records: as build_engine names
    it ("transformers (sdpa)" where the transformers fallback runs), else the model's own."""
    if getattr(engine, "attention_backend", "unknown") != "unknown":
        return engine.attention_backend
    for module in engine.runner.model.modules():
        backend = getattr(module, "attention_backend", None)
        if backend is not None:
            return backend.name
    return "unknown"


def implementation(backend: str) -> str:
    """Which implementation a record's engine ran: the transformers fallback (whose backend build_engine
    names "transformers (sdpa)" or "transformers (eager)") or posy's packed model."""
    return "transformers" if backend.startswith("transformers") else "posy"


def torch_version() -> str:
    import torch

    return torch.__version__


def git_commit() -> str:
    """`git rev-parse --short HEAD`, with "+dirty" when tracked or untracked sources differ from it;
    POSY_COMMIT names it where the checkout travels without its history (the GPU machine)."""
    if os.environ.get("POSY_COMMIT"):
        return os.environ["POSY_COMMIT"]
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--", ".", *GENERATED_PATHS)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO_ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def results_path(suite: str) -> Path:
    return RESULTS_DIR / f"{suite}.jsonl"


def append_records(suite: str, records: list[Record]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = results_path(suite)
    with path.open("a", encoding="utf-8") as file:
        for record in records:
            file.write(record.to_json() + "\n")
    return path


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records of one results file, in the order they were written; blank lines skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]
