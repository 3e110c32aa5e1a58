"""README's Python examples, run as written against a live server (its URL for 127.0.0.1:8000): a
newcomer's first copy-paste must work."""

from __future__ import annotations

import re

import pytest

from .conftest import REPO_ROOT

README_URL = "http://127.0.0.1:8000"
ALL_EXAMPLES = re.findall(r"```python\n(.*?)```", (REPO_ROOT / "README.md").read_text(encoding="utf-8"), re.S)
# the Images section's examples send a local image to an image model: they run against one of their own
IMAGE_EXAMPLES = [example for example in ALL_EXAMPLES if "image_url" in example]
# Perplexity's SDK names pplx-embed models only: its example runs against their server
# (compat_tests/test_perplexity_sdk.py)
PERPLEXITY_EXAMPLES = [example for example in ALL_EXAMPLES if "from perplexity" in example]
EXAMPLES = [example for example in ALL_EXAMPLES if example not in IMAGE_EXAMPLES + PERPLEXITY_EXAMPLES]


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


def run_example(example: str, base_url: str) -> None:
    assert README_URL in example
    namespace: dict = {}
    exec(compile(example.replace(README_URL, base_url), "README.md", "exec"), namespace)


def test_readme_image_examples_run(server_factory, tmp_path, monkeypatch):
    """Against a tiny random CLIP served as "clip", with a cat.jpg beside them: the SDKs send the images as
    README says (the OpenAI SDK's parts as given; Cohere's `images` and `inputs`)."""
    from PIL import Image

    from benchmarks.image_checkpoints import dual_encoder_checkpoint

    assert IMAGE_EXAMPLES
    folder, _ = dual_encoder_checkpoint(tmp_path / "clip", "clip")
    server = server_factory("--model", str(folder), "--served-model-name", "clip")
    Image.new("RGB", (64, 48), (200, 120, 40)).save(tmp_path / "cat.jpg")
    monkeypatch.chdir(tmp_path)
    for example in IMAGE_EXAMPLES:
        run_example(example, server.url)
