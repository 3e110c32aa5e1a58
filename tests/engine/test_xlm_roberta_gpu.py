"""XLM-RoBERTa on CUDA at bge-m3's shape (random weights, a small vocabulary): the CLS-pooled embedder
(bge-m3's dense vectors) and the one-logit cross-encoder (bge-reranker-v2-m3) in bf16 against the fp32
transformers reference (cosine >= 0.999; scores within 1e-2, same order where the gaps are wider),
with every attention backend that can run them and through the engine with CUDA graphs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from benchmarks.checkpoints import write_sentence_transformers
from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.errors import AttentionBackendUnavailable
from engine.weights import load_model
from tests.engine.graph_runs import run_three_times

pytestmark = pytest.mark.gpu

BGE_M3_SHAPE = {
    "hidden_size": 1024,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,  # head dim 64
    "intermediate_size": 4096,
    "max_position_embeddings": 8194,
    "type_vocab_size": 1,
    "layer_norm_eps": 1e-5,
}
VOCAB_SIZE = 2000
BACKENDS = ["torch", "torch-varlen", "triton", "flashinfer", "flash-attn"]
LENGTHS = [3, 17, 64, 5, 200, 512, 33, 128, 2, 300, 1000]
COSINE_TOLERANCE = 0.999
SCORE_TOLERANCE = 1e-2


def save_xlm_roberta(folder, architecture):
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    config = transformers.XLMRobertaConfig(
        vocab_size=VOCAB_SIZE, pad_token_id=1, bos_token_id=0, eos_token_id=2, num_labels=1,
        architectures=[architecture], **BGE_M3_SHAPE,
    )  # fmt: skip
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config).eval()
    model.save_pretrained(folder)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    Tokenizer(WordLevel(vocab, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    if architecture == "XLMRobertaModel":  # bge-m3's sentence-transformers files: CLS, normalized
        write_sentence_transformers(folder, "cls")
    return model


def random_sequences(lengths=LENGTHS, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [[0, *torch.randint(3, VOCAB_SIZE, (n - 2,), generator=generator).tolist(), 2] for n in lengths]


def reference_outputs(reference, sequences):
    """The fp32 transformers model on the GPU, one sequence at a time: CLS vectors or logits."""
    reference = reference.to("cuda")
    rows = []
    with torch.inference_mode():
        for ids in sequences:
            output = reference(input_ids=torch.tensor([ids], device="cuda"))
            rows.append(output.logits[0] if hasattr(output, "logits") else output.last_hidden_state[0, 0])
    reference.to("cpu")
    return torch.stack(rows).float().cpu()


def backend_or_skip(name, spec, dtype=torch.bfloat16):
    try:
        return select_backend(name, "cuda", num_heads=16, num_kv_heads=16, head_dim=64, dtype=dtype)
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bge-m3-shape")
    return folder, save_xlm_roberta(folder, "XLMRobertaModel")


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_cls_embedder_in_bf16_matches_the_fp32_reference(embedder, backend_name):
    folder, reference = embedder
    spec = resolve_model(str(folder))
    assert (spec.pooling, spec.normalize, spec.max_seq_length) == ("cls", True, 8192)
    model = load_model(spec, "cuda", torch.bfloat16, backend_or_skip(backend_name, spec))
    sequences = random_sequences()
    with torch.inference_mode():
        ours = model(pack(sequences).to("cuda")).cpu()
    cosines = F.cosine_similarity(ours, F.normalize(reference_outputs(reference, sequences), dim=-1))
    assert cosines.min().item() >= COSINE_TOLERANCE, (backend_name, cosines)


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_cross_encoder_scores_in_bf16_match_the_fp32_reference(tmp_path, backend_name):
    reference = save_xlm_roberta(tmp_path, "XLMRobertaForSequenceClassification")
    spec = resolve_model(str(tmp_path))
    model = load_model(spec, "cuda", torch.bfloat16, backend_or_skip(backend_name, spec))
    sequences = random_sequences([512] * 8 + [40, 7, 130], seed=3)
    with torch.inference_mode():
        ours = model(pack(sequences).to("cuda")).cpu().double().sigmoid()[:, 0]
    expected = reference_outputs(reference, sequences).double().sigmoid()[:, 0]
    assert (ours - expected).abs().max().item() <= SCORE_TOLERANCE
    order = expected.argsort(descending=True)
    for better, worse in zip(order[:-1], order[1:]):
        if expected[better] - expected[worse] > 2 * SCORE_TOLERANCE:
            assert ours[better] > ours[worse]


def test_engine_with_cuda_graphs_gives_the_reference_vectors(embedder):
    folder, reference = embedder
    requests = [random_sequences([3 + (i * 37) % 250, 2 + i % 5], seed=i) for i in range(12)]
    config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=8192)
    results, graphs = run_three_times(resolve_model(str(folder)), config, requests)
    assert graphs is not None
    assert graphs.graphs, "no graph was captured"
    for request, runs in zip(requests, results):
        expected = F.normalize(reference_outputs(reference, request), dim=-1).numpy()
        for rows in runs:
            assert ((rows * expected).sum(1) / np.linalg.norm(rows, axis=1)).min() >= COSINE_TOLERANCE
