"""TextEncoder: batched tokenization, prompts, special-token templates and length checks."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tokenizers import Tokenizer

from api.errors import InputTooLong, InvalidInput
from scoring.templates import JUDGE_PROMPTS, PairTemplate, SingleTemplate

# tokenizing more than this many characters at once moves off the event loop, to the encoder's one
# thread: the tokenizer spreads a large batch over every core itself, and several such batches at once
# only crowd out the engine (on 2 cores a burst of them halved its speed)
INLINE_TOKENIZE_CHARS = 20_000


class TextEncoder:
    def __init__(self, tokenizer_path: Path, window: int, vocab_size: int, pair_format: str = "pair"):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.window = window
        self.vocab_size = vocab_size
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="posy-tokenize")
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
        self, texts: Sequence[str], max_tokens: int | None, truncate: bool, keep_end: bool = False
    ) -> list[list[int]]:
        """encode(), in a worker thread when the texts are long enough to hold up the event loop."""
        if sum(map(len, texts)) > INLINE_TOKENIZE_CHARS:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(
                self._thread, self.encode, texts, max_tokens, truncate, keep_end
            )
        return self.encode(texts, max_tokens, truncate, keep_end)

    async def content_ids_off_loop(self, texts: Sequence[str]) -> list[list[int]]:
        """content_ids(), likewise."""
        if sum(map(len, texts)) > INLINE_TOKENIZE_CHARS:
            return await asyncio.get_running_loop().run_in_executor(self._thread, self.content_ids, texts)
        return self.content_ids(texts)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    def encode(
        self, texts: Sequence[str], max_tokens: int | None, truncate: bool, keep_end: bool = False
    ) -> list[list[int]]:
        """Texts -> model inputs with special tokens; longer than `max_tokens` (the window when None)
        is an InputTooLong unless `truncate`, which keeps the start (or with `keep_end` the end) of the
        text and the special tokens."""
        limit = max_tokens or self.window
        room = limit - self.single.num_special_tokens
        if room < 1:
            raise InvalidInput(f"a token limit of {limit} leaves no room for text", "truncate_prompt_tokens")
        sequences = []
        for index, ids in enumerate(self.content_ids(texts)):
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
