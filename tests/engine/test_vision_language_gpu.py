"""Qwen2-VL and Qwen3-VL on CUDA in bf16 against transformers' fp32: decoder heads of 128 (the GPU
backends run them); Qwen2-VL's vision heads of 80, as Qwen2-VL-2B has (no FlashInfer module: torch's
FlashAttention 2 runs its vision tower), Qwen3-VL's of 64 (its position table and DeepStack); texts alone
through CUDA graphs (each request run eagerly, then captured, then replayed), texts holding images and
images alone eagerly; each row at cosine >= 0.999. The vision towers' rotary kernel against the float32
rotation it stands for."""

import asyncio

import pytest
import torch
from tokenizers import Tokenizer

from benchmarks.image_checkpoints import TINY_QWEN2_VL_TEXT, vision_language_checkpoint
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.outputs import RowRequest
from tests.engine.test_vision_language_parity import grids, reference_rows, sequences_of

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
TEXT = {**TINY_QWEN2_VL_TEXT, "hidden_size": 256, "num_attention_heads": 2, "num_key_value_heads": 1}
KINDS = {
    "qwen2_vl": ({"depth": 2, "embed_dim": 160, "num_heads": 2, "mlp_ratio": 2}, [16, 24, 24]),
    "qwen3_vl": (
        {
            "depth": 2, "hidden_size": 128, "intermediate_size": 256, "num_heads": 2,
            "num_position_embeddings": 16, "deepstack_visual_indexes": [0], "hidden_act": "gelu_pytorch_tanh",
        },
        [24, 20, 20],
    ),
}  # fmt: skip


def tiny_model(tmp_path, kind: str):
    """A tiny checkpoint of `kind` -> (its spec, transformers' model in fp32, the parity test's texts and
    images as sequences, each sequence's images)."""
    vision, sections = KINDS[kind]
    folder, model = vision_language_checkpoint(tmp_path / kind, TEXT, vision, sections, std=0.05, kind=kind)
    spec = resolve_model(str(folder))
    sequences, images = sequences_of(spec, Tokenizer.from_file(str(spec.tokenizer_path)), grids(spec))
    return spec, model, sequences, images


@pytest.mark.parametrize("kind", list(KINDS))
def test_texts_through_graphs_and_images_match_fp32(tmp_path, kind):
    spec, model, sequences, images = tiny_model(tmp_path, kind)
    expected = reference_rows(model, spec, sequences, images)
    engine = build_engine(spec, EngineConfig(device="cuda", dtype="bfloat16"))
    try:

        async def runs():
            texts = [await engine.run(sequences[:1]) for _ in range(3)]
            mixed = [await engine.run(sequences, rows=RowRequest(images=images)) for _ in range(2)]
            return texts, mixed

        texts, mixed = asyncio.run(runs())
        assert engine.runner.graphs is not None and engine.runner.graphs.graphs, "no graph was captured"
        vision_heads = engine.runner.model.backbone.visual.blocks[0].attention_backend
        # heads of 80 on FlashAttention 2 where the decoder's backend lacks them; of 64, on the decoder's
        assert (vision_heads.name == "torch-varlen") == (kind == "qwen2_vl")
    finally:
        engine.stop()
    for rows in texts:
        assert float(rows[0] @ expected[0]) >= 0.999
    for rows in mixed:
        assert float((rows * expected).sum(1).min()) >= 0.999, (rows * expected).sum(1)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_batch_of_images_is_queued_without_waiting_for_the_device(tmp_path, kind):
    """The engine packs the next batch while the device runs this one only where queuing this one never
    waits on the device: a copy from pageable memory or a read of a device value in a vision-language
    step (its rotary streams once were such a copy, twice a batch) raises here."""
    from engine.batch import pack

    spec, _, sequences, images = tiny_model(tmp_path, kind)
    engine = build_engine(spec, EngineConfig(device="cuda", dtype="bfloat16"))
    try:
        runner = engine.runner
        runner.step(pack(sequences, output=runner.output, images=images)).result()  # first uses
        batch = pack(sequences, output=runner.output, images=images)
        torch.cuda.set_sync_debug_mode("error")
        try:
            lazy = runner.step(batch)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert lazy.result().shape[0] == len(sequences)
    finally:
        engine.stop()


def test_the_vision_towers_rotary_kernel_rotates_in_float32():
    """bf16 heads of 80 turned by float32 tables (Qwen2-VL's vision tower, as transformers turns them):
    the Triton kernel's rows are the float32 rotation rounded once to bf16, not a rotation in bf16."""
    from engine.layers.qk_norm_rotary import QKNormRotary
    from engine.layers.rotary import (
        apply_rotary,
        inverse_frequencies,
        sectioned_streams,
        stream_rotary_tables,
    )

    generator = torch.Generator(device="cuda").manual_seed(0)
    layer = QKNormRotary(16, 16, 80, 1e-6, qk_norm=False)
    qkv = torch.randn(4900, 48 * 80, device="cuda", dtype=torch.bfloat16, generator=generator)
    index = torch.arange(4900, device="cuda")
    frequencies = inverse_frequencies(40, 10000.0, qkv.device).repeat(2)
    cos, sin = stream_rotary_tables(
        torch.stack([index // 70, index % 70]), frequencies, sectioned_streams((20, 20)), torch.float32
    )

    def relative_error(got, want):
        return ((got.double() - want.double()).norm() / want.double().norm()).item()

    with torch.no_grad():
        q, k, v = (tensor.clone() for tensor in layer(qkv.clone(), cos, sin))
        plain_q, plain_k, plain_v = layer.split(qkv)
    for got, plain in ((q, plain_q), (k, plain_k)):
        want = apply_rotary(plain.float(), cos, sin).to(torch.bfloat16)
        assert relative_error(got, want) <= 1e-4
        in_bf16 = apply_rotary(plain, cos.to(torch.bfloat16), sin.to(torch.bfloat16))
        assert relative_error(in_bf16, want) > 1e-3  # what a rotation in bf16 would be off by
    assert torch.equal(v, plain_v)
