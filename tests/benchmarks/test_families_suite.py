"""The families suite in its CPU smoke mode: every shape runs (through posy's packed model or the
transformers fallback, whichever its config gets), records its tokens per second against HF's, its speedup
against its target and its cosine, and posy's vectors match HF's; `--shapes` picks shapes; RESULTS.md gets
a row per shape."""

import argparse

import pytest

from benchmarks import families
from benchmarks.layouts import DEBERTA_V2, GEMMA3, MPNET, QWEN2, config_of
from benchmarks.records import RunContext, implementation
from benchmarks.render import render

METRICS = ("real_tokens_per_s", "speedup_vs_target", "min_cosine_vs_fp32_reference")
TOLERANCE = 0.9999  # fp32 on both sides here


def smoke(shapes=None):
    options = argparse.Namespace(suite="families", rounds=1, backend="auto", smoke=True, shapes=shapes)
    return families.run(options)


def test_smoke_run_records_every_shape_against_hf_and_the_vectors_agree():
    outcome = smoke()
    assert outcome.failures == []
    by_key = {(record.case, record.metric): record for record in outcome.records}
    names = [shape.name for shape in families.SHAPES]
    assert set(by_key) == {(f"{name}-mixed100", metric) for name in names for metric in METRICS}
    assert len(outcome.records) == len(by_key)
    for shape in families.SHAPES:
        tokens, speedup, cosine = (by_key[(f"{shape.name}-mixed100", metric)] for metric in METRICS)
        assert tokens.value > 0 and tokens.baseline > 0
        assert tokens.ratio == pytest.approx(tokens.value / tokens.baseline)
        assert (speedup.value, speedup.baseline) == (pytest.approx(tokens.ratio), shape.target)
        assert cosine.value >= TOLERANCE, shape.name
        assert {tokens.backend, speedup.backend, cosine.backend} == {tokens.backend}
        assert tokens.gpu is None and tokens.model == f"{shape.size}-shape (random weights)"
    ran = {name: implementation(by_key[(f"{name}-mixed100", METRICS[0])].backend) for name in names}
    # posy packs the decoders it knows; --model-impl transformers and DeBERTa-v2 take the fallback
    assert ran["qwen2-1.5b"] == ran["qwen3-0.6b"] == "posy"
    assert ran["fallback-mpnet-base"] == ran["deberta-v3-base"] == "transformers"
    assert by_key[("fallback-mpnet-base-mixed100", METRICS[0])].backend == "transformers (eager)"


@pytest.mark.parametrize(
    ("layout", "shape", "millions"),
    [(MPNET, "mpnet-base", 109.5), (QWEN2, "qwen2-1.5b", 1543.3), (GEMMA3, "gemma3-300m", 302.9),
     (DEBERTA_V2, "deberta-v3-base", 183.8)],
)  # fmt: skip
def test_real_shapes_have_their_models_parameter_counts(layout, shape, millions):
    """The transformer's parameters of all-mpnet-base-v2, gte-Qwen2-1.5B-instruct, EmbeddingGemma-300m
    (its Dense modules aside) and DeBERTa-v3-base, counted on the meta device (no weights made)."""
    import torch
    import transformers

    with torch.device("meta"):
        model = getattr(transformers, layout.model)(config_of(layout, shape))
    assert sum(parameter.numel() for parameter in model.parameters()) / 1e6 == pytest.approx(
        millions, abs=0.1
    )
    if layout is GEMMA3:
        assert model.config.layer_types == (["sliding_attention"] * 5 + ["full_attention"]) * 4


def test_shapes_picks_some_in_its_order_and_refuses_unknown_ones():
    assert [shape.name for shape in families.chosen("gemma3-300m,mpnet-base")] == [
        "gemma3-300m",
        "mpnet-base",
    ]
    assert families.chosen(None) == list(families.SHAPES)
    with pytest.raises(SystemExit, match="unknown shapes \\['bert'\\]"):
        families.chosen("mpnet-base,bert")


def test_render_gives_a_row_per_shape_with_its_ratio_against_the_target(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    lines = []
    for backend, case, posy, hf, target in (
        ("flashinfer", "qwen2-1.5b-mixed100", 400e3, 80e3, 4.0),
        ("transformers (eager)", "deberta-v3-base-mixed100", 90e3, 100e3, 1.0),
    ):
        context = RunContext("families", "m", "NVIDIA H200", backend, "2.11", "abc1234", "2026-12-02")
        lines += [
            context.record(case, "real_tokens_per_s", posy, "tokens/s", hf),
            context.record(case, "speedup_vs_target", posy / hf, "x", target),
            context.record(case, "min_cosine_vs_fp32_reference", 0.9995, "cosine"),
        ]
    (results / "families.jsonl").write_text("".join(record.to_json() + "\n" for record in lines))
    text = render(results, tmp_path / "RESULTS.md", tmp_path / "plots").read_text()
    assert "| shape | implementation | backend |" in text
    assert (
        "| qwen2-1.5b | posy | flashinfer | 400,000.0 | 80,000.0 | 5.00x / 4x met | 0.999500 | NVIDIA H200 "
        "| 2026-12-02 | abc1234 |" in text
    )
    assert (
        "| deberta-v3-base | transformers | transformers (eager) | 90,000.0 | 100,000.0 | 0.90x / 1x missed |"
        in text
    )
