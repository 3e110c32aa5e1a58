"""CharBound: a text is cut (or refused) by its length before it is tokenized, and a cut text's first (or
last) tokens are the whole text's, with or without spaces, for a WordPiece (the bundled model's), a
byte-level BPE and a Unigram tokenizer."""

import random
import time

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from api.char_bound import MIN_CHARS_PER_TOKEN, CharBound
from api.errors import InputTooLong
from api.tokenize import TextEncoder

pytestmark = pytest.mark.serial  # times the server or loads the host: alone (tests/serial.py)

WINDOW = 64
PROSE = "the cat sat on a mat while stocks fell and rain came down over the quiet harbour, again"
# the input: 7M characters without a space
SPACELESS = "a" * 7_000_000


def corpus() -> list[str]:
    """Prose, and runs of one letter, so that the BPE learns tokens longer than MIN_CHARS_PER_TOKEN."""
    return [PROSE] * 50 + ["a" * n for n in range(1, 300)] + ["ab.cd,ef" * 20, "猫が好き" * 10]


def byte_level_bpe() -> Tokenizer:
    """Qwen's pre-tokenizer split, then byte-level BPE."""
    qwen_split = (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+"
    )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(qwen_split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus(), trainer)
    return tokenizer


def unigram() -> Tokenizer:
    """SentencePiece's layout (XLM-RoBERTa's, bge-m3's): Metaspace, then Unigram."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=300, unk_token="<unk>", special_tokens=["<unk>"])
    tokenizer.train_from_iterator(corpus(), trainer)
    return tokenizer


@pytest.fixture(scope="module", params=["wordpiece", "byte-level-bpe", "unigram"])
def encoder(request, minilm_path, tmp_path_factory):
    if request.param == "wordpiece":
        path = minilm_path / "tokenizer.json"
    else:
        path = tmp_path_factory.mktemp(request.param) / "tokenizer.json"
        (byte_level_bpe() if request.param == "byte-level-bpe" else unigram()).save(str(path))
    encoder = TextEncoder(path, WINDOW, 30_522)
    yield encoder
    encoder.close()


def long_texts() -> dict[str, str]:
    rng = random.Random(0)
    letters = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(300_000))
    return {
        "one letter": "a" * 300_000,
        "a repeated syllable": "abc" * 100_000,
        "random letters": letters,
        "punctuation, no space": "ab.cd,ef-" * 35_000,
        "no space, CJK": "猫が好きです" * 50_000,
        "digits": "1234567890" * 30_000,
        "prose": (PROSE + " ") * 3_500,
    }


def test_the_bound_is_the_tokenizers_longest_token(encoder):
    vocabulary = encoder.tokenizer.get_vocab(with_added_tokens=True)
    longest = max(map(len, vocabulary))
    if isinstance(encoder.tokenizer.model, models.WordPiece):
        assert encoder.bound == CharBound(100)  # a word of up to 100 characters may be one [UNK]
    else:
        assert encoder.bound == CharBound(max(longest, MIN_CHARS_PER_TOKEN))
    if isinstance(encoder.tokenizer.model, models.BPE):
        assert longest > MIN_CHARS_PER_TOKEN  # runs of "a": the measured bound, not the floor


@pytest.mark.parametrize("name, text", long_texts().items(), ids=list(long_texts()))
def test_a_cut_text_truncates_to_the_whole_texts_tokens(encoder, name, text):
    room = WINDOW - encoder.single.num_special_tokens
    assert len(text) > 4 * encoder.bound.max_chars(room)
    full = encoder.tokenizer.encode(text, add_special_tokens=False).ids
    seen = recorded(encoder)
    for keep_end, kept in ((False, full[:room]), (True, full[-room:])):
        if keep_end and name == "one letter" and isinstance(encoder.tokenizer.model, models.BPE):
            continue  # the BPE aligns the run's tokens from its start (CharBound's docstring)
        assert encoder.encode([text], None, truncate=True, keep_end=keep_end) == [encoder.single.apply(kept)]
    assert max(seen) <= encoder.bound.max_chars(room)


def test_7m_characters_without_a_space_truncate_to_the_whole_texts_tokens(minilm_path, minilm_tokenizer):
    encoder = TextEncoder(minilm_path / "tokenizer.json", 256, 30_522)
    seen = recorded(encoder)
    started = time.perf_counter()
    [ids] = encoder.encode([SPACELESS], None, truncate=True)
    took = time.perf_counter() - started
    assert max(seen) <= encoder.bound.max_chars(254) and took < 1  # tokenized whole, it takes 6 s
    assert ids == minilm_tokenizer.encode(SPACELESS).ids  # [CLS] [UNK] [SEP]: a word past 100 characters
    seen.clear()
    with pytest.raises(InputTooLong, match="input 1 has 7000000 characters, more than the 25600 that"):
        encoder.encode(["short", SPACELESS], None, truncate=False)
    assert not seen  # refused untokenized


def recorded(encoder: TextEncoder) -> list[int]:
    """The lengths of the texts the encoder's tokenizer is given, from now on."""
    seen: list[int] = []
    content_ids = encoder.content_ids
    encoder.content_ids = lambda texts: seen.extend(map(len, texts)) or content_ids(texts)
    return seen
