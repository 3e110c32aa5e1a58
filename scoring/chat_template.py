"""A model's Jinja chat template, rendered as transformers renders it (a sandbox, trimmed blocks, its
globals and `tojson`), for a sentence-transformers CrossEncoder's (query, document) message pair."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from scoring.errors import TemplateError

PAIR_ROLES = ("query", "document")  # sentence-transformers' roles for a pair's two texts


def render_pair(source: str, variables: Mapping[str, Any], query: str, document: str) -> str:
    """The template's text for the pair as its two messages, with the model's special tokens and the
    sentence-transformers chat-template arguments (add_generation_prompt, ...) as variables."""
    messages = [{"role": role, "content": text} for role, text in zip(PAIR_ROLES, (query, document))]
    return render(source, variables, messages, "a query and a document")


def render(source: str, variables: Mapping[str, Any], messages: list[dict[str, Any]], what: str) -> str:
    """The template's text for `messages` (`what` they are, for its errors)."""
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(f"the chat template refused {what}: {message}")

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda pattern: datetime.now().strftime(pattern)
    try:
        return environment.from_string(source).render(messages=messages, **variables)
    except jinja2.TemplateError as error:
        raise TemplateError(f"the chat template cannot render {what}: {error}") from error
