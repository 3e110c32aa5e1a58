"""Tiny random ModernBERT vs transformers, fp32: vectors (mean and CLS pooling, cosine >= 0.9999),
classifier logits (CLS and mean pooling, 1 and 2 labels, max abs error <= 1e-4), a masked-LM checkpoint
run as the encoder, the sliding window's exact width, batch invariance and strict weight loading."""

import json
import os

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.errors import WeightLoadError
from engine.weights import load_model
from tests.engine.checkpoint_edits import without_tensor

# with [CLS] and [SEP]; 64 is the model window. local_attention 8: a sliding layer's query sees 4 keys
# on each side, so most of these sequences are longer than the window
SEQLENS = [2, 17, 5, 40, 3, 64, 9, 10, 11]
LOCAL_ATTENTION = 8
COSINE_TOLERANCE = 0.9999
LOGIT_TOLERANCE = 1e-4
BIASES = {
    "no-biases": {},  # ModernBERT's own choice: no bias anywhere but the classifier
    "biases": {"norm_bias": True, "attention_bias": True, "mlp_bias": True, "classifier_bias": True},
}


def tiny_config(architecture, num_labels=1, **overrides):
    import transformers

    return transformers.ModernBertConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        global_attn_every_n_layers=2,  # full, sliding, full
        local_attention=LOCAL_ATTENTION,
        max_position_embeddings=64,
        pad_token_id=1,
        bos_token_id=0,
        cls_token_id=0,
        eos_token_id=2,
        sep_token_id=2,
        num_labels=num_labels,
        architectures=[architecture],
        **overrides,
    )


def save_random_model(folder, config):
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, config.architectures[0])(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # larger than the default init, so every weight matters
            parameter.normal_(0.0, 0.2)
    model.save_pretrained(folder)
    # the loader wants a fast tokenizer file next to the weights; its vocabulary plays no part here
    vocab = {"[CLS]": 0, "[PAD]": 1, "[SEP]": 2, "[UNK]": 3}
    Tokenizer(WordLevel(vocab, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
    return model


def write_sentence_transformers(folder, pooling_mode):
    """modules.json and 1_Pooling/config.json, as gte-modernbert-base ships them."""
    kinds = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize"}
    modules = [
        {"idx": index, "name": str(index), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for index, (kind, path) in enumerate(kinds.items())
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 64, "pooling_mode_cls_token": pooling_mode == "cls"}
    pooling["pooling_mode_mean_tokens"] = pooling_mode == "mean"
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))


def random_sequences(lengths=SEQLENS, seed=1):
    generator = torch.Generator().manual_seed(seed)
    # [CLS] ... [SEP], never the pad id 1 inside
    return [[0, *torch.randint(3, 1000, (n - 2,), generator=generator).tolist(), 2] for n in lengths]


def padded(sequences):
    input_ids = torch.ones(len(sequences), max(map(len, sequences)), dtype=torch.int64)  # pad id 1
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask


def reference_vectors(encoder, sequences, pooling):
    """The sentence-transformers vector: pooled final hidden states, normalized."""
    input_ids, attention_mask = padded(sequences)
    with torch.inference_mode():
        hidden = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    if pooling == "cls":
        return F.normalize(hidden[:, 0], dim=-1)
    mask = attention_mask.unsqueeze(-1).bool()
    return F.normalize(hidden.where(mask, 0.0).sum(1) / mask.sum(1), dim=-1)


def load(folder, backend=None):
    spec = resolve_model(str(folder))
    return spec, load_model(spec, "cpu", torch.float32, backend or select_backend("torch", "cpu"))


def embed(model, sequences):
    with torch.inference_mode():
        return model(pack(sequences))


def min_cosine(ours, expected):
    return F.cosine_similarity(ours, expected).min().item()


@pytest.mark.parametrize("biases", list(BIASES))
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_embedder_matches_transformers(tmp_path, pooling, biases):
    reference = save_random_model(tmp_path, tiny_config("ModernBertModel", **BIASES[biases]))
    if pooling == "cls":
        write_sentence_transformers(tmp_path, "cls")
    spec, model = load(tmp_path)
    # without sentence-transformers files: mean pooling, normalized, as for every posy embedder
    assert (spec.task, spec.pooling, spec.normalize, spec.max_seq_length) == ("embed", pooling, True, 64)
    sequences = random_sequences()
    ours = embed(model, sequences)
    assert ours.dtype == torch.float32 and ours.shape == (len(SEQLENS), 64)
    assert min_cosine(ours, reference_vectors(reference, sequences, pooling)) >= COSINE_TOLERANCE


def test_masked_lm_checkpoint_runs_as_the_encoder(tmp_path):
    reference = save_random_model(tmp_path, tiny_config("ModernBertForMaskedLM"))
    write_sentence_transformers(tmp_path, "mean")
    assert any(name.startswith(("head.", "decoder.")) for name in load_file(tmp_path / "model.safetensors"))
    spec, model = load(tmp_path)
    assert spec.architecture == "ModernBertModel"
    sequences = random_sequences()
    expected = reference_vectors(reference.model, sequences, "mean")
    assert min_cosine(embed(model, sequences), expected) >= COSINE_TOLERANCE


@pytest.mark.parametrize("num_labels", [1, 2])
@pytest.mark.parametrize("classifier_pooling", ["cls", "mean"])
@pytest.mark.parametrize("biases", list(BIASES))
def test_classifier_matches_transformers(tmp_path, classifier_pooling, num_labels, biases):
    config = tiny_config(
        "ModernBertForSequenceClassification",
        num_labels,
        classifier_pooling=classifier_pooling,
        classifier_activation="silu",  # not the encoder's gelu: the head's own activation must be read
        **BIASES[biases],
    )
    reference = save_random_model(tmp_path, config)
    spec, model = load(tmp_path)
    assert (spec.task, spec.num_labels, spec.output_dim) == ("score", num_labels, num_labels)
    sequences = random_sequences()
    input_ids, attention_mask = padded(sequences)
    with torch.inference_mode():
        ours = model(pack(sequences))
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    assert ours.dtype == torch.float32 and ours.shape == (len(SEQLENS), num_labels)
    assert (ours - expected).abs().max().item() <= LOGIT_TOLERANCE


@pytest.mark.parametrize("off_by", [-1, 1])
def test_a_window_one_key_off_fails_parity(tmp_path, off_by):
    """The parity above pins the window: one key more or fewer on each side breaks it."""
    reference = save_random_model(tmp_path, tiny_config("ModernBertModel"))
    _, model = load(tmp_path)
    sliding = [layer for layer in model.backbone.layers if layer.window is not None]
    assert [layer.window for layer in sliding] == [(LOCAL_ATTENTION // 2,) * 2]
    for layer in sliding:
        layer.window = (LOCAL_ATTENTION // 2 + off_by,) * 2
    sequences = random_sequences()
    expected = reference_vectors(reference, sequences, "mean")
    assert min_cosine(embed(model, sequences), expected) < COSINE_TOLERANCE


def test_vector_does_not_depend_on_the_batch(tmp_path):
    save_random_model(tmp_path, tiny_config("ModernBertModel"))
    _, model = load(tmp_path)
    sequences = random_sequences([40, 3, 64, 17, 40, 9], seed=4)
    together = embed(model, sequences)
    for index, ids in enumerate(sequences):
        torch.testing.assert_close(embed(model, [ids])[0], together[index], rtol=1e-5, atol=1e-6)
    # the same text at another place among other texts
    torch.testing.assert_close(embed(model, sequences[::-1]).flip(0), together, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "architecture, extra",
    [
        ("ModernBertModel", "model.layers.1.attn.rotary_emb.inv_freq"),
        ("ModernBertModel", "classifier.weight"),  # an embedder has no classifier to put it in
        ("ModernBertForSequenceClassification", "decoder.bias"),  # a classifier has no MLM head
    ],
)
def test_an_unknown_tensor_fails_the_load(tmp_path, architecture, extra):
    save_random_model(tmp_path, tiny_config(architecture))
    tensors = load_file(tmp_path / "model.safetensors")
    tensors[extra] = torch.zeros(4)
    save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(WeightLoadError, match=rf"unexpected: \['{extra}'\]"):
        load(tmp_path)


def test_a_missing_tensor_fails_the_load(tmp_path):
    save_random_model(tmp_path, tiny_config("ModernBertModel", norm_bias=True))
    without_tensor(tmp_path, "layers.2.mlp_norm.bias")
    with pytest.raises(WeightLoadError, match=r"missing: \['layers.2.mlp_norm.bias'\]"):
        load(tmp_path)


def test_sliding_window_through_the_interpreted_triton_kernel(tmp_path):
    """posy's packed Triton kernel (on the CPU through Triton's interpreter, in float32) runs the
    sliding layers with the same window: vectors match transformers'."""
    pytest.importorskip("triton")
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs Triton's interpreter (tests/conftest.py turns it on where there is no GPU)")
    from engine.attention import triton_backend

    reference = save_random_model(tmp_path, tiny_config("ModernBertModel"))
    backend = triton_backend.TritonAttention(triton_backend._triton_kernel(), long_sequences=())
    _, model = load(tmp_path, backend)
    sequences = random_sequences()
    ours = embed(model, sequences)
    assert min_cosine(ours, reference_vectors(reference, sequences, "mean")) >= COSINE_TOLERANCE
