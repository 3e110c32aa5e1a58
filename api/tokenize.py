"""TextEncoder: batched tokenization, prompts, special-token templates and length checks."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from tokenizers import Tokenizer

from api.errors import InputTooLong, InvalidInput
from api.tokenizer_pool import TokenizeAdmission, TokenizerPool
from scoring.templates import PairTemplate, SingleTemplate, pair_prompt

if TYPE_CHECKING:
    from engine.cross_encoder import ChatTemplate

T = TypeVar("T")
# tokenizing more than this many characters at once moves off the event loop, split over the encoder's
# threads (the tokenizer lets go of the GIL while it works); smaller inputs are tokenized inline
INLINE_TOKENIZE_CHARS = 20_000
# the tokenizers library's own switch for its thread pool, which `posy serve` turns off: with it on,
# even one text is handed to a pool thread and back (95 against 61 us a 126-word text on the H200's
# host), and an idle pool's threads spin on cores the engine and the other gateways need
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"
# a token rarely spans more characters than this (a text averages 4 to 5): a text longer than the token
# limit times this many characters is first tokenized in part (its start, or its end when truncating on
# the left), which decides nearly every over-long input without reading it whole (eight 7 MB texts took
# 24.5 s to refuse, tokenized in full)
MAX_CHARS_PER_TOKEN = 64
# timed once at start-up as the threads' first observation, so that admission counts tokenization from the
# first request on (real parts soon outweigh it): about INLINE_TOKENIZE_CHARS of plain prose
RATE_SAMPLE = " ".join(
    ["a gateway tokenizes every text before the engine sees it, and under load its threads fall behind"] * 200
)
# how fast the tokens-per-character estimate (from which admission guesses a large input's tokens before
# tokenizing it) follows the inputs: this weight for each new request's ratio
TOKENS_PER_CHAR_WEIGHT = 0.1


class TextEncoder:
    """`num_threads`: the threads a large input is split over; each request's slices queue behind the
    ones before, so several large requests at once never take more than these threads. A large input's
    tokenization is admitted first (TokenizeAdmission): on the threads' measured rate and what is queued
    on them, one that would not finish in time is refused before it waits."""

    def __init__(
        self,
        tokenizer_path: Path,
        window: int,
        vocab_size: int,
        pair_format: str = "pair",
        num_threads: int = 1,
        chat_template: ChatTemplate | None = None,
    ):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.window = window
        self.vocab_size = vocab_size
        self.pool = TokenizerPool(num_threads)
        self.single = SingleTemplate.from_tokenizer(self.tokenizer)
        # a judge's or a chat template's layout of (query, document); None: the tokenizer's pair template
        self.pair_prompt = pair_prompt(pair_format, self.tokenizer, chat_template)
        if self.pair_prompt is not None:
            self.pair = self.pair_prompt.pair_template(self.tokenizer)
        else:
            self.pair = PairTemplate.from_tokenizer(self.tokenizer)
        started = time.perf_counter()
        sample_tokens = sum(map(len, self.content_ids([RATE_SAMPLE])))
        self.pool.observe(len(RATE_SAMPLE), time.perf_counter() - started)
        self.tokens_per_char = sample_tokens / len(RATE_SAMPLE)

    def content_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        return [
            encoding.ids
            for encoding in self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        ]

    async def encode_off_loop(
        self,
        texts: Sequence[str],
        max_tokens: int | None,
        truncate: bool,
        keep_end: bool = False,
        admission: TokenizeAdmission | None = None,
    ) -> list[list[int]]:
        """encode(), on the encoder's threads when the texts are long enough to hold up the event loop,
        once `admission` (a request's guard) has admitted their tokenization."""
        num_chars = sum(map(len, texts))
        if num_chars > INLINE_TOKENIZE_CHARS:
            return await self._split(
                lambda part, first: self.encode(part, max_tokens, truncate, keep_end, first),
                texts,
                num_chars,
                admission,
            )
        return self.encode(texts, max_tokens, truncate, keep_end)

    async def content_ids_off_loop(
        self, texts: Sequence[str], admission: TokenizeAdmission | None = None
    ) -> list[list[int]]:
        """content_ids(), likewise."""
        num_chars = sum(map(len, texts))
        if num_chars > INLINE_TOKENIZE_CHARS:
            return await self._split(lambda part, first: self.content_ids(part), texts, num_chars, admission)
        return self.content_ids(texts)

    async def _split(
        self,
        work: Callable[[Sequence[str], int], list[T]],
        texts: Sequence[str],
        num_chars: int,
        admission: TokenizeAdmission | None,
    ) -> list[T]:
        """`work(part, index of its first text)` on the pool's consecutive parts at once, joined in order;
        the error of the earliest part that failed is raised, as one pass would raise it."""
        start_by = None
        if admission is not None:
            start_by = admission.admit_tokenization(
                self.pool.seconds_for(num_chars),
                self.pool.seconds_for(num_chars, behind_queued=False),
                round(num_chars * self.tokens_per_char),
            )
        parts = await self.pool.map(work, texts, start_by)
        joined: list[T] = []
        for part in parts:
            if isinstance(part, BaseException):
                raise part
            joined += part
        num_tokens = sum(map(len, joined))
        weight = TOKENS_PER_CHAR_WEIGHT
        self.tokens_per_char = (1 - weight) * self.tokens_per_char + weight * num_tokens / max(1, num_chars)
        return joined

    def close(self) -> None:
        self.pool.close()

    def encode(
        self,
        texts: Sequence[str],
        max_tokens: int | None,
        truncate: bool,
        keep_end: bool = False,
        first_index: int = 0,
    ) -> list[list[int]]:
        """Texts -> model inputs with special tokens; longer than `max_tokens` (the window when None)
        is an InputTooLong unless `truncate`, which keeps the start (or with `keep_end` the end) of the
        text and the special tokens. Errors name a text by `first_index` + its place in `texts`."""
        limit = max_tokens or self.window
        room = limit - self.single.num_special_tokens
        if room < 1:
            raise InvalidInput(f"a token limit of {limit} leaves no room for text", "truncate_prompt_tokens")
        sequences = []
        for index, (ids, whole) in enumerate(self._bounded_content_ids(texts, room, keep_end), first_index):
            if len(ids) > room:
                if not truncate:
                    raise InputTooLong(
                        index, len(ids) + self.single.num_special_tokens, limit, at_least=not whole
                    )
                ids = ids[len(ids) - room :] if keep_end else ids[:room]
            sequences.append(self.single.apply(ids))
        return sequences

    def _bounded_content_ids(
        self, texts: Sequence[str], room: int, keep_end: bool
    ) -> list[tuple[list[int], bool]]:
        """Each text's content ids and whether they are the whole text's: a text past room x
        MAX_CHARS_PER_TOKEN characters is tokenized in part first (its start, or its end with `keep_end`,
        cut at a space); where that part alone has more than room tokens (one more, as a margin at the
        cut), its ids decide."""
        budget = char_budget(room)
        long = [index for index, text in enumerate(texts) if len(text) > budget]
        if not long:
            return [(ids, True) for ids in self.content_ids(texts)]
        parts = self.content_ids([cut_at_a_space(texts[index], budget, keep_end) for index in long])
        decided = {
            index: ids[1:] if keep_end else ids[:-1] for index, ids in zip(long, parts) if len(ids) > room + 1
        }
        rest = [index for index in range(len(texts)) if index not in decided]
        whole = dict(zip(rest, self.content_ids([texts[index] for index in rest]))) if rest else {}
        return [(decided[i], False) if i in decided else (whole[i], True) for i in range(len(texts))]

    def check_token_ids(
        self, sequences: Sequence[Sequence[int]], max_tokens: int | None, truncate: bool
    ) -> list[Sequence[int]]:
        """Token-id inputs are taken as given: ids outside the vocabulary never reach the model."""
        limit = max_tokens or self.window
        checked = []
        for index, ids in enumerate(sequences):
            if not ids:
                raise InvalidInput(f"input {index} is an empty list of token ids", "input")
            if min(ids) < 0 or max(ids) >= self.vocab_size:
                raise InvalidInput(
                    f"input {index} has token ids outside the vocabulary [0, {self.vocab_size})", "input"
                )
            if len(ids) > limit:
                if not truncate:
                    raise InputTooLong(index, len(ids), limit)
                ids = ids[:limit]
            checked.append(ids)
        return checked


def char_budget(tokens: int) -> int:
    """The characters that hold at least `tokens` tokens and one to spare at a cut (at MAX_CHARS_PER_TOKEN
    a token)."""
    return (tokens + 2) * MAX_CHARS_PER_TOKEN


def cut_to_tokens(text: str, tokens: int) -> str:
    """The text, or where it is longer than char_budget(tokens) its start cut at a space: its first
    `tokens` tokens are the whole text's."""
    budget = char_budget(tokens)
    return cut_at_a_space(text, budget, keep_end=False) if len(text) > budget else text


def cut_at_a_space(text: str, budget: int, keep_end: bool) -> str:
    """The text's first `budget` characters (last, with `keep_end`), less a word the cut would split:
    cut at the space nearest the budget within its last 256 characters, where there is one."""
    if keep_end:
        part = text[-budget:]
        space = part.find(" ", 0, 256)
        return part[space + 1 :] if space >= 0 else part
    part = text[:budget]
    space = part.rfind(" ", max(0, budget - 256))
    return part[:space] if space > 0 else part
