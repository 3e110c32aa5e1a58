"""Gemma3 on CUDA at EmbeddingGemma-300m's shape (random weights of standard deviation 0.02, a small
vocabulary): bf16 posy against the fp32 transformers reference (cosine >= 0.999), bidirectional with two
Dense modules and Normalize, and causal, with every attention backend that runs head dim 256 and the
model's sliding window, over texts longer than the 512-token window; through the engine with CUDA graphs;
the Gemma3 switches of the fused kernels (1 + weight norms, the GELU-tanh gate) against the torch ops."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.errors import AttentionBackendUnavailable
from engine.models.decoder import DecoderBackbone
from engine.weights import load_model
from tests.engine.graph_runs import run_three_times

pytestmark = pytest.mark.gpu

EMBEDDINGGEMMA_SHAPE = {
    "hidden_size": 768,
    "num_hidden_layers": 24,
    "num_attention_heads": 3,
    "num_key_value_heads": 1,
    "head_dim": 256,
    "intermediate_size": 1152,
    "sliding_window": 512,
    "query_pre_attn_scalar": 256,
    "max_position_embeddings": 2048,
    # five sliding layers, then a full one
    "layer_types": ["full_attention" if index % 6 == 5 else "sliding_attention" for index in range(24)],
}
DENSE_SIZES = [(768, 3072), (3072, 768)]  # EmbeddingGemma's two Dense modules (Identity, no bias)
BACKENDS = ["torch", "torch-varlen", "triton", "flashinfer", "flash-attn"]
LONG_LENGTHS = [3, 17, 700, 64, 5, 200, 1500, 33, 513, 1, 300]  # past the window, and short ones
SHORT_LENGTHS = [3, 17, 64, 5, 128, 33, 1, 90]  # triton's own kernel (no sequence over 128)
COSINE_TOLERANCE = 0.999


def save_gemma3(folder, bidirectional=True):
    """A random Gemma3TextModel (norms' deltas from one in [-0.2, 0.2]) with sentence-transformers files:
    bidirectional, EmbeddingGemma's mean pooling, two Dense modules and Normalize; causal, the last token
    and Normalize. -> (the fp32 model, the Dense weights)."""
    import transformers
    from safetensors.torch import save_file

    from tests.engine.test_qwen3_parity import VOCAB_SIZE, randomized, save_word_tokenizer

    config = transformers.Gemma3TextConfig(
        vocab_size=VOCAB_SIZE, use_bidirectional_attention=bidirectional, pad_token_id=0,
        architectures=["Gemma3TextModel"], **EMBEDDINGGEMMA_SHAPE,
    )  # fmt: skip
    torch.manual_seed(0)
    model = randomized(transformers.Gemma3TextModel(config).eval(), 0.02, norms=(-0.2, 0.2))
    model.save_pretrained(folder)
    save_word_tokenizer(folder)
    modules = [{"path": "", "type": "sentence_transformers.models.Transformer"}]
    modules.append({"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": 768, "pooling_mode": "mean" if bidirectional else "lasttoken"}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    dense = []
    generator = torch.Generator().manual_seed(1)
    for index, (in_features, out_features) in enumerate(DENSE_SIZES if bidirectional else []):
        path = folder / f"{2 + index}_Dense"
        path.mkdir()
        activation = "torch.nn.modules.linear.Identity"
        layer = {"in_features": in_features, "out_features": out_features, "bias": False}
        (path / "config.json").write_text(json.dumps({**layer, "activation_function": activation}))
        dense.append(torch.randn(out_features, in_features, generator=generator) * in_features**-0.5)
        save_file({"linear.weight": dense[-1]}, path / "model.safetensors")
        modules.append({"path": path.name, "type": "sentence_transformers.models.Dense"})
    modules.append({"path": f"{len(modules)}_Normalize", "type": "sentence_transformers.models.Normalize"})
    for index, module in enumerate(modules):
        module.update(idx=index, name=str(index))
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 2048}))
    return model, dense


def random_sequences(lengths, seed=1):
    from tests.engine.test_qwen3_parity import random_sequences

    return random_sequences(lengths, seed)


def reference_rows(reference, sequences):
    """The fp32 transformers model on the GPU, one sequence at a time, pooled as its files say, through
    the Dense modules, normalized. Eager attention always builds the sliding-window mask (transformers
    5.17's sdpa path dropped it for a causal 513-token text, one past the window)."""
    model, dense = reference
    bidirectional = model.config.use_bidirectional_attention
    model.set_attn_implementation("eager")
    model = model.to("cuda")
    rows = []
    with torch.inference_mode():
        for ids in sequences:
            hidden = model(input_ids=torch.tensor([ids], device="cuda")).last_hidden_state[0]
            row = hidden.mean(0) if bidirectional else hidden[-1]
            for weight in dense:
                row = row @ weight.to("cuda").T
            rows.append(row.cpu())
    model.to("cpu")
    return F.normalize(torch.stack(rows), dim=-1)


def backend_or_skip(name, spec):
    """The backend for the model's shape, its sliding window included (flashinfer has no two-sided one)."""
    shape = DecoderBackbone.attention_shape(spec)
    try:
        return select_backend(
            name,
            "cuda",
            num_heads=shape.num_heads,
            num_kv_heads=shape.num_kv_heads,
            head_dim=shape.head_dim,
            dtype=torch.bfloat16,
            window=shape.window,
        )
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def embeddinggemma(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embeddinggemma")
    return folder, save_gemma3(folder)


@pytest.fixture(scope="module")
def causal_gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("causal-gemma3")
    return folder, save_gemma3(folder, bidirectional=False)


@pytest.mark.parametrize("backend_name", BACKENDS)
@pytest.mark.parametrize("lengths", [LONG_LENGTHS, SHORT_LENGTHS], ids=["long", "short"])
def test_embeddinggemma_in_bf16_matches_the_fp32_reference(embeddinggemma, backend_name, lengths):
    folder, reference = embeddinggemma
    spec = resolve_model(str(folder))
    assert (spec.bidirectional, spec.pooling, spec.output_dim) == (True, "mean", 768)
    assert DecoderBackbone.attention_shape(spec).window == (256, 256)
    model = load_model(spec, "cuda", torch.bfloat16, backend_or_skip(backend_name, spec))
    sequences = random_sequences(lengths)
    with torch.inference_mode():
        ours = model(pack(sequences).to("cuda")).cpu()
    cosines = F.cosine_similarity(ours, reference_rows(reference, sequences))
    assert cosines.min().item() >= COSINE_TOLERANCE, (backend_name, cosines)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_causal_gemma3_in_bf16_matches_the_fp32_reference(causal_gemma3, backend_name):
    folder, reference = causal_gemma3
    spec = resolve_model(str(folder))
    assert DecoderBackbone.attention_shape(spec).window == (511, 0)
    model = load_model(spec, "cuda", torch.bfloat16, backend_or_skip(backend_name, spec))
    sequences = random_sequences(LONG_LENGTHS, seed=2)
    with torch.inference_mode():
        ours = model(pack(sequences).to("cuda")).cpu()
    cosines = F.cosine_similarity(ours, reference_rows(reference, sequences))
    assert cosines.min().item() >= COSINE_TOLERANCE, (backend_name, cosines)


def test_vector_does_not_depend_on_the_batch_in_bf16(embeddinggemma):
    folder, _ = embeddinggemma
    spec = resolve_model(str(folder))
    model = load_model(spec, "cuda", torch.bfloat16, backend_or_skip("auto", spec))
    lengths = [int(n) for n in torch.randint(1, 900, (24,), generator=torch.Generator().manual_seed(5))]
    sequences = random_sequences(lengths, seed=7)
    with torch.inference_mode():
        together = model(pack(sequences).to("cuda")).cpu()
        for index in (0, 11, 23):
            alone = model(pack([sequences[index]]).to("cuda")).cpu()[0]
            assert F.cosine_similarity(alone, together[index], dim=0).item() >= COSINE_TOLERANCE


def test_engine_with_cuda_graphs_gives_the_reference_vectors(embeddinggemma):
    folder, reference = embeddinggemma
    requests = [random_sequences([3 + (i * 137) % 900, 1 + i % 5], seed=i) for i in range(8)]
    requests.append(random_sequences([1200, 40], seed=99))
    config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=4096)
    results, graphs = run_three_times(resolve_model(str(folder)), config, requests)
    assert graphs is not None, "the serving backend for EmbeddingGemma should be graph-safe"
    assert graphs.graphs, "no graph was captured"
    for request, runs in zip(requests, results):
        expected = reference_rows(reference, request).numpy()
        for rows in runs:
            cosine = (rows * expected).sum(1) / np.linalg.norm(rows, axis=1)
            assert cosine.min() >= COSINE_TOLERANCE


def test_gemma3_switches_of_the_fused_kernels_in_bf16_match_the_torch_ops():
    from engine.layers import rms_norm, swiglu
    from engine.layers.qk_norm_rotary import QKNormRotary
    from engine.layers.rotary import apply_rotary, rotary_tables

    generator = torch.Generator(device="cuda").manual_seed(0)
    device, dtype = "cuda", torch.bfloat16

    def relative_error(got, want):
        return ((got.double() - want.double()).norm() / want.double().norm()).item()

    x, residual = torch.randn(2, 1000, 768, device=device, dtype=dtype, generator=generator)
    norm = rms_norm.AddRMSNorm(768, 1e-6, offset=True).to(device, dtype)
    with torch.no_grad():
        norm.weight.uniform_(-0.5, 0.5, generator=generator)
        got, total = norm(x, residual)
        alone, _ = norm(x, None)
    assert torch.equal(total, x + residual)
    assert relative_error(got, rms_norm.rms_norm(x + residual, norm.weight, 1e-6, offset=True)) <= 1e-2
    assert relative_error(alone, rms_norm.rms_norm(x, norm.weight, 1e-6, offset=True)) <= 1e-2

    layer = QKNormRotary(3, 1, 256, 1e-6, qk_norm=True, norm_offset=True).to(device, dtype)
    qkv = torch.randn(1000, 5 * 256, device=device, dtype=dtype, generator=generator)
    cos, sin = rotary_tables(torch.arange(1000, device=device) % 700, 256, 10_000.0, dtype)
    with torch.no_grad():
        layer.q_norm.weight.uniform_(-0.5, 0.5, generator=generator)
        layer.k_norm.weight.uniform_(-0.5, 0.5, generator=generator)
        q, k, v = (tensor.clone() for tensor in layer(qkv.clone(), cos, sin))
        plain_q, plain_k, plain_v = layer.split(qkv)
        assert relative_error(q, apply_rotary(layer.q_norm(plain_q), cos, sin)) <= 1e-2
        assert relative_error(k, apply_rotary(layer.k_norm(plain_k), cos, sin)) <= 1e-2
        assert torch.equal(v, plain_v)

    gate_up = torch.randn(1000, 2 * 1152, device=device, dtype=dtype, generator=generator)
    gate, up = gate_up.chunk(2, dim=-1)
    assert relative_error(swiglu.gated(gate_up, "gelu_tanh"), F.gelu(gate, approximate="tanh") * up) <= 1e-2
