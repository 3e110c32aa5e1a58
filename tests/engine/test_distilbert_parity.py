"""Tiny random DistilBERT vs transformers, fp32: mean-pooled vectors of DistilBertModel, logits of
DistilBertForSequenceClassification (pre-classifier, ReLU, classifier on the first token), and the
window (positions from 0: the whole position table)."""

import pytest
import torch
import torch.nn.functional as F

from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.errors import WeightLoadError
from engine.weights import load_model
from tests.engine.checkpoint_edits import without_tensor
from tests.engine.test_roberta_parity import COSINE_TOLERANCE, LOGIT_TOLERANCE, save_random_model

SEQLENS = [2, 17, 5, 40, 3, 64, 9]  # with [CLS] and [SEP]; 64 is the window


def tiny_config(architecture, num_labels=1, sinusoidal=False):
    import transformers

    return transformers.DistilBertConfig(
        vocab_size=1000,
        dim=64,
        n_layers=2,
        n_heads=4,
        hidden_dim=128,
        max_position_embeddings=64,
        activation="gelu",
        pad_token_id=0,
        sinusoidal_pos_embds=sinusoidal,
        num_labels=num_labels,
        architectures=[architecture],
    )


def sequences():
    generator = torch.Generator().manual_seed(2)
    # [CLS]=1 ... [SEP]=2, never the pad id 0
    return [[1, *torch.randint(3, 1000, (n - 2,), generator=generator).tolist(), 2] for n in SEQLENS]


def padded(batch):
    input_ids = torch.zeros(len(batch), max(SEQLENS), dtype=torch.int64)
    attention_mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(batch):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    return input_ids, attention_mask


def load(folder):
    spec = resolve_model(str(folder))
    return spec, load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))


@pytest.mark.parametrize("sinusoidal", [False, True])
def test_encoder_matches_transformers(tmp_path, sinusoidal):
    import transformers

    reference = save_random_model(
        tmp_path, transformers.DistilBertModel, tiny_config("DistilBertModel", sinusoidal=sinusoidal)
    )
    spec, model = load(tmp_path)
    assert (spec.architecture, spec.task, spec.pooling, spec.max_seq_length) == (
        "DistilBertModel", "embed", "mean", 64,
    )  # fmt: skip
    batch = sequences()
    input_ids, attention_mask = padded(batch)
    with torch.inference_mode():
        ours = model(pack(batch))
        alone = torch.cat([model(pack([one])) for one in batch])
        hidden = reference(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    mask = attention_mask.unsqueeze(-1).float()
    expected = F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert F.cosine_similarity(ours, expected).min().item() >= COSINE_TOLERANCE
    assert F.cosine_similarity(ours, alone).min().item() >= COSINE_TOLERANCE  # batch invariance


def test_classifier_matches_transformers(tmp_path):
    import transformers

    architecture = "DistilBertForSequenceClassification"
    reference = save_random_model(
        tmp_path, transformers.DistilBertForSequenceClassification, tiny_config(architecture, 3)
    )
    spec, model = load(tmp_path)
    assert (spec.task, spec.num_labels, spec.output_dim) == ("score", 3, 3)
    batch = sequences()
    input_ids, attention_mask = padded(batch)
    with torch.inference_mode():
        ours = model(pack(batch))
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    assert ours.shape == (len(SEQLENS), 3)
    assert (ours - expected).abs().max().item() <= LOGIT_TOLERANCE


def test_a_missing_tensor_fails_the_load(tmp_path):
    import transformers

    save_random_model(tmp_path, transformers.DistilBertModel, tiny_config("DistilBertModel"))
    without_tensor(tmp_path, "sa_layer_norm.bias")
    with pytest.raises(WeightLoadError, match="missing.*sa_layer_norm.bias"):
        load(tmp_path)


DISTILBERT_BASE = {
    "dim": 768,
    "n_layers": 6,
    "n_heads": 12,
    "hidden_dim": 3072,
    "max_position_embeddings": 512,
}
GPU_LENGTHS = [3, 17, 64, 5, 200, 512, 33, 128, 2, 300]


@pytest.mark.gpu
@pytest.mark.parametrize("backend_name", ["torch", "triton", "flashinfer", "auto"])
def test_distilbert_base_in_bf16_on_cuda_matches_the_fp32_reference(tmp_path, backend_name):
    """distilbert-base's shape, random weights: the bf16 embedder (the Triton embeddings kernel without a
    type table) and the engine with CUDA graphs against fp32 transformers, cosine >= 0.999."""
    import transformers

    from engine.errors import AttentionBackendUnavailable
    from tests.engine.graph_runs import assert_engine_gives, mean_vectors_on_cuda

    config = tiny_config("DistilBertModel")
    for name, value in DISTILBERT_BASE.items():
        setattr(config, name, value)
    reference = save_random_model(tmp_path, transformers.DistilBertModel, config)
    spec = resolve_model(str(tmp_path))
    try:
        backend = select_backend(
            backend_name, "cuda", num_heads=12, num_kv_heads=12, head_dim=64, dtype=torch.bfloat16
        )
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))
    generator = torch.Generator().manual_seed(3)
    batch = [[1, *torch.randint(3, 1000, (n - 2,), generator=generator).tolist(), 2] for n in GPU_LENGTHS]
    expected = mean_vectors_on_cuda(reference, batch)
    with torch.inference_mode():
        model = load_model(spec, "cuda", torch.bfloat16, backend)
        ours = model(pack(batch).to("cuda")).cpu()
    assert F.cosine_similarity(ours, expected).min().item() >= 0.999
    if backend_name == "auto":
        del model
        assert_engine_gives(spec, expected, batch)
