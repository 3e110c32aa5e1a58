"""TextEncoder: batched tokenization, prompts, special-token templates and length checks."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import numpy as np
from tokenizers import Tokenizer

from api.char_bound import CharBound
from api.errors import InputTooLong, InvalidInput
from api.fast_bpe import FastBPE
from api.tokenizer_pool import TokenizeAdmission, TokenizerPool
from scoring.templates import PairTemplate, SingleTemplate, pair_prompt

if TYPE_CHECKING:
    from engine.checkpoint.cross_encoder import ChatTemplate
    from engine.checkpoint.spec import InputLayout

# Qwen2's end of text: a vision-language embedder's input ends with it, and is pooled there (gme-Qwen2-VL)
END_OF_TEXT = "<|endoftext|>"
MAX_SYSTEM_TURNS = 64  # prompted()'s encoders kept: a model's configured prompts

T = TypeVar("T")
# tokenizing more than this many characters at once moves off the event loop, split over the encoder's
# threads (the tokenizer lets go of the GIL while it works); smaller inputs are tokenized inline
INLINE_TOKENIZE_CHARS = 20_000
# the tokenizers library's own switch for its thread pool, which `posy serve` turns off: with it on,
# even one text is handed to a pool thread and back (95 against 61 us a 126-word text on the H200's
# host), and an idle pool's threads spin on cores the engine and the other gateways need
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"
# timed once at start-up as the threads' first observation, so that admission counts tokenization from the
# first request on (real parts soon outweigh it): about INLINE_TOKENIZE_CHARS of plain prose
RATE_SAMPLE = " ".join(
    ["a gateway tokenizes every text before the engine sees it, and under load its threads fall behind"] * 200
)
# how fast the tokens-per-character estimate (from which admission guesses a large input's tokens before
# tokenizing it) follows the inputs: this weight for each new request's ratio
TOKENS_PER_CHAR_WEIGHT = 0.1
# of the measured tokens a character, what a refusal before tokenizing (guessed_tokens) counts an input at:
# under a flood the queue stays full to within a request, and a guess much below the average lets most
# requests through to be tokenized and then refused; one above it refuses a little early what would have
# just fit, as a 429 (admission's "not now")
GUESS_SHARE = 0.9


class TextEncoder:
    """`num_threads`: the threads a large input is split over; each request's slices queue behind the
    ones before, so several large requests at once never take more than these threads. A large input's
    tokenization is admitted first (TokenizeAdmission): on the threads' measured rate and what is queued
    on them, one that would not finish in time is refused before it waits. No text is tokenized past the
    characters its token limit can span (`bound`): it is cut first, or refused untokenized."""

    def __init__(
        self,
        tokenizer_path: Path,
        window: int,
        vocab_size: int,
        pair_format: str = "pair",
        num_threads: int = 1,
        chat_template: ChatTemplate | None = None,
        padding: tuple[int, int] | None = None,
        input_layout: InputLayout | None = None,
    ):
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        # (length, pad id): each text encoded alone is padded to that length (ModelSpec.text_padding)
        self.padding = padding
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        # tiktoken's faster encoding of the same ids, where the tokenizer's layout is its (api/fast_bpe.py)
        self.fast_bpe = FastBPE.of(self.tokenizer)
        self.window = window
        self.vocab_size = vocab_size
        self.bound = CharBound.of(self.tokenizer)
        self.pool = TokenizerPool(num_threads)
        # each text's special tokens: the tokenizer's, or a vision-language embedder's chat layout of it
        self.input_layout = input_layout
        self.single = (
            SingleTemplate.from_tokenizer(self.tokenizer)
            if input_layout is None
            else self._chat_layout(input_layout.system)
        )
        self._system_turns: dict[str, TextEncoder] = {}  # prompted(): the encoder of each system turn
        # a judge's or a chat template's layout of (query, document); None: the tokenizer's pair template
        self.pair_prompt = pair_prompt(pair_format, self.tokenizer, chat_template)
        if self.pair_prompt is not None:
            self.pair = self.pair_prompt.pair_template(self.tokenizer)
        else:
            self.pair = PairTemplate.from_tokenizer(self.tokenizer)
        started = time.perf_counter()
        sample_tokens = sum(map(len, self.content_ids([RATE_SAMPLE])))
        self.pool.observe_idle(len(RATE_SAMPLE), time.perf_counter() - started)
        # the texts' measured tokens a character, one list that prompted() encoders share
        self._tokens_per_char = [sample_tokens / len(RATE_SAMPLE)]

    @property
    def tokens_per_char(self) -> float:
        return self._tokens_per_char[0]

    def guessed_tokens(self, num_chars: int) -> int:
        """A guess of the tokens in `num_chars` characters (GUESS_SHARE of the measured average), for a
        refusal before tokenizing them."""
        return max(1, int(GUESS_SHARE * self.tokens_per_char * num_chars))

    def _chat_layout(self, system: str | None) -> SingleTemplate:
        layout = self.input_layout
        return SingleTemplate.from_chat(
            layout.template.source, layout.template.variables, self.tokenizer, END_OF_TEXT, system
        )

    def prompted(self, texts: Sequence[str], prompt: str | None) -> tuple[TextEncoder, Sequence[str]]:
        """The encoder and texts of a request's prompt: the prompt before each text; a vision-language
        embedder's (its chat layout's) is the system turn instead, for its texts and images alike, as
        sentence-transformers gives a message model's prompt (an encoder of that turn, sharing this one's
        tokenizer and threads)."""
        if not prompt:
            return self, texts
        if self.input_layout is None:
            return self, [prompt + text for text in texts]
        encoder = self._system_turns.get(prompt)
        if encoder is None:
            encoder = copy.copy(self)
            encoder.single = self._chat_layout(prompt)
            if len(self._system_turns) < MAX_SYSTEM_TURNS:
                self._system_turns[prompt] = encoder
        return encoder, texts

    def content_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        if self.fast_bpe is not None:
            return self.fast_bpe.content_ids(texts)
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
        once `admission` (a request's guard) has admitted their tokenization (of the texts as bounded)."""
        room = self._room(max_tokens)
        texts = self.bounded(texts, room, truncate, keep_end)
        num_chars = sum(map(len, texts))
        if admission is not None:
            admission.refuse_if_behind(self.guessed_tokens(num_chars))
        if num_chars > INLINE_TOKENIZE_CHARS:
            return await self._split(
                lambda part, first: self.encode(part, max_tokens, truncate, keep_end, first),
                texts,
                num_chars,
                admission,
                room + self.single.num_special_tokens,
            )
        return self.encode(texts, max_tokens, truncate, keep_end)

    async def content_ids_off_loop(
        self,
        texts: Sequence[str],
        admission: TokenizeAdmission | None = None,
        max_tokens: int | None = None,
    ) -> list[list[int]]:
        """content_ids(), likewise; `max_tokens`: the most tokens of a text that the engine will run."""
        num_chars = sum(map(len, texts))
        if admission is not None:
            admission.refuse_if_behind(self.guessed_tokens(num_chars))
        if num_chars > INLINE_TOKENIZE_CHARS:
            return await self._split(
                lambda part, first: self.content_ids(part), texts, num_chars, admission, max_tokens
            )
        return self.content_ids(texts)

    async def _split(
        self,
        work: Callable[[Sequence[str], int], list[T]],
        texts: Sequence[str],
        num_chars: int,
        admission: TokenizeAdmission | None,
        max_tokens: int | None,
    ) -> list[T]:
        """`work(part, index of its first text)` on the pool's consecutive parts at once, joined in order;
        the error of the earliest part that failed is raised, as one pass would raise it. Admission guesses
        a text's tokens from its characters, at most `max_tokens` of them (a text cut to CharBound's
        characters may hold far more of those a token than the average)."""
        start_by = None
        if admission is not None:
            guess = [len(text) * self.tokens_per_char for text in texts]
            num_tokens = sum(guess if max_tokens is None else (min(one, max_tokens) for one in guess))
            start_by = admission.admit_tokenization(
                self.pool.seconds_for(num_chars),
                self.pool.seconds_for(num_chars, behind_queued=False),
                round(num_tokens),
            )
        parts = await self.pool.map(work, texts, start_by)
        joined: list[T] = []
        for part in parts:
            if isinstance(part, BaseException):
                raise part
            joined += part
        num_tokens = sum(map(len, joined))
        weight = TOKENS_PER_CHAR_WEIGHT
        measured = num_tokens / max(1, num_chars)
        self._tokens_per_char[0] = (1 - weight) * self.tokens_per_char + weight * measured
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
        text and the special tokens. Errors name a text by `first_index` + its place in `texts`; one past
        the characters of its limit is refused (bounded) before any is tokenized."""
        room = self._room(max_tokens)
        limit = room + self.single.num_special_tokens
        sequences = []
        bounded = self.bounded(texts, room, truncate, keep_end, first_index)
        for index, ids in enumerate(self.content_ids(bounded), first_index):
            if len(ids) > room:
                if not truncate:
                    raise InputTooLong.of_tokens(index, len(ids) + self.single.num_special_tokens, limit)
                ids = ids[len(ids) - room :] if keep_end else ids[:room]
            sequences.append(self.single.apply(ids))
        if self.padding is not None:
            length, pad = self.padding
            sequences = [ids + [pad] * (length - len(ids)) for ids in sequences]
        return sequences

    def bounded(
        self,
        texts: Sequence[str],
        num_tokens: int,
        truncate: bool = True,
        keep_end: bool = False,
        first_index: int = 0,
    ) -> Sequence[str]:
        """The texts cut to the characters that `num_tokens` content tokens span (CharBound.cut: their
        first, or with `keep_end` last, num_tokens tokens are the whole text's); without `truncate`, a
        longer text is an InputTooLong, untokenized."""
        max_chars = self.bound.max_chars(num_tokens)
        if truncate:
            return [self.bound.cut(text, num_tokens, keep_end) for text in texts]
        for index, text in enumerate(texts, first_index):
            if len(text) > max_chars:
                limit = num_tokens + self.single.num_special_tokens
                raise InputTooLong.of_characters(index, len(text), max_chars, limit)
        return texts

    def _room(self, max_tokens: int | None) -> int:
        """Content tokens that a limit of `max_tokens` (the window when None) leaves beside the special
        tokens."""
        limit = max_tokens or self.window
        room = limit - self.single.num_special_tokens
        if room < 1:
            raise InvalidInput(f"a token limit of {limit} leaves no room for text", "truncate_prompt_tokens")
        return room

    def check_token_ids(
        self, sequences: Sequence[Sequence[int]], max_tokens: int | None, truncate: bool
    ) -> list[np.ndarray]:
        """Token-id inputs are taken as given: ids outside the vocabulary never reach the model. Each comes
        back as an int32 array, made once: its bounds are then checked, and the replica link and `pack`
        copy it, without a Python int a token (4,096 ids took 0.5 ms as lists on a development core)."""
        limit = max_tokens or self.window
        checked = []
        for index, given in enumerate(sequences):
            if not given:
                raise InvalidInput(f"input {index} is an empty list of token ids", "input")
            try:
                ids = np.fromiter(given, dtype=np.int32, count=len(given))
            except OverflowError:  # past int32: outside any vocabulary
                ids = None
            if ids is None or ids.min() < 0 or ids.max() >= self.vocab_size:
                raise InvalidInput(
                    f"input {index} has token ids outside the vocabulary [0, {self.vocab_size})", "input"
                )
            if len(ids) > limit:
                if not truncate:
                    raise InputTooLong.of_tokens(index, len(ids), limit)
                ids = ids[:limit]
            checked.append(ids)
        return checked
