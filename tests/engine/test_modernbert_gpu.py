"""ModernBERT on CUDA at ModernBERT-base's shape (random weights): bf16 vectors against the fp32
transformers reference on the CPU (cosine >= 0.999) through every attention backend that runs sliding
windows on CUDA, and through the engine with lazy CUDA graphs."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.errors import AttentionBackendUnavailable
from engine.weights import load_model
from tests.engine.graph_runs import run_three_times

pytestmark = pytest.mark.gpu

BASE_SHAPE = {
    "hidden_size": 768,
    "num_attention_heads": 12,  # head dim 64
    "num_hidden_layers": 22,
    "intermediate_size": 1152,
    "local_attention": 128,  # sliding layers: 64 keys on each side
    "global_attn_every_n_layers": 3,
}
VOCAB_SIZE = 1000
TOLERANCE = 0.999  # min cosine, bf16 against fp32
# over the sliding window (129 keys) and over the triton kernel's SHORT_SEQLEN (128), where it hands
# batches to torch-varlen; and a batch of short ones only, which the triton kernel runs itself
BATCHES = {
    "long": [3, 17, 64, 5, 200, 512, 33, 128, 2, 300],
    "short": [3, 17, 64, 128, 90, 100, 2, 127],
}
# flashinfer has only causal windows; flash-attn runs where FlashAttention 4 is installed
WINDOWED_BACKENDS = ["torch", "torch-varlen", "triton", "flash-attn"]


def save_random_modernbert(folder):
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    config = transformers.ModernBertConfig(
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=1024,
        pad_token_id=1,
        bos_token_id=0,
        cls_token_id=0,
        eos_token_id=2,
        sep_token_id=2,
        architectures=["ModernBertModel"],
        **BASE_SHAPE,
    )
    torch.manual_seed(0)
    model = transformers.ModernBertModel(config).eval()
    with torch.no_grad():
        # LayerNorm scales near 1 and projections at BERT's init scale: attention is far from uniform
        # and every layer moves the residual stream, so a wrong window shows
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.normal_(1.0, 0.1)
            else:
                parameter.normal_(0.0, 0.02)
    model.save_pretrained(folder)
    vocab = {"[CLS]": 0, "[PAD]": 1, "[SEP]": 2, "[UNK]": 3}
    Tokenizer(WordLevel(vocab, unk_token="[UNK]")).save(str(folder / "tokenizer.json"))
    return model


def random_sequences(lengths, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [[0, *torch.randint(3, VOCAB_SIZE, (n - 2,), generator=generator).tolist(), 2] for n in lengths]


@pytest.fixture(scope="module")
def modernbert(tmp_path_factory):
    """(folder, {batch name: (sequences, fp32 reference vectors: mean-pooled, normalized)})."""
    folder = tmp_path_factory.mktemp("modernbert-base")
    reference = save_random_modernbert(folder)
    expected = {}
    for name, lengths in BATCHES.items():
        sequences = random_sequences(lengths, seed=len(name))
        with torch.inference_mode():
            rows = [
                reference(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0) for ids in sequences
            ]
        expected[name] = (sequences, F.normalize(torch.stack(rows), dim=-1))
    return folder, expected


@pytest.mark.parametrize("backend_name", WINDOWED_BACKENDS)
def test_bf16_matches_transformers_through_each_windowed_backend(modernbert, backend_name):
    folder, expected = modernbert
    spec = resolve_model(str(folder))
    try:
        backend = select_backend(
            backend_name,
            "cuda",
            num_heads=12,
            num_kv_heads=12,
            head_dim=64,
            dtype=torch.bfloat16,
            window=(64, 64),
        )
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))
    model = load_model(spec, "cuda", torch.bfloat16, backend)
    for name, (sequences, reference) in expected.items():
        with torch.inference_mode():
            ours = model(pack(sequences).to("cuda")).cpu()
        assert ours.dtype == torch.float32
        cosines = F.cosine_similarity(ours, reference)
        assert cosines.min().item() >= TOLERANCE, (backend_name, name, cosines)


def test_bf16_engine_with_cuda_graphs_matches_transformers(modernbert):
    folder, expected = modernbert
    config = EngineConfig(device="cuda", dtype="bfloat16", cuda_graphs="lazy", max_batch_tokens=2048)
    batches = [sequences for sequences, _ in expected.values()]
    runs, graphs = run_three_times(resolve_model(str(folder)), config, batches)
    results = dict(zip(expected, runs))
    assert graphs is not None and graphs.graphs, "the engine ran without CUDA graphs"
    for name, runs in results.items():
        reference = expected[name][1].numpy()
        for attempt, rows in enumerate(runs):
            cosines = (rows * reference).sum(1) / np.linalg.norm(rows, axis=1)
            assert cosines.min() >= TOLERANCE, (name, attempt, cosines)
