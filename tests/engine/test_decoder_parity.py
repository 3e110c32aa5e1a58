"""Tiny random Qwen2, Llama, Mistral and Gemma vs transformers, fp32 on the CPU: the causal last-token
embedder (gte-Qwen2, e5-mistral, SFR-Embedding) with each variant's biases (Qwen2's on q, k and v; Llama's
attention_bias and mlp_bias), bidirectional on request, batch invariance, strict loading, Mistral's
sliding window bounding the window; and the decoder rerank heads (*ForSequenceClassification, Qwen3's
too), a Qwen3-Reranker conversion keeping the judge's prompt."""

import pytest
import torch

from engine.checkpoint.resolve import resolve_model
from engine.errors import WeightLoadError
from tests.engine.checkpoint_edits import without_tensor
from tests.engine.test_qwen3_parity import (
    VOCAB_SIZE,
    assert_same_vectors,
    last_tokens,
    load,
    mean_tokens,
    random_sequences,
    randomized,
    reference_hidden,
    save_random_qwen3,
    save_word_tokenizer,
)

SEQLENS = [1, 2, 17, 5, 40, 3, 48, 9]
VARIANTS = {
    "Qwen2Model": ("Qwen2Config", {}),
    "LlamaModel": ("LlamaConfig", {"attention_bias": True, "mlp_bias": True}),
    "MistralModel": ("MistralConfig", {"sliding_window": 48}),
    # Gemma's (1 + weight) norms and scaled embeddings, multi-query attention (one key/value head)
    "GemmaModel": ("GemmaConfig", {"num_key_value_heads": 1, "attention_bias": True}),
}
CLASSIFIERS = [
    "Qwen2ForSequenceClassification",
    "LlamaForSequenceClassification",
    "MistralForSequenceClassification",
    "GemmaForSequenceClassification",
    "Qwen3ForSequenceClassification",
]


def save_random_decoder(folder, architecture, num_labels=1):
    import transformers

    config_name, overrides = next(
        value for bare, value in VARIANTS.items() if architecture.startswith(bare[:-5])
    )
    settings = dict(
        vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, intermediate_size=96, max_position_embeddings=128,
        rms_norm_eps=1e-6, tie_word_embeddings=False, architectures=[architecture], num_labels=num_labels,
        pad_token_id=0,
    )  # fmt: skip
    config = getattr(transformers, config_name)(**{**settings, **overrides})
    torch.manual_seed(0)
    model = randomized(getattr(transformers, architecture)(config).eval(), 0.1)  # biases too
    model.save_pretrained(folder)
    save_word_tokenizer(folder)
    return model


@pytest.mark.parametrize("architecture", list(VARIANTS))
def test_causal_embedder_matches_transformers(tmp_path, architecture):
    reference = save_random_decoder(tmp_path, architecture)
    spec, model = load(tmp_path)
    window = 48 if architecture == "MistralModel" else 128
    assert (spec.architecture, spec.task, spec.pooling, spec.normalize, spec.max_seq_length) == (
        architecture, "embed", "last", True, window,
    )  # fmt: skip
    sequences = random_sequences(SEQLENS)
    with torch.inference_mode():
        ours = model(pack_of(sequences))
        alone = torch.cat([model(pack_of([ids])) for ids in sequences])
    expected = torch.nn.functional.normalize(last_tokens(reference_hidden(reference, sequences), sequences))
    assert_same_vectors(ours, expected)
    assert_same_vectors(ours, alone)


def test_bidirectional_on_request_matches_transformers(tmp_path):
    """The causal switch is the variants' shared path; Qwen2's transformers class takes the full mask."""
    reference = save_random_decoder(tmp_path, "Qwen2Model")
    spec, model = load(tmp_path, bidirectional=True)
    assert (spec.bidirectional, spec.pooling) == (True, "mean")
    sequences = random_sequences(SEQLENS)
    with torch.inference_mode():
        ours = model(pack_of(sequences))
    hidden = reference_hidden(reference, sequences, causal=False)
    assert_same_vectors(ours, torch.nn.functional.normalize(mean_tokens(hidden, sequences)))


@pytest.mark.parametrize("architecture", CLASSIFIERS)
def test_sequence_classifier_matches_transformers(tmp_path, architecture):
    """The last token that is not the pad token, finished, through `score`."""
    if architecture.startswith("Qwen3"):
        reference = save_random_qwen3(tmp_path, architecture, num_labels=3, pad_token_id=0)
    else:
        reference = save_random_decoder(tmp_path, architecture, num_labels=3)
    spec, model = load(tmp_path)
    assert (spec.task, spec.num_labels, spec.output_dim, spec.pair_format) == ("score", 3, 3, "pair")
    sequences = random_sequences(SEQLENS)
    # trailing pad tokens (id 0), which transformers passes over to the last other token
    sequences[1], sequences[3] = sequences[1] + [0], sequences[3] + [0, 0]
    with torch.inference_mode():
        ours = model(pack_of(sequences))
        expected = torch.cat([reference(input_ids=torch.tensor([ids])).logits for ids in sequences])
    assert ours.shape == (len(SEQLENS), 3)
    assert (ours - expected).abs().max().item() <= 1e-4


def test_a_qwen3_reranker_conversion_formats_pairs_as_the_judge(tmp_path):
    """A sequence-classification conversion of Qwen3-Reranker (its model card names it) keeps the judge's
    prompt; another decoder classifier takes the tokenizer's pair template."""
    save_random_qwen3(tmp_path, "Qwen3ForSequenceClassification", pad_token_id=0)
    assert resolve_model(str(tmp_path)).pair_format == "pair"
    (tmp_path / "README.md").write_text("A sequence-classification conversion of Qwen/Qwen3-Reranker-0.6B.")
    assert resolve_model(str(tmp_path)).pair_format == "qwen3-judge"


def test_a_missing_bias_fails_the_load(tmp_path):
    save_random_decoder(tmp_path, "Qwen2Model")
    without_tensor(tmp_path, "k_proj.bias")
    with pytest.raises(WeightLoadError, match=r"missing.*k_proj\.bias"):
        load(tmp_path)


def pack_of(sequences):
    from engine.batch import pack

    return pack(sequences)


# Qwen2-1.5B's and Mistral-7B's layer shapes (fewer layers, a small vocabulary), random weights
GPU_SHAPES = {
    "Qwen2Model": dict(
        hidden_size=1536, num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960
    ),
    "MistralModel": dict(
        hidden_size=4096, num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336
    ),
}
GPU_LENGTHS = [3, 17, 64, 5, 200, 512, 33, 128, 2, 300]


@pytest.fixture(scope="module", params=list(GPU_SHAPES))
def gpu_decoder(request, tmp_path_factory):
    """(folder, sequences, the fp32 reference's normalized last-token vectors), one checkpoint a shape."""
    import transformers

    architecture = request.param
    folder = tmp_path_factory.mktemp(architecture)
    config_name, _ = VARIANTS[architecture]
    window = {"sliding_window": 4096} if architecture == "MistralModel" else {}
    config = getattr(transformers, config_name)(
        vocab_size=VOCAB_SIZE, num_hidden_layers=2, head_dim=128, max_position_embeddings=4096,
        rms_norm_eps=1e-6, architectures=[architecture], **GPU_SHAPES[architecture], **window,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = getattr(transformers, architecture)(config).eval()
    reference.save_pretrained(folder)
    save_word_tokenizer(folder)
    sequences = random_sequences(GPU_LENGTHS, seed=4)
    reference = reference.to("cuda")
    with torch.inference_mode():
        rows = [
            reference(input_ids=torch.tensor([ids], device="cuda")).last_hidden_state[0, -1]
            for ids in sequences
        ]
    del reference
    return folder, sequences, torch.nn.functional.normalize(torch.stack(rows).float().cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("backend_name", ["torch", "triton", "flashinfer", "auto"])
def test_real_shapes_in_bf16_on_cuda_match_the_fp32_reference(gpu_decoder, backend_name):
    """bf16 (the rotary-only Triton kernel, GQA) against fp32 transformers on the GPU, cosine >= 0.999;
    with `auto`, the engine with CUDA graphs too."""
    import numpy as np

    from engine.attention import select_backend
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig
    from engine.errors import AttentionBackendUnavailable
    from engine.weights import load_model
    from tests.engine.graph_runs import run_three_times

    folder, sequences, expected = gpu_decoder
    spec = resolve_model(str(folder))
    heads, kv_heads = spec.hf_config.num_attention_heads, spec.hf_config.num_key_value_heads
    try:
        backend = select_backend(
            backend_name, "cuda", num_heads=heads, num_kv_heads=kv_heads, head_dim=128, dtype=torch.bfloat16
        )
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))
    model = load_model(spec, "cuda", torch.bfloat16, backend)
    with torch.inference_mode():
        ours = model(pack_of(sequences).to("cuda")).cpu()
    assert_same_vectors_at(ours, expected, 0.999)
    if backend_name == "auto":
        del model
        config = EngineConfig(device="cuda", dtype="bfloat16")
        results, graphs = run_three_times(spec, config, [[ids] for ids in sequences])
        assert graphs is not None and graphs.graphs, "no graph was captured"
        for row, runs in zip(expected.numpy(), results):
            for rows in runs:
                assert float((rows[0] * row).sum() / np.linalg.norm(rows[0])) >= 0.999


def assert_same_vectors_at(ours, expected, tolerance):
    cosine = torch.nn.functional.cosine_similarity(ours, expected, dim=-1)
    assert cosine.min().item() >= tolerance, cosine
