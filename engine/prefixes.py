"""Shared prefixes: when a request's sequences run better as continuations of the prefix they all start
with (a causal judge's template head and query) than as whole sequences, and what such a request runs
once it is cut into pieces of a token budget, each with the prefix once."""

from __future__ import annotations

from collections.abc import Sequence

# sharing pays where it saves at least this share of the whole sequences' tokens: a shared batch gathers
# each sequence's keys (its prefix's and its own) once a layer and runs the prefix's row, which nobody
# reads; see the measurement in prefix_pays
MIN_SAVED_SHARE = 0.10


def prefix_pays(prefix_length: int, lengths: Sequence[int]) -> bool:
    """Whether sequences of `lengths` should run as continuations of one `prefix_length`-token prefix
    rather than each as prefix + sequence: where that saves at least MIN_SAVED_SHARE of the whole
    sequences' tokens (one sequence saves none)."""
    whole = prefix_length * len(lengths) + sum(lengths)
    return len(lengths) > 1 and (len(lengths) - 1) * prefix_length >= MIN_SAVED_SHARE * whole


def split_by_tokens(lengths: Sequence[int], budget: int, prefix_length: int = 0) -> list[tuple[int, int]]:
    """[start, end) ranges of consecutive sequences, each range at most `budget` tokens with the prefix
    (which every range carries once) unless one sequence alone is longer."""
    ranges, start, total = [], 0, 0
    for index, length in enumerate(lengths):
        if total and total + length > budget:
            ranges.append((start, index))
            start, total = index, 0
        if not total:
            total = prefix_length
        total += length
    ranges.append((start, len(lengths)))
    return ranges


def tokens_to_run(lengths: Sequence[int], budget: int, prefix_length: int = 0) -> int:
    """The tokens a request runs when cut into pieces of `budget` tokens: its sequences, and its prefix
    (if any) once a piece."""
    pieces = len(split_by_tokens(lengths, budget, prefix_length)) if prefix_length else 0
    return sum(lengths) + prefix_length * pieces
