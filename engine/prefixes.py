"""Shared prefixes: when a request's sequences run better as continuations of the prefix they all start
with (a causal judge's template head and query) than as whole sequences, and what such a request runs
once it is cut into pieces of a token budget, each with the prefix once."""

from __future__ import annotations

from collections.abc import Sequence

# Sharing pays where it saves at least this many of the whole sequences' tokens. In CUDA graphs a shared
# batch costs a fixed part more: its attention gathers each sequence's keys (its prefix's and its own) a
# layer and runs on FA3, where short whole pairs run triton's packed kernel. H200, bf16, Qwen3-Reranker-0.6B
# shape, lazy graphs, one request of N passages after a P-token prefix, whole pairs' p50 over shared
# (benchmarks.variants prefixes, a6e6458):
#
#   passage tokens      P = 20: N = 2, 5, 50     P = 60              P = 120
#   30                  0.79  0.81  1.14         0.81  1.04  1.82    0.94  1.13  2.87
#   150                 0.86  0.80  1.06         0.93  0.94  1.25    0.97  1.18  1.58
#   400                 0.85  0.98  1.01         0.92  0.92  1.07    0.99  1.06  1.20
#   tokens saved        20    80    980          60    240   2940    120   480   5880
#
# Every request that saved 480 tokens or more ran faster shared, none that saved fewer than 400 by more
# than 4%.
MIN_SAVED_TOKENS_GRAPHS = 400
# Eagerly (no CUDA graphs; the CPU) a shared batch costs what its tokens do: on a 2-core CPU in fp32, the
# same shape, 2 passages of 150 after a 20-token prefix (20 tokens saved) ran 1.03x faster shared, 5 x 150
# after 120 1.40x, and 6 other cases between.
MIN_SAVED_TOKENS_EAGER = 1
# what an engine's description says of its prefixes where a token head scores sequences against them
SCORED_BY_MAX_SIM = "scored by MaxSim"


def describe_rule(min_saved_tokens: int | None) -> str:
    """The rule as an engine's description gives it (for logs and the metrics): the fewest saved
    tokens, or "off" where the engine shares no prefixes."""
    return "off" if min_saved_tokens is None else str(min_saved_tokens)


def prefix_pays(prefix_length: int, lengths: Sequence[int], min_saved_tokens: int) -> bool:
    """Whether sequences of `lengths` should run as continuations of one `prefix_length`-token prefix
    rather than each as prefix + sequence: where that saves at least `min_saved_tokens` of the whole
    sequences' tokens (one sequence saves none)."""
    return len(lengths) > 1 and (len(lengths) - 1) * prefix_length >= min_saved_tokens


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
