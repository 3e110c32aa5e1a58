"""Tests that read the STS Benchmark fail, saying where it goes, where a clone lacks it (tests/sts.py)."""

import pytest

import tests.sts as sts


def test_a_missing_split_fails_the_test_with_its_place_and_a_present_one_is_given(monkeypatch, tmp_path):
    missing = tmp_path / "shared" / "data" / "stsbenchmark" / "sts-test.csv"
    monkeypatch.setattr(sts, "STS_TEST", missing)
    with pytest.raises(pytest.fail.Exception, match="STS Benchmark test split is missing") as failed:
        sts.sts_test_split()
    assert str(missing) in str(failed.value)
    missing.parent.mkdir(parents=True)
    missing.write_text("")
    assert sts.sts_test_split() == missing
