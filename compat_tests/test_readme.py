"""README's Python examples, run as written against a live server (its URL for 127.0.0.1:8000): a
newcomer's first copy-paste must work."""

from __future__ import annotations

import re

import pytest

from .conftest import REPO_ROOT

README_URL = "http://127.0.0.1:8000"
EXAMPLES = re.findall(r"```python\n(.*?)```", (REPO_ROOT / "README.md").read_text(encoding="utf-8"), re.S)


def test_readme_has_the_sdk_client_and_framework_examples():
    text = "\n".join(EXAMPLES)
    for name in ("openai", "cohere", "clients", "langchain_openai", "llama_index", "haystack"):
        assert f"from {name}" in text or f"import {name}" in text, name


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"example-{index}" for index in range(len(EXAMPLES))])
def test_readme_example_runs(base_url, example):
    assert README_URL in example
    namespace: dict = {}
    exec(compile(example.replace(README_URL, base_url), "README.md", "exec"), namespace)
    for value in namespace.values():  # what the examples compute, where they compute something
        if isinstance(value, list):
            assert value
