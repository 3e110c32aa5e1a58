"""Picks the model's prompt for a request from `prompt_name` or `input_type`."""

from __future__ import annotations

from collections.abc import Mapping

from api.errors import InvalidInput

INPUT_TYPES = {
    "query": ("query",),
    "search_query": ("query", "search_query"),
    "document": ("document", "passage"),
    "search_document": ("document", "passage", "search_document"),
    "passage": ("passage", "document"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}


def select_prompt(
    prompts: Mapping[str, str],
    input_type: str | None,
    prompt_name: str | None,
    default_prompt_name: str | None = None,
) -> str:
    """`prompt_name` wins, then `input_type`. With neither, the model's `default_prompt_name` applies
    (sentence-transformers does the same), and without one the text gets no prompt."""
    if prompt_name is not None:
        if prompt_name not in prompts:
            known = ", ".join(prompts) or "none"
            raise InvalidInput(
                f"unknown prompt_name '{prompt_name}'; this model's prompts: {known}", "prompt_name"
            )
        return prompts[prompt_name]
    if input_type is None:
        return prompts.get(default_prompt_name, "") if default_prompt_name is not None else ""
    if input_type not in INPUT_TYPES:
        raise InvalidInput(
            f"unknown input_type '{input_type}'; use one of {', '.join(INPUT_TYPES)}", "input_type"
        )
    for name in INPUT_TYPES[input_type]:
        if name in prompts:
            return prompts[name]
    return ""
