"""FP8 (W8A8) projections on the CPU, where torch emulates the scaled GEMM: the quantization of weights per
output channel and of inputs per row against a dequantized float64 reference, which projections of which
families are converted, and the refusals (a GPU without FP8, the transformers fallback, a bad name, rows
that drift)."""

import numpy as np
import pytest
import torch
from torch import nn

from engine.config import EngineConfig
from engine.errors import QuantizationUnavailable
from engine.layers.fp8 import (
    FP8_MAX,
    NEVER,
    Fp8Linear,
    Fp8Rows,
    check_fp8,
    fp8_layers,
    quantize_linears,
    quantize_rows,
)
from engine.layers.fp8_choice import pays_from, row_sizes
from engine.layers.linear_act import LinearActivation


def dequantized(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return values.double() * scales.double()


def test_each_row_is_scaled_to_the_fp8_range_and_a_zero_row_stays_zero():
    x = torch.tensor([[1.0, -3.0, 0.5], [0.0, 0.0, 0.0], [1e-3, 2e-3, -4e-3]])
    rows = quantize_rows(x)
    assert rows.values.dtype == torch.float8_e4m3fn and rows.scales.shape == (3, 1)
    assert rows.values.float().abs().amax(dim=1).tolist() == [FP8_MAX, 0.0, FP8_MAX]
    assert torch.equal(dequantized(rows.values, rows.scales)[1], torch.zeros(3, dtype=torch.float64))
    # e4m3 keeps 3 mantissa bits: each value within half a step (1/16 relative) of its own
    assert torch.allclose(dequantized(rows.values, rows.scales), x.double(), rtol=1 / 16, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_fp8_linear_is_the_product_of_its_dequantized_operands(dtype, bias):
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(64, 48, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(48, 64, generator=generator) * torch.linspace(0.01, 3, 48)[:, None])
        if bias:
            linear.bias.copy_(torch.randn(48, generator=generator))
    linear = linear.to(dtype)
    x = (torch.randn(5, 64, generator=generator) * torch.tensor([[0.01], [1], [30], [2], [5]])).to(dtype)
    layer = Fp8Linear(linear)
    rows = quantize_rows(x)
    weight = dequantized(layer.weight, layer.weight_scales.t())
    expected = dequantized(rows.values, rows.scales) @ weight.T
    if bias:
        expected += linear.bias.double()
    got = layer(x)
    assert got.dtype == dtype and got.shape == (5, 48)
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(
        got.double(), expected, rtol=tolerance, atol=tolerance * expected.abs().max().item()
    )
    # quantized rows handed over give the same output as quantizing here
    assert torch.equal(layer(Fp8Rows(rows.values, rows.scales, dtype)), got)
    # and the whole is close to the unquantized layer: per-channel and per-row scales keep the small rows
    exact = linear(x).double()
    assert ((got.double() - exact).norm(dim=1) / exact.norm(dim=1)).max() < 0.08


def test_an_activation_layer_applies_its_activation_after_the_fp8_product():
    layer = LinearActivation(32, 16, "gelu")
    x = torch.randn(4, 32)
    converted = Fp8Linear(layer)
    plain = Fp8Linear(nn.Linear(32, 16))
    plain.load_state_dict(converted.state_dict())
    assert torch.allclose(converted(x), torch.nn.functional.gelu(plain(x)))


def test_the_named_projections_of_each_layer_are_converted_and_nothing_else():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.down, self.other = nn.Linear(32, 96), nn.Linear(64, 32), nn.Linear(32, 32)
            self.odd = nn.Linear(30, 32)  # not a multiple of 16: a scaled GEMM does not take it

    model = nn.Sequential(Block(), Block())
    model[1].odd = nn.Linear(30, 32)
    assert quantize_linears(model, ("qkv", "down", "odd")) == 4
    for block in model:
        assert isinstance(block.qkv, Fp8Linear) and isinstance(block.down, Fp8Linear)
        assert type(block.other) is nn.Linear and type(block.odd) is nn.Linear


def test_a_gpu_without_fp8_tensor_cores_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    with pytest.raises(QuantizationUnavailable, match="compute capability 8.9 or later.*A100 is 8.0"):
        check_fp8(torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_fp8(torch.device("cuda"))
    check_fp8(torch.device("cpu"))  # emulated


def test_a_bert_model_runs_its_four_projections_a_layer_in_fp8(minilm_path):
    from engine.attention import select_backend
    from engine.checkpoint.resolve import resolve_model
    from engine.weights import load_model

    spec = resolve_model(str(minilm_path))
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"), "fp8")
    converted = [name for name, module in model.named_modules() if isinstance(module, Fp8Linear)]
    assert len(converted) == 6 * 4 and all(name.startswith("backbone.layers.") for name in converted)


def test_the_transformers_fallback_and_unknown_names_are_refused(minilm_path):
    from dataclasses import replace

    from engine.checkpoint.resolve import resolve_model
    from engine.weights import load_model

    spec = replace(resolve_model(str(minilm_path)), implementation="transformers")
    with pytest.raises(QuantizationUnavailable, match="families posy packs"):
        load_model(spec, "cpu", torch.float32, None, "fp8")
    with pytest.raises(QuantizationUnavailable, match="none, fp8"):
        load_model(spec, "cpu", torch.float32, None, "int4")
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineConfig(quantization="int8").check(256)


def test_producers_hand_the_projections_their_inputs_in_fp8_and_a_decoder_keeps_its_vectors(
    tmp_path, minilm_path
):
    """BERT: the attention's LayerNorm writes the up projection's input and the GELU the down's; its FP8
    vectors keep a cosine of 0.99 to float32's. A Qwen3 (random weights, norms and biases too), whose MLP
    alone runs in FP8: the MLP's pre-norm and the gated product, not attention's pre-norm; likewise 0.99."""
    from engine.attention import select_backend
    from engine.batch import pack
    from engine.checkpoint.resolve import resolve_model
    from engine.weights import load_model
    from tests.engine.test_qwen3_parity import save_random_qwen3

    backend = select_backend("torch", "cpu")
    bert_spec = resolve_model(str(minilm_path))
    bert = load_model(bert_spec, "cpu", torch.float32, backend, "fp8")
    layers = bert.backbone.layers
    for layer in layers:  # on the CPU at every size
        assert layer.attention_norm.quantize_from == 0 and layer.up.quantize_output_from == 0
        assert layer.mlp_norm.quantize_from == NEVER
    batch = pack([list(range(1000, 1000 + n)) for n in (5, 30, 64)])
    plain_bert = load_model(bert_spec, "cpu", torch.float32, backend)
    with torch.inference_mode():
        cosines = torch.nn.functional.cosine_similarity(bert(batch), plain_bert(batch))
    assert cosines.min() >= 0.99, cosines
    for layer in layers:  # as measured on a GPU: the up projection from 64 rows, down from 16
        layer.up.min_rows, layer.down.min_rows = 64, 16
    bert.backbone.fuse_fp8_inputs()
    for layer in layers:  # the MLP runs in FP8 as a pair: the GELU writes the down projection's input
        assert layer.down.min_rows == layer.up.min_rows == 64 and layer.up.quantize_output_from == 64
        assert layer.attention_norm.quantize_from == 64
    save_random_qwen3(tmp_path, "Qwen3Model", sentence_transformers="lasttoken")
    spec = resolve_model(str(tmp_path))
    fp8_model = load_model(spec, "cpu", torch.float32, backend, "fp8")
    for layer in fp8_model.backbone.layers:
        assert layer.attention_norm.quantize_from == NEVER
        assert layer.mlp_norm.quantize_from == 0 and layer.mlp.quantize_from == 0
        assert not isinstance(layer.attention.qkv, Fp8Linear) and isinstance(layer.mlp.down, Fp8Linear)
    plain = load_model(spec, "cpu", torch.float32, backend)
    batch = pack([list(range(5, 5 + n)) for n in (3, 17, 40)])
    with torch.inference_mode():
        cosines = (fp8_model(batch) * plain(batch)).sum(dim=1)
    assert cosines.min() >= 0.99, cosines


def test_fp8_runs_from_its_chosen_rows_on_and_the_model_dtype_below():
    torch.manual_seed(0)
    layer = Fp8Linear(LinearActivation(64, 96, "gelu_new"))
    layer.min_rows = 8
    small, large = torch.randn(7, 64), torch.randn(8, 64)
    with torch.inference_mode():
        assert torch.equal(layer(small), layer.linear(small))  # the model dtype's own layer, exactly
        got, exact = layer(large), layer.linear(large)
        assert not torch.equal(got, exact) and ((got - exact).norm() / exact.norm()).item() < 0.05
        layer.quantize_output_from = 8  # the next projection runs in FP8 from 8 rows: it gets Fp8Rows
        assert isinstance(layer(large), Fp8Rows) and isinstance(layer(small), torch.Tensor)


def test_fp8_pays_from_the_least_size_it_wins_at_and_above():
    # (rows, the model dtype's seconds, FP8's): FP8 loses small batches and wins from 1,024 rows
    timings = [(16, 5e-6, 9e-6), (512, 2e-5, 2.1e-5), (1024, 4e-5, 3e-5), (4096, 1.5e-4, 1e-4)]
    assert pays_from(timings) == 1024
    assert pays_from([*timings, (8192, 3e-4, 3e-4)]) == NEVER  # a tie at the largest: never
    assert pays_from([(512, 2e-5, 1e-5), (1024, 4e-5, 4.5e-5), (4096, 1.5e-4, 1e-4)]) == 4096
    assert row_sizes(5000) == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 5000]


def test_a_decoder_from_its_fp8_rows_writes_fp8_inputs_only_for_batches_that_reach_them(tmp_path):
    """A Qwen3 whose FP8 runs from 32 rows: a smaller batch is the model dtype's throughout (its vectors
    equal those of the unquantized model), a larger one runs its MLP in FP8."""
    from engine.attention import select_backend
    from engine.batch import pack
    from engine.checkpoint.resolve import resolve_model
    from engine.weights import load_model
    from tests.engine.test_qwen3_parity import save_random_qwen3

    backend = select_backend("torch", "cpu")
    save_random_qwen3(tmp_path, "Qwen3Model", sentence_transformers="lasttoken")
    spec = resolve_model(str(tmp_path))
    fp8_model = load_model(spec, "cpu", torch.float32, backend, "fp8", fp8_min_rows=32)
    assert {layer.min_rows for layer in fp8_layers(fp8_model)} == {32}
    for layer in fp8_model.backbone.layers:
        assert layer.mlp_norm.quantize_from == 32 and layer.mlp.quantize_from == 32
    plain = load_model(spec, "cpu", torch.float32, backend)
    small, large = pack([list(range(5, 5 + n)) for n in (3, 20)]), pack([list(range(5, 45))])
    with torch.inference_mode():
        assert torch.equal(fp8_model(small), plain(small))
        assert not torch.equal(fp8_model(large), plain(large))
        assert (fp8_model(large) * plain(large)).sum(dim=1).min() >= 0.99


def test_fp8_whose_rows_drift_is_turned_off_at_start_up_with_its_reason(tmp_path, caplog):
    """One scale a token cannot keep a row whose few channels are far larger than the rest: a Qwen3 whose
    MLP input carries such a channel (which its projections do not read) loses the rest of the row in FP8.
    The engine compares FP8's rows with the model dtype's on a probe at start-up, turns FP8 off, says why,
    and serves the model dtype's rows; a model FP8 keeps runs in FP8."""
    import asyncio
    import logging

    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from tests.engine.test_qwen3_parity import save_random_qwen3

    def served(folder):
        engine = build_engine(resolve_model(str(folder)), EngineConfig(device="cpu", quantization="fp8"))
        try:
            rows = asyncio.run(engine.run([list(range(5, 5 + n)) for n in (3, 17, 40)]))
        finally:
            engine.stop()
        return engine.runner.model, rows

    save_random_qwen3(tmp_path / "kept", "Qwen3Model", sentence_transformers="mean")
    with caplog.at_level(logging.INFO, logger="engine.fp8_accuracy"):
        kept, _ = served(tmp_path / "kept")
    assert fp8_layers(kept.backbone) and "FP8 keeps the model's rows" in caplog.text
    model = save_random_qwen3(tmp_path / "outliers", "Qwen3Model", sentence_transformers="mean")
    with torch.no_grad():
        for layer in model.layers:
            layer.post_attention_layernorm.weight[0] = 1e6
            layer.mlp.gate_proj.weight[:, 0] = 0
            layer.mlp.up_proj.weight[:, 0] = 0
    model.save_pretrained(tmp_path / "outliers")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="engine.fp8_accuracy"):
        turned_off, rows = served(tmp_path / "outliers")
    assert not fp8_layers(turned_off.backbone)
    assert "--quantization fp8 is off" in caplog.text and "least cosine" in caplog.text
    plain_engine = build_engine(resolve_model(str(tmp_path / "outliers")), EngineConfig(device="cpu"))
    try:
        plain = asyncio.run(plain_engine.run([list(range(5, 5 + n)) for n in (3, 17, 40)]))
    finally:
        plain_engine.stop()
    np.testing.assert_allclose(rows, plain, atol=1e-6)


def test_fp8_that_gains_too_little_on_a_full_batch_is_turned_off_with_its_reason(tmp_path, caplog):
    """FP8 costs accuracy: where a full batch of the whole model is not MIN_MODEL_GAIN times faster in FP8,
    the engine goes back to the model dtype and says why, figures included; where it is, FP8 stays."""
    import logging

    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.fp8_accuracy import MIN_MODEL_GAIN, keep_fp8_if_it_pays
    from tests.engine.test_qwen3_parity import save_random_qwen3

    save_random_qwen3(tmp_path, "Qwen3Model", sentence_transformers="mean")

    def gain_of(gain: float) -> tuple[float | None, list, object]:
        engine = build_engine(resolve_model(str(tmp_path)), EngineConfig(device="cpu", quantization="fp8"))
        engine.stop()
        runner = engine.runner
        seen = []

        def seconds(runner, layers, min_rows, batch):  # FP8's rows first, then the model dtype's
            seen.append((list(min_rows), batch.num_tokens))
            return 1.0 if len(seen) == 1 else gain

        return keep_fp8_if_it_pays("qwen3", runner, 1024, 128, seconds), seen, runner.model

    with caplog.at_level(logging.INFO, logger="engine.fp8_accuracy"):
        measured, seen, model = gain_of(MIN_MODEL_GAIN - 0.1)
    assert measured == pytest.approx(MIN_MODEL_GAIN - 0.1)
    assert seen[0][0] == [0] * len(seen[0][0]) and seen[1][0] == [float("inf")] * len(seen[0][0])
    assert seen[0][1] == seen[1][1] == 1024  # a full batch: 8 sequences of the window's 128 tokens
    assert not fp8_layers(model.backbone)
    assert "--quantization fp8 is off" in caplog.text and f"only {MIN_MODEL_GAIN - 0.1:.2f}x" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="engine.fp8_accuracy"):
        measured, seen, model = gain_of(MIN_MODEL_GAIN + 0.3)
    assert fp8_layers(model.backbone) and all(layer.min_rows == 0 for layer in fp8_layers(model.backbone))
    assert "faster than the model dtype" in caplog.text and "is off" not in caplog.text
