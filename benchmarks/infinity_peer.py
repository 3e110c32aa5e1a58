"""serve_infinity(): Infinity (`infinity-emb` 0.0.78, torch backend) serving a suite's checkpoint, the
peer of the online suite. It needs its own packages (sentence-transformers < 4, transformers 4.x, ...),
installed in a folder of their own that POSY_INFINITY_SITE names and that only its process sees, so that
posy keeps its own. sentence_transformers_v3_files() adds what sentence-transformers 3 reads to a folder
that posy also serves, so both read one checkpoint."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from benchmarks.live_server import free_port, serve_process

SITE_VARIABLE = "POSY_INFINITY_SITE"


def infinity_site() -> tuple[Path | None, str]:
    """The folder Infinity's packages are in, or None and why not."""
    site = os.environ.get(SITE_VARIABLE)
    if not site:
        return None, f"{SITE_VARIABLE} is not set"
    if not (Path(site) / "infinity_emb").is_dir():
        return None, f"{SITE_VARIABLE}={site} holds no infinity_emb"
    return Path(site), ""


def sentence_transformers_v3_files(folder: Path, hidden_size: int, window: int) -> None:
    """sentence-transformers 3 reads a Transformer config, pooling with its width, and a tokenizer config
    that names the generic fast tokenizer (the suites' word-level tokenizers have no BERT normalizer)."""
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": window}))
    pooling = folder / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**config, "word_embedding_dimension": hidden_size}))
    tokenizer = {
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "cls_token": "[CLS]", "sep_token": "[SEP]", "model_max_length": window,
    }  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))


@contextmanager
def serve_infinity(site: Path, model: Path, served_name: str, device: str, dtype: str) -> Iterator[str]:
    """The base URL of a ready Infinity server; its log is in the error if it fails to start."""
    port = free_port()
    command = [
        sys.executable, "-c", "import sys; from infinity_emb.cli import cli; sys.exit(cli())", "v2",
        "--model-id", str(model), "--served-model-name", served_name, "--port", str(port),
        "--host", "127.0.0.1", "--engine", "torch", "--device", device, "--dtype", dtype,
        "--no-bettertransformer", "--log-level", "warning",
    ]  # fmt: skip
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    env.update(
        PYTHONPATH=str(site),
        HF_HUB_OFFLINE="1",
        INFINITY_ANONYMOUS_USAGE_STATS="0",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    with serve_process(command, env, port, "/health") as url:
        yield url
