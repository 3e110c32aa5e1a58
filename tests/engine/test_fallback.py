"""The transformers fallback: architectures posy does not pack run through transformers' own classes
behind the same engine. DeBERTa-v2 (eager attention) and ELECTRA (sdpa) as sentence-transformers embedders
(mean pooling, a Dense module, Normalize) against sentence-transformers on the same folder, and as
cross-encoders against transformers' logits; strict loading; remote code refused without
--trust-remote-code; --model-impl choosing the implementation (EmbeddingGemma's layout natively and through
transformers). fp32 on the CPU."""

import asyncio
import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from engine.attention import select_backend
from engine.batch import pack
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.errors import UnsupportedModel, WeightLoadError
from engine.weights import load_model
from tests.engine.checkpoint_edits import without_tensor
from tests.engine.test_bert_parity import TEXTS
from tests.engine.test_dense_parity import with_dense

COSINE_TOLERANCE = 0.9999
LOGIT_TOLERANCE = 1e-4
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")
SIZES = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)


def config_of(kind, architecture, num_labels=1):
    import transformers

    if kind == "deberta-v2":
        return transformers.DebertaV2Config(
            vocab_size=30522, max_position_embeddings=512, relative_attention=True, position_buckets=32,
            pos_att_type=["p2c", "c2p"], position_biased_input=False, num_labels=num_labels,
            architectures=[architecture], **SIZES,
        )  # fmt: skip
    return transformers.ElectraConfig(
        vocab_size=30522, embedding_size=32, max_position_embeddings=512, num_labels=num_labels,
        architectures=[architecture], **SIZES,
    )  # fmt: skip


def save_random(folder, kind, architecture, num_labels=1):
    """A random checkpoint (norms and biases too) with the bundled model's WordPiece tokenizer files."""
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config_of(kind, architecture, num_labels)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "LayerNorm.weight" in name:
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.1)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    source = resolve_model(None).path
    for name in TOKENIZER_FILES:
        shutil.copy(source / name, folder / name)
    return model


def st_embedder(folder, kind):
    """`kind`'s bare model with the bundled model's sentence-transformers files and one Dense module."""
    save_random(folder / "encoder", kind, f"{ARCHITECTURES[kind]}Model")
    with_dense(folder, [(64, 32, True, "torch.nn.modules.activation.Tanh", False)])  # copies the MiniLM files
    for name in [path.name for path in (folder / "encoder").iterdir()]:
        shutil.move(folder / "encoder" / name, folder / name)  # over MiniLM's config, weights, tokenizer
    (folder / "encoder").rmdir()
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 128, "do_lower_case": False})
    )
    return folder


ARCHITECTURES = {"deberta-v2": "DebertaV2", "electra": "Electra"}


def encode(spec, texts):
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec.max_seq_length)
    return [encoding.ids for encoding in tokenizer.encode_batch(texts)]


def load(spec):
    return load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))


@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_an_embedder_posy_does_not_pack_matches_sentence_transformers(tmp_path, kind):
    from sentence_transformers import SentenceTransformer

    folder = st_embedder(tmp_path / "model", kind)
    spec = resolve_model(str(folder))
    assert (spec.implementation, spec.task, spec.output_dim, spec.max_seq_length) == (
        "transformers",
        "embed",
        32,
        128,
    )
    model = load(spec)
    attention = "eager" if kind == "deberta-v2" else "sdpa"
    assert model.backbone.model.attention_implementation == attention
    with torch.inference_mode():
        ours = model(pack(encode(spec, TEXTS)))
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True).float()
    assert ours.shape == expected.shape == (len(TEXTS), 32)
    assert F.cosine_similarity(ours, expected).min().item() >= COSINE_TOLERANCE


@pytest.mark.parametrize("kind", list(ARCHITECTURES))
def test_a_cross_encoder_posy_does_not_pack_matches_transformers(tmp_path, kind):
    reference = save_random(tmp_path, kind, f"{ARCHITECTURES[kind]}ForSequenceClassification", num_labels=2)
    spec = resolve_model(str(tmp_path))
    assert (spec.implementation, spec.task, spec.num_labels) == ("transformers", "score", 2)
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_padding()  # the bundled tokenizer.json pads to 128; the server never pads
    pairs = [tokenizer.encode(TEXTS[6], text) for text in TEXTS[:8]]  # different lengths: padded groups
    with torch.inference_mode():
        ours = load(spec)(pack([pair.ids for pair in pairs], [pair.type_ids for pair in pairs]))
        expected = torch.cat(
            [
                reference(
                    input_ids=torch.tensor([pair.ids]), token_type_ids=torch.tensor([pair.type_ids])
                ).logits
                for pair in pairs
            ]
        )
    assert (ours - expected).abs().max().item() <= LOGIT_TOLERANCE


def test_the_engine_batches_the_fallback_like_any_model(tmp_path):
    """Through build_engine and the scheduler: requests of mixed lengths give each its own vectors."""
    folder = st_embedder(tmp_path / "model", "electra")
    spec = resolve_model(str(folder))
    engine = build_engine(spec, EngineConfig(device="cpu", dtype="float32"))
    requests = [encode(spec, TEXTS[index : index + 3]) for index in range(0, len(TEXTS), 3)]

    async def run_all():
        return await asyncio.gather(*(engine.run(request) for request in requests))

    try:
        results = asyncio.run(run_all())
        assert engine.describe()["attention_backend"] == "transformers (sdpa)"
    finally:
        engine.stop()
    model = load(spec)
    for request, rows in zip(requests, results):
        with torch.inference_mode():
            alone = torch.cat([model(pack([ids])) for ids in request]).numpy()
        assert ((rows * alone).sum(1) / np.linalg.norm(rows, axis=1)).min() >= COSINE_TOLERANCE


def test_a_missing_tensor_fails_the_load(tmp_path):
    save_random(tmp_path, "electra", "ElectraModel")
    without_tensor(tmp_path, "attention.output.LayerNorm.bias")
    with pytest.raises(WeightLoadError, match="missing.*LayerNorm.bias"):
        load(resolve_model(str(tmp_path)))


def test_remote_code_is_refused_without_trust_remote_code(tmp_path):
    save_random(tmp_path, "electra", "ElectraModel")
    config = json.loads((tmp_path / "config.json").read_text())
    config |= {"model_type": "my-encoder", "auto_map": {"AutoModel": "modeling_my.MyEncoderModel"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match="--trust-remote-code"):
        resolve_model(str(tmp_path))


REMOTE_CONFIG = """from transformers import ElectraConfig


class MyEncoderConfig(ElectraConfig):
    model_type = "my-encoder"
"""
REMOTE_MODEL = """from transformers import ElectraModel

from .configuration_my import MyEncoderConfig


class MyEncoderModel(ElectraModel):
    config_class = MyEncoderConfig

    def forward(self, *args, **kwargs):
        output = super().forward(*args, **kwargs)
        output.last_hidden_state = output.last_hidden_state.flip(-1)  # what only this code does
        return output
"""


def test_trust_remote_code_runs_the_code_in_the_checkpoint_folder(tmp_path):
    """With --trust-remote-code the fallback runs the folder's own modeling file (its output, not the
    base class's), still loaded strictly."""
    save_random(tmp_path, "electra", "ElectraModel")
    (tmp_path / "configuration_my.py").write_text(REMOTE_CONFIG)
    (tmp_path / "modeling_my.py").write_text(REMOTE_MODEL)
    config = json.loads((tmp_path / "config.json").read_text())
    config |= {
        "model_type": "my-encoder",
        "architectures": ["MyEncoderModel"],
        "auto_map": {
            "AutoConfig": "configuration_my.MyEncoderConfig",
            "AutoModel": "modeling_my.MyEncoderModel",
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match="--trust-remote-code"):
        resolve_model(str(tmp_path))
    spec = resolve_model(str(tmp_path), trust_remote_code=True)
    assert (spec.architecture, spec.implementation) == ("MyEncoderModel", "transformers")
    model = load(spec)
    assert type(model.backbone.model).__name__ == "MyEncoderModel"
    sequences = encode(spec, TEXTS)
    with torch.inference_mode():
        ours = model(pack(sequences))
        hidden = [
            model.backbone.model(input_ids=torch.tensor([ids])).last_hidden_state[0] for ids in sequences
        ]
    expected = F.normalize(torch.stack([rows.mean(0) for rows in hidden]), dim=-1)
    assert F.cosine_similarity(ours, expected).min().item() >= COSINE_TOLERANCE
    unflipped = F.normalize(torch.stack([rows.flip(-1).mean(0) for rows in hidden]), dim=-1)
    assert F.cosine_similarity(ours, unflipped).max().item() < 0.999


def test_model_impl_chooses_the_implementation(tmp_path):
    save_random(tmp_path / "electra", "electra", "ElectraModel")
    with pytest.raises(UnsupportedModel, match="'ElectraModel' is not supported"):
        resolve_model(str(tmp_path / "electra"), model_impl="posy")
    posy = resolve_model(None)
    through_transformers = resolve_model(None, model_impl="transformers")
    assert (posy.implementation, through_transformers.implementation) == ("posy", "transformers")
    sequences = encode(posy, TEXTS)
    with torch.inference_mode():
        ours, theirs = load(posy)(pack(sequences)), load(through_transformers)(pack(sequences))
    assert F.cosine_similarity(ours, theirs).min().item() >= COSINE_TOLERANCE
    with pytest.raises(ValueError, match="--model-impl"):
        resolve_model(None, model_impl="vllm")


def test_a_config_value_posy_cannot_honour_runs_through_transformers(tmp_path):
    """A BERT with relative position embeddings: `auto` serves it through transformers (and says why in
    the log); `--model-impl posy` refuses it."""
    import transformers

    config = transformers.BertConfig(
        vocab_size=30522, position_embedding_type="relative_key", architectures=["BertModel"], **SIZES
    )
    torch.manual_seed(0)
    reference = transformers.BertModel(config).eval()
    reference.save_pretrained(tmp_path)
    for name in TOKENIZER_FILES:
        shutil.copy(resolve_model(None).path / name, tmp_path / name)
    spec = resolve_model(str(tmp_path))
    assert spec.implementation == "transformers"
    with pytest.raises(UnsupportedModel, match="position_embedding_type 'relative_key'"):
        resolve_model(str(tmp_path), model_impl="posy")
    sequences = encode(spec, TEXTS[:4])
    with torch.inference_mode():
        ours = load(spec)(pack(sequences))
        expected = torch.stack(
            [
                F.normalize(reference(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0), dim=-1)
                for ids in sequences
            ]
        )
    assert F.cosine_similarity(ours, expected).min().item() >= COSINE_TOLERANCE


def save_embeddinggemma_layout(folder):
    """EmbeddingGemma's layout: a bidirectional Gemma3TextModel (sliding-window layers shorter than the
    texts, head dim 256, query_pre_attn_scalar), mean pooling, two Dense modules and Normalize; random
    weights, norms too, and the bundled model's WordPiece tokenizer."""
    import transformers

    with_dense(
        folder,
        [
            (64, 128, False, "torch.nn.modules.linear.Identity", False),
            (128, 64, False, "torch.nn.modules.linear.Identity", False),
        ],
    )
    (folder / "model.safetensors").unlink()
    config = transformers.Gemma3TextConfig(
        vocab_size=30522, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"], max_position_embeddings=512,
        use_bidirectional_attention=True, pad_token_id=0, architectures=["Gemma3TextModel"],
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.Gemma3TextModel(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.1)
    model.save_pretrained(folder)
    (folder / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 256, "do_lower_case": False})
    )
    return folder


@pytest.mark.parametrize(
    ("model_impl", "implementation"), [("auto", "posy"), ("transformers", "transformers")]
)
def test_embeddinggemmas_layout_matches_sentence_transformers(tmp_path, model_impl, implementation):
    """EmbeddingGemma's layout runs natively under `auto` (posy's decoder packs Gemma3), and through
    transformers when asked for."""
    from sentence_transformers import SentenceTransformer

    folder = save_embeddinggemma_layout(tmp_path / "model")
    spec = resolve_model(str(folder), model_impl=model_impl)
    assert (spec.architecture, spec.implementation, spec.output_dim) == (
        "Gemma3TextModel",
        implementation,
        64,
    )
    sequences = encode(spec, TEXTS)
    assert max(map(len, sequences)) > 8  # past the sliding window
    with torch.inference_mode():
        ours = load(spec)(pack(sequences))
    expected = SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_tensor=True).float()
    assert F.cosine_similarity(ours, expected).min().item() >= COSINE_TOLERANCE
