"""The CUDA path on a real-size random-weight BERT (MiniLM's shape): parity with transformers on
the CPU in fp32 (cosine >= 0.9999, logits <= 1e-4) and bf16 (cosine >= 0.999), batch invariance,
the engine's LazyTensor completion under concurrency, and the whole server on the GPU."""

import asyncio
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.attention import select_backend
from engine.batch import pack
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.weights import load_model

pytestmark = pytest.mark.gpu

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(995)]
MINILM_SHAPE = {
    "hidden_size": 384,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "intermediate_size": 1536,
}  # head dim 32
BERT_BASE_SHAPE = {
    "hidden_size": 768,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "intermediate_size": 3072,
}  # head dim 64
SHAPES = {"minilm": MINILM_SHAPE, "bert-base": BERT_BASE_SHAPE}


def save_random_bert(folder, architecture="BertModel", num_labels=1, shape=MINILM_SHAPE):
    import transformers
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from tokenizers.processors import TemplateProcessing

    config = transformers.BertConfig(
        vocab_size=len(VOCAB),
        max_position_embeddings=512,
        num_labels=num_labels,
        architectures=[architecture],
        **shape,
    )
    model_class = getattr(transformers, architecture)
    torch.manual_seed(0)
    model = model_class(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.05)
    model.save_pretrained(folder)
    tokenizer = Tokenizer(WordLevel({token: i for i, token in enumerate(VOCAB)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tokenizer.post_processor = TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tokenizer.save(str(folder / "tokenizer.json"))
    return model


def random_sequences(lengths, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [[2, *torch.randint(5, len(VOCAB), (n - 2,), generator=generator).tolist(), 3] for n in lengths]


def reference_mean_pooled(model, sequences):
    rows = []
    with torch.no_grad():
        for ids in sequences:
            hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0]
            rows.append(F.normalize(hidden.mean(0), dim=-1))
    return torch.stack(rows)


LENGTHS = [3, 17, 64, 5, 200, 512, 33, 128, 2, 300]


@pytest.fixture(scope="module", params=list(SHAPES))
def bert(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return folder, save_random_bert(folder, shape=SHAPES[request.param])


def serving_backend(spec, dtype):
    """The backend the engine would pick for this model with CUDA graphs on."""
    config = spec.hf_config
    return select_backend(
        "auto",
        "cuda",
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_attention_heads,
        head_dim=config.hidden_size // config.num_attention_heads,
        dtype=dtype,
        graphs=True,
    )


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 0.9999), (torch.bfloat16, 0.999)])
@pytest.mark.parametrize("choice", ["torch", "serving"])
def test_embedder_matches_transformers_on_cuda(bert, dtype, tolerance, choice):
    folder, reference = bert
    spec = resolve_model(str(folder))
    # "serving": what the engine picks (torch-varlen in bf16; torch in fp32, which FlashAttention lacks)
    backend = select_backend("torch", "cuda") if choice == "torch" else serving_backend(spec, dtype)
    model = load_model(spec, "cuda", dtype, backend)
    sequences = random_sequences(LENGTHS)
    with torch.inference_mode():
        ours = model(pack(sequences).to("cuda")).cpu()
    cosines = F.cosine_similarity(ours, reference_mean_pooled(reference, sequences))
    assert cosines.min().item() >= tolerance, (backend.name, cosines)


def test_vector_does_not_depend_on_the_batch_in_bf16(bert):
    folder, _ = bert
    spec = resolve_model(str(folder))
    model = load_model(spec, "cuda", torch.bfloat16, serving_backend(spec, torch.bfloat16))
    lengths = [int(n) for n in torch.randint(2, 400, (64,), generator=torch.Generator().manual_seed(5))]
    sequences = random_sequences(lengths, seed=7)
    with torch.inference_mode():
        together = model(pack(sequences).to("cuda")).float().cpu()
        for index in (0, 31, 63):
            alone = model(pack([sequences[index]]).to("cuda")).float().cpu()[0]
            assert F.cosine_similarity(alone, together[index], dim=0).item() >= 0.999


def test_cross_encoder_logits_match_transformers_on_cuda(tmp_path):
    reference = save_random_bert(tmp_path, "BertForSequenceClassification", num_labels=2)
    model = load_model(resolve_model(str(tmp_path)), "cuda", torch.float32, select_backend("auto", "cuda"))
    sequences = random_sequences([9, 130, 40, 3])
    types = [[0] * (n // 2) + [1] * (n - n // 2) for n in map(len, sequences)]
    with torch.inference_mode():
        ours = model(pack(sequences, types).to("cuda")).cpu()
    with torch.no_grad():
        expected = torch.cat(
            [
                reference(input_ids=torch.tensor([s]), token_type_ids=torch.tensor([t])).logits
                for s, t in zip(sequences, types)
            ]
        )
    assert (ours - expected).abs().max().item() <= 1e-4


def test_engine_on_cuda_resolves_concurrent_requests(bert):
    folder, _ = bert
    engine = build_engine(
        resolve_model(str(folder)), EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=2048)
    )
    requests = [random_sequences([3 + (i * 37) % 250, 2 + i % 5], seed=i) for i in range(48)]

    async def main():
        alone = [await engine.run(request) for request in requests]
        together = await asyncio.gather(*(engine.run(request) for request in requests))
        return alone, together

    try:
        alone, together = asyncio.run(main())
    finally:
        engine.stop()
    for one, other in zip(alone, together):
        cosine = (one * other).sum(1) / np.linalg.norm(one, axis=1) / np.linalg.norm(other, axis=1)
        assert cosine.min() >= 0.999


def test_server_on_cuda_serves_embeddings_and_rerank(bert):
    from litestar.testing import TestClient

    from api.app import create_app
    from api.config import EngineFlags, ServerConfig

    folder, reference = bert
    texts = ["w1 w2 w3", "w10 " * 300, "w7"]
    with TestClient(create_app(ServerConfig(models=(str(folder),), engine=EngineFlags("cuda")))) as client:
        response = client.post("/v1/embeddings", json={"input": texts})
        assert response.status_code == 200, response.text
        ours = torch.tensor([item["embedding"] for item in response.json()["data"]])
        ids = [[2, *[VOCAB.index(word) for word in text.split()], 3] for text in texts]
        cosines = F.cosine_similarity(ours, reference_mean_pooled(reference, ids))
        assert cosines.min().item() >= 0.999
        ranked = client.post("/v2/rerank", json={"query": "w1 w2", "documents": texts}).json()["results"]
        assert sorted(result["index"] for result in ranked) == [0, 1, 2]
        print(json.dumps({"gpu": torch.cuda.get_device_name(), "bf16_min_cosine": cosines.min().item()}))
