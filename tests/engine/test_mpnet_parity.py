"""Tiny random MPNet vs transformers, fp32: MPNetModel's mean-pooled vectors and
MPNetForSequenceClassification's logits, on sequences long enough (up to 300 tokens) to reach the
relative position buckets past 128 tokens, which every layer adds inside the packed attention; the
window (positions after the padding index 1)."""

import pytest
import torch
import torch.nn.functional as F

from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.errors import AttentionBackendUnavailable, WeightLoadError
from engine.models.bert import MAX_DISTANCE, relative_position_buckets
from engine.weights import load_model
from tests.engine.checkpoint_edits import without_tensor
from tests.engine.test_roberta_parity import (
    COSINE_TOLERANCE,
    LOGIT_TOLERANCE,
    padded,
    random_sequences,
    save_random_model,
)

SEQLENS = [2, 300, 17, 5, 140, 3, 64, 200, 9]  # with <s> and </s>; 300 is the window
FAR_BUCKETS = [14, 15, 30, 31]  # offsets of 64 tokens and more, on either side


def tiny_config(architecture, num_labels=1):
    import transformers

    return transformers.MPNetConfig(
        vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=302, relative_attention_num_buckets=32, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, num_labels=num_labels, architectures=[architecture],
    )  # fmt: skip


def sequences():
    return random_sequences(SEQLENS, seed=4)  # <s>=0 ... </s>=2, never the pad id 1


def mean_vectors(reference, batch):
    input_ids, attention_mask = padded(batch)
    with torch.inference_mode():
        hidden = reference(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    mask = attention_mask.unsqueeze(-1).float()
    return F.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def load(folder, backend="torch"):
    spec = resolve_model(str(folder))
    return spec, load_model(spec, "cpu", torch.float32, select_backend(backend, "cpu"))


def test_buckets_are_transformers_buckets():
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    offsets = torch.arange(-3 * MAX_DISTANCE, 3 * MAX_DISTANCE + 1)
    expected = MPNetEncoder.relative_position_bucket(offsets)
    assert torch.equal(relative_position_buckets(offsets), expected)
    # past MAX_DISTANCE a side keeps its last bucket, so the attention's table stops there
    assert set(expected[offsets >= MAX_DISTANCE].tolist()) == {31}
    assert set(expected[offsets <= -MAX_DISTANCE].tolist()) == {15}


def test_encoder_matches_transformers_and_reaches_the_far_buckets(tmp_path):
    import transformers

    reference = save_random_model(tmp_path, transformers.MPNetModel, tiny_config("MPNetModel"))
    spec, model = load(tmp_path)
    assert (spec.architecture, spec.task, spec.pooling, spec.max_seq_length) == (
        "MPNetModel", "embed", "mean", 300,
    )  # fmt: skip
    batch = sequences()
    with torch.inference_mode():
        ours = model(pack(batch))
        alone = torch.cat([model(pack([one])) for one in batch])
    expected = mean_vectors(reference, batch)
    assert F.cosine_similarity(ours, expected).min().item() >= COSINE_TOLERANCE
    assert F.cosine_similarity(ours, alone).min().item() >= COSINE_TOLERANCE  # batch invariance


def test_classifier_matches_transformers(tmp_path):
    import transformers

    architecture = "MPNetForSequenceClassification"
    reference = save_random_model(
        tmp_path, transformers.MPNetForSequenceClassification, tiny_config(architecture, 2)
    )
    with torch.no_grad():  # a bias on the scale of the scores, so that every bucket moves the logits
        reference.mpnet.encoder.relative_attention_bias.weight.mul_(20.0)
    reference.save_pretrained(tmp_path)
    spec, model = load(tmp_path)
    assert (spec.task, spec.num_labels) == ("score", 2)
    batch = sequences()
    input_ids, attention_mask = padded(batch)
    with torch.inference_mode():
        ours = model(pack(batch))
        alone = torch.cat([model(pack([one])) for one in batch])
        expected = reference(input_ids=input_ids, attention_mask=attention_mask).logits
        assert (ours - expected).abs().max().item() <= LOGIT_TOLERANCE
        assert (ours - alone).abs().max().item() <= LOGIT_TOLERANCE
        # the far buckets count: without them the long sequences' logits move past ten tolerances
        reference.mpnet.encoder.relative_attention_bias.weight[FAR_BUCKETS] = 0.0
        ablated = reference(input_ids=input_ids, attention_mask=attention_mask).logits
    long = torch.tensor(SEQLENS) > 128
    assert (ours[long] - ablated[long]).abs().amax(1).min().item() > 10 * LOGIT_TOLERANCE


def test_masked_lm_with_sentence_transformers_files_is_the_bare_encoder(tmp_path):
    import json

    import transformers

    reference = save_random_model(tmp_path, transformers.MPNetForMaskedLM, tiny_config("MPNetForMaskedLM"))
    modules = [("0", "", "Transformer"), ("1", "1_Pooling", "Pooling"), ("2", "2_Normalize", "Normalize")]
    (tmp_path / "modules.json").write_text(
        json.dumps(
            [
                {"idx": index, "name": name, "path": path, "type": f"sentence_transformers.models.{kind}"}
                for index, (name, path, kind) in enumerate(modules)
            ]
        )
    )
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, "pooling_mode_mean_tokens": True})
    )
    spec, model = load(tmp_path)
    assert (spec.architecture, spec.implementation) == ("MPNetModel", "posy")
    batch = sequences()
    with torch.inference_mode():
        ours = model(pack(batch))
    assert F.cosine_similarity(ours, mean_vectors(reference.mpnet, batch)).min().item() >= COSINE_TOLERANCE


def test_a_missing_bias_table_fails_the_load(tmp_path):
    import transformers

    save_random_model(tmp_path, transformers.MPNetModel, tiny_config("MPNetModel"))
    without_tensor(tmp_path, "encoder.relative_attention_bias.weight")
    with pytest.raises(WeightLoadError, match="missing.*relative_attention_bias"):
        load(tmp_path)


def test_only_backends_that_add_the_bias_run_it():
    from engine.attention.torch_varlen import TorchVarlenAttention
    from engine.attention.triton_backend import TritonAttention

    assert select_backend("auto", "cpu", position_bias=True).name == "torch"
    with pytest.raises(AttentionBackendUnavailable, match="torch-varlen cannot add a relative position bias"):
        TorchVarlenAttention().check(position_bias=True)
    # the packed kernel then runs the long sequences too, which it would hand to FlashAttention
    triton = TritonAttention(kernel=None, long_sequences=(TorchVarlenAttention,))
    triton.check(num_heads=12, num_kv_heads=12, head_dim=64, dtype=torch.bfloat16, position_bias=True)
    assert triton.long_sequences is None


MPNET_BASE = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
    "max_position_embeddings": 514,
}
GPU_LENGTHS = [3, 17, 64, 5, 200, 512, 33, 128, 2, 300]


@pytest.mark.gpu
@pytest.mark.parametrize("backend_name", ["torch", "triton", "auto"])
def test_mpnet_base_in_bf16_on_cuda_matches_the_fp32_reference(tmp_path, backend_name):
    """all-mpnet-base-v2's shape, random weights: the bf16 embedder (the bias added in the Triton kernel at
    every length) and the engine with CUDA graphs against fp32 transformers, cosine >= 0.999."""
    import transformers

    from tests.engine.graph_runs import assert_engine_gives, mean_vectors_on_cuda

    config = tiny_config("MPNetModel")
    for name, value in MPNET_BASE.items():
        setattr(config, name, value)
    reference = save_random_model(tmp_path, transformers.MPNetModel, config, std=None)
    spec = resolve_model(str(tmp_path))
    try:
        backend = select_backend(
            backend_name, "cuda", num_heads=12, num_kv_heads=12, head_dim=64, dtype=torch.bfloat16,
            position_bias=True,
        )  # fmt: skip
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))
    if backend_name == "auto":
        assert backend.name == "triton" and backend.long_sequences is None
        refused = "flashinfer cannot add a relative position bias"
        with pytest.raises(AttentionBackendUnavailable, match=refused):
            select_backend("flashinfer", "cuda", head_dim=64, dtype=torch.bfloat16, position_bias=True)
    generator = torch.Generator().manual_seed(3)
    batch = [[0, *torch.randint(3, 1000, (n - 2,), generator=generator).tolist(), 2] for n in GPU_LENGTHS]
    expected = mean_vectors_on_cuda(reference, batch)
    with torch.inference_mode():
        model = load_model(spec, "cuda", torch.bfloat16, backend)
        ours = model(pack(batch).to("cuda")).cpu()
    assert F.cosine_similarity(ours, expected).min().item() >= 0.999
    if backend_name == "auto":
        del model
        assert_engine_gives(spec, expected, batch)
