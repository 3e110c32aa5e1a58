"""SPLADE folders as users bring them, each against sentence-transformers' SparseEncoder on the same folder
(fp32 on the CPU, vocabulary weights within 1e-5): LayerNorm parameters under their TF-era names (gamma,
beta), sentence-transformers 6's Transformer (fill-mask) -> SpladePooling, and a bare *ForMaskedLM that
--pooling splade serves as SparseEncoder(folder) does; and what posy refuses of them, said at resolve."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from benchmarks.token_checkpoints import copy_tokenizer, randomized, splade_checkpoint, tiny_bert_config
from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.errors import UnsupportedModel, WeightLoadError
from engine.weights import load_model

TOLERANCE = 1e-5
TEXTS = ["what do cats eat?", "Cats eat fish, mostly.", "a", "word " * 40, "Ünïcödé façade; 東京 🙂"]


def masked_lm(minilm, folder, family="bert", seed=0):
    """A random *ForMaskedLM as transformers saves it (no sentence-transformers files), norms and biases
    randomized too."""
    from transformers import AutoModelForMaskedLM

    architecture = {"bert": "BertForMaskedLM", "roberta": "RobertaForMaskedLM"}[family]
    model = randomized(AutoModelForMaskedLM.from_config(tiny_bert_config(minilm, family, architecture)), seed)
    model.save_pretrained(folder)
    copy_tokenizer(minilm, folder)
    return folder


def sparse_weights(spec, texts=TEXTS):
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    with torch.inference_mode():
        return model(pack([encoding.ids for encoding in tokenizer.encode_batch(texts)])).numpy()


def reference_weights(folder, texts=TEXTS):
    from sentence_transformers import SparseEncoder

    encoder = SparseEncoder(str(folder), device="cpu")
    return encoder.encode(texts, convert_to_tensor=True).to_dense().numpy()


def assert_same_weights(rows, expected):
    assert rows.shape == expected.shape
    assert (expected > 0).sum(axis=1).min() > 0  # weights to compare in every row
    np.testing.assert_allclose(rows, expected, atol=TOLERANCE, rtol=TOLERANCE)


def test_legacy_layer_norm_names_match_sentence_transformers(minilm_path, tmp_path):
    """naver's older SPLADE uploads name LayerNorm parameters gamma and beta, which transformers renames."""
    folder = splade_checkpoint(minilm_path, tmp_path / "splade")
    tensors = load_file(folder / "model.safetensors")
    legacy = {
        name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
            "LayerNorm.bias", "LayerNorm.beta"
        ): tensor
        for name, tensor in tensors.items()
    }
    assert (
        "cls.predictions.transform.LayerNorm.gamma" in legacy and "bert.embeddings.LayerNorm.beta" in legacy
    )
    save_file(legacy, folder / "model.safetensors", metadata={"format": "pt"})
    assert_same_weights(sparse_weights(resolve_model(str(folder))), reference_weights(folder))


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_sentence_transformers_6_folder_matches_sentence_transformers(minilm_path, tmp_path, family):
    """SparseEncoder(masked LM).save_pretrained(): sentence-transformers 6 writes its own Transformer module
    (transformer_task fill-mask) before SpladePooling."""
    from sentence_transformers import SparseEncoder

    folder = tmp_path / "st6"
    SparseEncoder(str(masked_lm(minilm_path, tmp_path / "mlm", family)), device="cpu").save_pretrained(
        str(folder)
    )
    kinds = [module["type"] for module in json.loads((folder / "modules.json").read_text())]
    assert kinds[0].endswith(".Transformer") and kinds[1].endswith(".SpladePooling")
    spec = resolve_model(str(folder))
    assert spec.task == "sparse_embed" and spec.output_dim == spec.vocab_size
    assert_same_weights(sparse_weights(spec), reference_weights(folder))


def test_a_feature_extraction_transformer_is_not_splade(minilm_path, tmp_path):
    from sentence_transformers import SparseEncoder

    folder = tmp_path / "st6"
    SparseEncoder(str(masked_lm(minilm_path, tmp_path / "mlm")), device="cpu").save_pretrained(str(folder))
    settings = json.loads((folder / "sentence_bert_config.json").read_text())
    settings["transformer_task"] = "feature-extraction"
    (folder / "sentence_bert_config.json").write_text(json.dumps(settings))
    with pytest.raises(UnsupportedModel, match="loaded for 'feature-extraction'"):
        resolve_model(str(folder))


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_pooling_splade_serves_a_bare_masked_lm_as_sparse_encoder_does(minilm_path, tmp_path, family):
    folder = masked_lm(minilm_path, tmp_path / "mlm", family)
    assert not (folder / "modules.json").exists()
    with pytest.raises(UnsupportedModel, match="--pooling splade"):
        resolve_model(str(folder))  # refused, saying which flag serves it
    spec = resolve_model(str(folder), pooling="splade")
    assert spec.task == "sparse_embed" and spec.splade is not None and spec.output_dim == spec.vocab_size
    assert_same_weights(sparse_weights(spec), reference_weights(folder))


def test_pooling_splade_asks_for_a_masked_lm(minilm_path, tmp_path):
    from transformers import BertModel

    embedder = tmp_path / "embedder"
    model = randomized(BertModel(tiny_bert_config(minilm_path)), 0)
    model.save_pretrained(embedder)
    copy_tokenizer(minilm_path, embedder)
    with pytest.raises(UnsupportedModel, match="--pooling splade runs a \\*ForMaskedLM checkpoint"):
        resolve_model(str(embedder), pooling="splade")
    # the other values pool an embedder, not a SPLADE model
    spec = resolve_model(str(embedder), pooling="cls")
    assert (spec.task, spec.pooling) == ("embed", "cls")
    assert resolve_model(str(embedder), pooling="last-token").pooling == "last"
    splade = splade_checkpoint(minilm_path, tmp_path / "splade")
    with pytest.raises(UnsupportedModel, match="--pooling mean pools an embedding model"):
        resolve_model(str(splade), pooling="mean")
    assert resolve_model(str(splade), pooling="splade").splade == resolve_model(str(splade)).splade


@pytest.mark.parametrize(
    "config",
    [{"pooling_strategy": "mean", "activation_function": "relu"}, {"activation_function": "gelu"}],
)
def test_an_unsupported_splade_pooling_is_refused_at_resolve(minilm_path, tmp_path, config):
    folder = splade_checkpoint(minilm_path, tmp_path / "splade")
    (folder / "1_SpladePooling" / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        UnsupportedModel, match="SpladePooling .* is not supported; posy runs pooling_strategy"
    ):
        resolve_model(str(folder))


def test_legacy_names_do_not_hide_a_missing_head_tensor(minilm_path, tmp_path):
    folder = splade_checkpoint(minilm_path, tmp_path / "splade")
    tensors = load_file(folder / "model.safetensors")
    tensors["cls.predictions.transform.LayerNorm.gamma"] = tensors.pop(
        "cls.predictions.transform.LayerNorm.weight"
    )
    del tensors["cls.predictions.transform.LayerNorm.bias"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightLoadError, match=r"missing: \['cls.predictions.transform.LayerNorm.bias'\]"):
        sparse_weights(resolve_model(str(folder)))
