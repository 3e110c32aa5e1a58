"""Tiny random Gemma3 text models vs transformers, fp32 on the CPU: bidirectional (EmbeddingGemma) and causal
embedders over texts longer than the sliding window, the window exactly as transformers masks it (one key
fewer or more each side fails), the sequence classifier, Gemma3ForCausalLM run bare, batch invariance,
strict loading, float16 refused, and config values posy cannot honour sent to transformers."""

import pytest
import torch
import torch.nn.functional as F

from engine.attention import AttentionMetadata, select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.errors import UnsupportedModel, WeightLoadError
from engine.models.decoder import embedding_scale
from engine.weights import load_model
from tests.engine.checkpoint_edits import without_tensor
from tests.engine.test_qwen3_parity import (
    VOCAB_SIZE,
    assert_same_vectors,
    load,
    random_sequences,
    randomized,
    save_word_tokenizer,
    write_pooling_files,
)

SLIDING_WINDOW = 8  # config.json's; bidirectional, transformers keeps 8 // 2 + 1 and masks |q - k| < 5
LAYER_TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
SEQLENS = [1, 2, 17, 5, 40, 3, 33, 9]  # most past the window
LOGIT_TOLERANCE = 1e-4


def save_random_gemma3(folder, architecture="Gemma3TextModel", bidirectional=True, pooling=None, **overrides):
    """A random checkpoint: norms' deltas from one in [-0.5, 0.5], every other weight (biases too) of
    standard deviation 0.1; query_pre_attn_scalar unlike head_dim, so that the softmax scale matters; a
    word-level tokenizer; sentence-transformers files with `pooling` (and Normalize) if given."""
    import transformers

    settings = dict(
        vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4, num_key_value_heads=2, head_dim=24, query_pre_attn_scalar=40,
        sliding_window=SLIDING_WINDOW, layer_types=LAYER_TYPES, max_position_embeddings=128,
        use_bidirectional_attention=bidirectional, pad_token_id=0, architectures=[architecture],
    )  # fmt: skip
    config = transformers.Gemma3TextConfig(**{**settings, **overrides})
    torch.manual_seed(0)
    model = randomized(getattr(transformers, architecture)(config).eval(), 0.1, norms=(-0.5, 0.5))
    model.save_pretrained(folder)
    save_word_tokenizer(folder)
    if pooling is not None:
        write_pooling_files(folder, pooling)
    return model


def reference_tokens(model, ids):
    """transformers' final hidden states of one sequence (no padding) [len(ids), hidden]."""
    encoder = model.model if hasattr(model, "model") else model
    with torch.inference_mode():
        return encoder(input_ids=torch.tensor([ids])).last_hidden_state[0]


def posy_tokens(model, ids):
    """posy's finished hidden states of one sequence [len(ids), hidden]."""
    batch = pack([ids])
    with torch.inference_mode():
        stream = model.backbone.encode(batch, AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen))
        return model.backbone.finish(stream)


def sliding_layers(model):
    return [layer.attention for layer in model.backbone.layers if layer.attention.window is not None]


@pytest.mark.parametrize("bidirectional", [True, False])
def test_the_sliding_window_is_transformers_own_to_the_key(tmp_path, bidirectional):
    """Bidirectional: config.json's window W is W // 2 keys each side; causal: W - 1 keys back. Every token's
    hidden state matches transformers; with one key fewer or more a side, or no window, it does not."""
    reference = save_random_gemma3(tmp_path, bidirectional=bidirectional)
    spec, model = load(tmp_path)
    half = SLIDING_WINDOW // 2
    window = (half, half) if bidirectional else (SLIDING_WINDOW - 1, 0)
    assert model.backbone.config.window == window and spec.bidirectional == bidirectional
    assert len(sliding_layers(model)) == LAYER_TYPES.count("sliding_attention")
    ids = random_sequences([40], seed=2)[0]
    expected = reference_tokens(reference, ids)
    assert (posy_tokens(model, ids) - expected).abs().max().item() <= 1e-4
    left, right = window
    for wrong in ((left - 1, right - bidirectional), (left + 1, right + bidirectional), None):
        for attention in sliding_layers(model):
            attention.window = wrong
        assert (posy_tokens(model, ids) - expected).abs().max().item() > 1e-2, wrong
        for attention in sliding_layers(model):
            attention.window = window


@pytest.mark.parametrize("pooling", ["mean", "lasttoken"])
def test_causal_embedder_matches_transformers(tmp_path, pooling):
    reference = save_random_gemma3(tmp_path, bidirectional=False, pooling=pooling)
    spec, model = load(tmp_path)
    assert (spec.architecture, spec.implementation, spec.bidirectional) == ("Gemma3TextModel", "posy", False)
    assert spec.pooling == {"mean": "mean", "lasttoken": "last"}[pooling]
    sequences = random_sequences(SEQLENS)
    with torch.inference_mode():
        ours = model(pack(sequences))
        alone = torch.cat([model(pack([ids])) for ids in sequences])
    rows = [reference_tokens(reference, ids) for ids in sequences]
    pooled = torch.stack([row.mean(0) if pooling == "mean" else row[-1] for row in rows])
    assert_same_vectors(ours, F.normalize(pooled, dim=-1))
    assert_same_vectors(ours, alone)  # a sequence's vector does not depend on its batch mates


def test_bidirectional_embedder_without_sentence_transformers_files_is_mean_pooled(tmp_path):
    """use_bidirectional_attention makes it bidirectional, hence mean-pooled; with QKV and output biases."""
    reference = save_random_gemma3(tmp_path, attention_bias=True)
    spec, model = load(tmp_path)
    assert (spec.bidirectional, spec.pooling, spec.normalize) == (True, "mean", True)
    assert model.backbone.layers[0].attention.qkv.bias is not None
    sequences = random_sequences(SEQLENS)
    with torch.inference_mode():
        ours = model(pack(sequences))
        alone = torch.cat([model(pack([ids])) for ids in sequences])
    expected = torch.stack([reference_tokens(reference, ids).mean(0) for ids in sequences])
    assert_same_vectors(ours, F.normalize(expected, dim=-1))
    assert_same_vectors(ours, alone)


def test_embeddinggemmas_layout_needs_its_sliding_window(tmp_path):
    """EmbeddingGemma's layout (tests/engine/test_fallback.py's checkpoint: two Dense modules, Normalize,
    head dim 256) natively against sentence-transformers, and without the window it fails."""
    from sentence_transformers import SentenceTransformer

    from tests.engine.test_bert_parity import TEXTS
    from tests.engine.test_fallback import encode, save_embeddinggemma_layout

    folder = save_embeddinggemma_layout(tmp_path / "model")
    spec = resolve_model(str(folder))
    assert (spec.implementation, spec.bidirectional, spec.pooling) == ("posy", True, "mean")
    assert len(spec.dense) == 2
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    sequences = encode(spec, TEXTS)
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True).float()
    with torch.inference_mode():
        assert_same_vectors(model(pack(sequences)), expected)
        for attention in sliding_layers(model):
            attention.window = None
        unwindowed = model(pack(sequences))
    long = torch.tensor([len(ids) > 5 for ids in sequences])
    assert F.cosine_similarity(unwindowed, expected)[long].min().item() < 0.999


@pytest.mark.parametrize("bidirectional", [False, True])
def test_sequence_classifier_matches_transformers(tmp_path, bidirectional):
    """Gemma3TextForSequenceClassification: the last token that is not the pad token, through `score`."""
    reference = save_random_gemma3(
        tmp_path, "Gemma3TextForSequenceClassification", bidirectional=bidirectional, num_labels=3
    )
    spec, model = load(tmp_path)
    assert (spec.task, spec.num_labels, spec.bidirectional, spec.implementation) == (
        "score", 3, bidirectional, "posy",
    )  # fmt: skip
    sequences = random_sequences(SEQLENS)
    sequences[1], sequences[4] = sequences[1] + [0], sequences[4] + [0, 0]  # trailing pad tokens
    with torch.inference_mode():
        ours = model(pack(sequences))
        expected = torch.cat([reference(input_ids=torch.tensor([ids])).logits for ids in sequences])
    assert ours.shape == (len(SEQLENS), 3)
    assert (ours - expected).abs().max().item() <= LOGIT_TOLERANCE


def test_a_causal_lm_with_sentence_transformers_files_runs_bare(tmp_path):
    reference = save_random_gemma3(tmp_path, "Gemma3ForCausalLM", bidirectional=False, pooling="lasttoken")
    spec, model = load(tmp_path)
    assert (spec.architecture, spec.task, spec.pooling) == ("Gemma3TextModel", "embed", "last")
    sequences = random_sequences(SEQLENS)
    with torch.inference_mode():
        ours = model(pack(sequences))
    expected = torch.stack([reference_tokens(reference, ids)[-1] for ids in sequences])
    assert_same_vectors(ours, F.normalize(expected, dim=-1))
    (tmp_path / "modules.json").unlink()  # a bare causal LM: no Gemma3 judge format to score with
    with pytest.raises(UnsupportedModel, match="Gemma3ForCausalLM"):
        resolve_model(str(tmp_path))


def test_a_missing_norm_fails_the_load(tmp_path):
    save_random_gemma3(tmp_path)
    without_tensor(tmp_path, "post_feedforward_layernorm.weight")
    with pytest.raises(WeightLoadError, match=r"missing.*post_feedforward_layernorm\.weight"):
        load(tmp_path)


def test_float16_is_refused(tmp_path):
    save_random_gemma3(tmp_path)
    spec = resolve_model(str(tmp_path))
    with pytest.raises(UnsupportedModel, match="float16"):
        load_model(spec, "cpu", torch.float16, select_backend("torch", "cpu"))


def test_the_embedding_scale_is_rounded_to_the_model_dtype():
    """As transformers' Gemma3TextScaledWordEmbedding: sqrt(hidden_size) cast to the weights' dtype."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3TextScaledWordEmbedding

    for dtype in (torch.float32, torch.bfloat16):
        embedding = Gemma3TextScaledWordEmbedding(4, 768, 0, embed_scale=768**0.5).to(dtype)
        assert embedding_scale(768, dtype) == embedding.embed_scale.to(dtype).item()
    assert embedding_scale(768, torch.bfloat16) == 27.75


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        (
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                }
            },
            "'linear'",
        ),
        ({"hidden_activation": "relu"}, "hidden_activation 'relu'"),
    ],
)
def test_a_config_value_posy_cannot_honour_runs_through_transformers(tmp_path, overrides, reason):
    save_random_gemma3(tmp_path, **overrides)
    assert resolve_model(str(tmp_path)).implementation == "transformers"
    with pytest.raises(UnsupportedModel, match=reason):
        resolve_model(str(tmp_path), model_impl="posy")


def test_the_mask_comes_from_the_config_alone(tmp_path):
    """--bidirectional cannot turn a causal Gemma3 bidirectional (transformers' Gemma3 has its own switch)."""
    save_random_gemma3(tmp_path, bidirectional=False)
    with pytest.raises(UnsupportedModel, match="bidirectionally"):
        resolve_model(str(tmp_path), bidirectional=True)
