"""What posy reads of a checkpoint folder's files as they are: JSON, the model card, and where a
sentence-transformers module lives."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def model_card(folder: Path) -> str:
    """The model card's text (README.md), empty where there is none."""
    card = folder / "README.md"
    return card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""


def model_card_pipeline_tag(folder: Path) -> str | None:
    """The task the model card's front matter names the model for (`pipeline_tag: text-ranking`), the one
    the Hugging Face hub lists it under; None where it names none."""
    front = re.match(r"---\s*\n(.*?)\n---", model_card(folder), re.DOTALL)
    tag = re.search(r"^pipeline_tag:\s*['\"]?([\w-]+)", front.group(1), re.MULTILINE) if front else None
    return tag.group(1) if tag else None


def model_card_says_matryoshka(folder: Path) -> bool:
    """The model card names Matryoshka training: sentence-transformers' generated cards tag
    `loss:MatryoshkaLoss`; others (Qwen3-Embedding, pplx-embed) say "Matryoshka" or "MRL"."""
    text = model_card(folder)
    return "matryoshka" in text.lower() or re.search(r"\bMRL\b", text) is not None


def sentence_transformers_path(
    modules: list[dict] | None, kind: str, default: str | None = None
) -> str | None:
    """The folder of the first module of this kind ("Transformer", "Pooling", ...) in modules.json."""
    for module in modules or []:
        if module["type"].rsplit(".", 1)[-1] == kind:
            return module.get("path", "")
    return default


def module_kinds(modules: list[dict]) -> list[str]:
    """The kinds of modules.json's modules ("Transformer", "Pooling", ...), in order."""
    return [module["type"].rsplit(".", 1)[-1] for module in modules]


def ties_word_embeddings(hf_config: Any) -> bool:
    """Whether the model's LM head is its token embedding table, as transformers reads the config (every
    family posy packs says; one that does not is untied)."""
    return bool(getattr(hf_config, "tie_word_embeddings", False))
