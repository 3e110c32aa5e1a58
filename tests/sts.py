"""The STS Benchmark's test split, which some tests read (the project does not ship it: its sentences carry
their sources' own licenses). Where a clone lacks it those tests fail, saying where it goes; they never
skip."""

from pathlib import Path

import pytest

from benchmarks.texts import STS_TEST


def sts_test_split() -> Path:
    if not STS_TEST.is_file():
        pytest.fail(
            f"the STS Benchmark test split is missing: these tests read sts-test.csv at {STS_TEST} (the "
            "STS Benchmark's public release, beside the project folder under shared/data/stsbenchmark/)",
            pytrace=False,
        )
    return STS_TEST
