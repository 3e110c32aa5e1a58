"""TextEncoder: batched tokenization, prompts, special-token templates and length checks."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from tokenizers import Tokenizer

from api.errors import InputTooLong, InvalidInput
from engine.errors import BehindDeadline
from engine.service_rate import ServiceRate
from scoring.templates import JUDGE_PROMPTS, PairTemplate, SingleTemplate

T = TypeVar("T")
# tokenizing more than this many characters at once moves off the event loop, split over the encoder's
# threads (the tokenizer lets go of the GIL while it works); smaller inputs are tokenized inline
INLINE_TOKENIZE_CHARS = 20_000
# the tokenizers library's own switch for its thread pool, which `posy serve` turns off: with it on,
# even one text is handed to a pool thread and back (95 against 61 us a 126-word text on the H200's
# host), and an idle pool's threads spin on cores the engine and the other gateways need
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"
# a request with a deadline waits for the encoder's threads at most this share of its time left, the rest
# being the engine's: under overload the threads would otherwise fall seconds behind, tokenizing work
# that the engine then refuses
TOKENIZE_SHARE = 0.5


class TextEncoder:
    """`num_threads`: the threads a large input is split over; each request's slices queue behind the
    ones before, so several large requests at once never take more than these threads. The threads'
    rate (characters a second, measured on their own parts) and what is queued on them say how long a
    new large input would wait: one with a deadline is refused (BehindDeadline) when that is more than
    TOKENIZE_SHARE of its time left."""

    def __init__(
        self,
        tokenizer_path: Path,
        window: int,
        vocab_size: int,
        pair_format: str = "pair",
        num_threads: int = 1,
    ):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.window = window
        self.vocab_size = vocab_size
        self.num_threads = max(1, num_threads)
        self._threads = ThreadPoolExecutor(max_workers=self.num_threads, thread_name_prefix="posy-tokenize")
        self.rate = ServiceRate(1)  # seconds a character, on one thread
        self._queued_chars = 0  # of the large inputs on or waiting for the threads
        self.single = SingleTemplate.from_tokenizer(self.tokenizer)
        if pair_format in JUDGE_PROMPTS:
            self.pair = JUDGE_PROMPTS[pair_format].pair_template(self.tokenizer)
        else:
            self.pair = PairTemplate.from_tokenizer(self.tokenizer)

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
        deadline: float | None = None,
    ) -> list[list[int]]:
        """encode(), on the encoder's threads when the texts are long enough to hold up the event loop;
        `deadline` (time.perf_counter) refuses what the threads could not start on in time."""
        if (num_chars := sum(map(len, texts))) > INLINE_TOKENIZE_CHARS:
            return await self._split(
                lambda part, first: self.encode(part, max_tokens, truncate, keep_end, first),
                texts,
                num_chars,
                deadline,
            )
        return self.encode(texts, max_tokens, truncate, keep_end)

    async def content_ids_off_loop(
        self, texts: Sequence[str], deadline: float | None = None
    ) -> list[list[int]]:
        """content_ids(), likewise."""
        if (num_chars := sum(map(len, texts))) > INLINE_TOKENIZE_CHARS:
            return await self._split(lambda part, first: self.content_ids(part), texts, num_chars, deadline)
        return self.content_ids(texts)

    def wait_seconds(self, num_chars: int) -> float | None:
        """How long `num_chars` queued now take to come back from the threads; None before they have
        measured their rate."""
        seconds = self.rate.seconds_for(self._queued_chars + num_chars)
        return None if seconds is None else seconds / self.num_threads

    async def _split(
        self,
        work: Callable[[Sequence[str], int], list[T]],
        texts: Sequence[str],
        num_chars: int,
        deadline: float | None,
    ) -> list[T]:
        """`work(part, index of its first text)` on num_threads consecutive parts at once, joined in
        order; the error of the earliest part that failed is raised, as one pass would raise it."""
        if deadline is not None and (estimate := self.wait_seconds(num_chars)) is not None:
            left = deadline - time.perf_counter()
            if estimate > TOKENIZE_SHARE * left:
                raise BehindDeadline(estimate, left)
        loop = asyncio.get_running_loop()
        size = -(-len(texts) // self.num_threads)
        starts = range(0, len(texts), size)
        self._queued_chars += num_chars
        try:
            parts = await asyncio.gather(
                *(
                    loop.run_in_executor(self._threads, self._timed, work, texts[start : start + size], start)
                    for start in starts
                ),
                return_exceptions=True,
            )
        finally:
            self._queued_chars -= num_chars
        joined: list[T] = []
        for part in parts:
            if isinstance(part, BaseException):
                raise part
            joined += part
        return joined

    def _timed(
        self, work: Callable[[Sequence[str], int], list[T]], part: Sequence[str], first: int
    ) -> list[T]:
        """`work` on one thread, its time per character measured."""
        started = time.perf_counter()
        try:
            return work(part, first)
        finally:
            self.rate.observe(sum(map(len, part)), time.perf_counter() - started)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

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
        for index, ids in enumerate(self.content_ids(texts), first_index):
            if len(ids) > room:
                if not truncate:
                    raise InputTooLong(index, len(ids) + self.single.num_special_tokens, limit)
                ids = ids[len(ids) - room :] if keep_end else ids[:room]
            sequences.append(self.single.apply(ids))
        return sequences

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
