"""sentence-transformers Dense modules after pooling (LaBSE, distiluse, EmbeddingGemma): the bundled
all-MiniLM-L6-v2 given three random Dense modules (a Tanh with bias, an Identity without, a residual one)
before its Normalize matches sentence-transformers on the same folder (fp32, cosine >= 0.9999); the output
size is the last module's; activations outside the fixed list, modules out of order and a missing tensor
are start-up errors."""

import json
import shutil

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer

from engine.attention import select_backend
from engine.batch import pack
from engine.checkpoint.resolve import resolve_model
from engine.errors import UnsupportedModel, WeightLoadError
from engine.weights import load_model
from tests.engine.test_bert_parity import TEXTS

TOLERANCE = 0.9999
# (in, out, bias, activation, residual)
DENSE = [
    (384, 256, True, "torch.nn.modules.activation.Tanh", False),
    (256, 128, False, "torch.nn.modules.linear.Identity", False),
    (128, 96, True, "torch.nn.modules.activation.GELU", True),
]


def with_dense(folder, layers=DENSE, order=None):
    """The bundled model copied to `folder` with Dense modules between Pooling and Normalize."""
    from safetensors.torch import save_file

    source = resolve_model(None).path
    shutil.copytree(source, folder, dirs_exist_ok=True)
    modules = json.loads((folder / "modules.json").read_text())
    normalize = modules.pop()
    generator = torch.Generator().manual_seed(0)
    for index, (in_features, out_features, bias, activation, residual) in enumerate(layers):
        path = f"{2 + index}_Dense"
        (folder / path).mkdir()
        config = {"in_features": in_features, "out_features": out_features, "bias": bias}
        config |= {"activation_function": activation, "use_residual": residual}
        (folder / path / "config.json").write_text(json.dumps(config))
        tensors = {"linear.weight": torch.randn(out_features, in_features, generator=generator) * 0.2}
        if bias:
            tensors["linear.bias"] = torch.randn(out_features, generator=generator) * 0.2
        if residual and in_features != out_features:
            tensors["residual.weight"] = torch.randn(out_features, in_features, generator=generator) * 0.2
        save_file(tensors, folder / path / "model.safetensors")
        modules.append(
            {
                "idx": 2 + index,
                "name": str(2 + index),
                "path": path,
                "type": "sentence_transformers.models.Dense",
            }
        )
    normalize["idx"], normalize["name"] = len(modules), str(len(modules))
    modules.append(normalize)
    if order is not None:
        modules = [modules[index] for index in order]
    (folder / "modules.json").write_text(json.dumps(modules))
    return folder


def embed(spec, texts):
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    tokenizer.no_padding()
    tokenizer.enable_truncation(spec.max_seq_length)
    with torch.inference_mode():
        return model(pack([encoding.ids for encoding in tokenizer.encode_batch(texts)]))


def test_dense_modules_match_sentence_transformers(tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = with_dense(tmp_path / "model")
    spec = resolve_model(str(folder))
    assert (spec.output_dim, spec.pooling, spec.normalize) == (96, "mean", True)
    ours = embed(spec, TEXTS)
    reference = SentenceTransformer(str(folder), device="cpu")
    expected = reference.encode(TEXTS, convert_to_tensor=True, batch_size=len(TEXTS)).float()
    assert ours.shape == expected.shape == (len(TEXTS), 96)
    assert F.cosine_similarity(ours, expected).min().item() >= TOLERANCE
    alone = torch.cat([embed(spec, [text]) for text in TEXTS[:3]])
    assert F.cosine_similarity(ours[:3], alone).min().item() >= TOLERANCE


def test_an_activation_outside_the_list_is_refused(tmp_path):
    layers = [(384, 64, True, "my_package.Swish", False)]
    with pytest.raises(UnsupportedModel, match="Dense activation 'my_package.Swish' is not supported"):
        resolve_model(str(with_dense(tmp_path / "model", layers)))


def test_a_dense_module_before_pooling_is_refused(tmp_path):
    folder = with_dense(tmp_path / "model", DENSE[:1], order=[0, 2, 1, 3])
    with pytest.raises(UnsupportedModel, match="in the order"):
        resolve_model(str(folder))


def test_sizes_that_do_not_chain_are_refused(tmp_path):
    with pytest.raises(UnsupportedModel, match="takes 200 features, not 384"):
        resolve_model(
            str(with_dense(tmp_path / "model", [(200, 64, True, "torch.nn.modules.activation.Tanh", False)]))
        )


def test_a_missing_dense_tensor_fails_the_load(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = with_dense(tmp_path / "model")
    tensors = load_file(folder / "2_Dense" / "model.safetensors")
    del tensors["linear.bias"]
    save_file(tensors, folder / "2_Dense" / "model.safetensors")
    with pytest.raises(WeightLoadError, match=r"missing.*sentence_transformers\.dense\.0\.linear\.bias"):
        load_model(resolve_model(str(folder)), "cpu", torch.float32, select_backend("torch", "cpu"))
