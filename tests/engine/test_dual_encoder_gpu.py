"""CLIP and SigLIP on CUDA in bf16 against transformers' fp32 on the GPU (head size 64, so that the GPU
backends run): texts and images each through captured and replayed CUDA graphs (a request of texts, of one
image, of three images: each run eagerly, then captured, then replayed), and a batch of texts and images
likewise, each tower's part through its own graphs; each row at cosine >= 0.999. Images of 160 px in
patches of 16 are 100 tokens or 101, longer than the text window (77, 64), as real ones are (ViT-B/16's
197): their graphs hold them all the same."""

import asyncio

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from api.images import normalized, patches, pixels
from benchmarks.image_checkpoints import dual_encoder_checkpoint
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.outputs import RowRequest
from tests.engine.graph_runs import run_three_times
from tests.engine.test_dual_encoder_parity import TEXTS, random_images, rgb, token_ids

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]
TOWER = {"hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2, "num_attention_heads": 2}


@pytest.fixture(scope="module", params=["clip", "siglip"])
def checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param) / request.param
    return dual_encoder_checkpoint(
        folder, request.param, TOWER, TOWER, image_size=160, patch_size=16, projection_dim=128, std=0.05
    )


def features(output):
    return output.pooler_output if hasattr(output, "pooler_output") else output


def test_texts_through_graphs_and_images_match_fp32(checkpoint):
    folder, reference = checkpoint
    spec = resolve_model(str(folder))
    layout = spec.images
    ids = token_ids(spec, TEXTS)
    values = np.stack([pixels(rgb(image), layout) for image in random_images()])
    reference = reference.to("cuda")
    with torch.inference_mode():
        texts = [
            features(reference.get_text_features(input_ids=torch.tensor([i], device="cuda"))) for i in ids
        ]
        texts = torch.cat(texts)
        pixel_values = torch.as_tensor(normalized(values, layout), device="cuda")
        images = features(reference.get_image_features(pixel_values=pixel_values))
    expected_texts = F.normalize(texts, dim=-1).cpu().numpy()
    expected_images = F.normalize(images, dim=-1).cpu().numpy()
    config = EngineConfig(device="cuda", dtype="bfloat16")
    results, graphs = run_three_times(spec, config, [[one] for one in ids])
    assert graphs is not None and graphs.graphs, "no graph was captured"
    for row, runs in zip(expected_texts, results):
        for rows in runs:
            assert float(rows[0] @ row) >= 0.999

    image_patches = [patches(value, layout.patch_size) for value in values]
    placeholder = [0] * layout.num_tokens
    engine = build_engine(spec, config)
    try:

        async def image_runs():
            requests = [image_patches[:1], image_patches[1:4], image_patches[4:5]]
            return [
                [await engine.run([placeholder] * len(one), rows=RowRequest(images=one)) for _ in range(3)]
                for one in requests
            ]

        runs = asyncio.run(image_runs())
        image_keys = [key for key in engine.runner.graphs.graphs if key[4]]
    finally:
        engine.stop()
    assert image_keys, "no graph of images was captured"
    for expected_rows, request_runs in zip(
        (expected_images[:1], expected_images[1:4], expected_images[4:5]), runs
    ):
        for rows in request_runs:
            assert float((rows * expected_rows).sum(1).min()) >= 0.999
    engine = build_engine(spec, config)
    sequences = [*([[0] * layout.num_tokens] * len(image_patches)), *ids]
    try:

        async def runs():
            rows = RowRequest(images=[*image_patches, *([None] * len(ids))])
            return [await engine.run(sequences, rows=rows) for _ in range(3)]

        got = asyncio.run(runs())
        kinds = {bool(key[4]) for key in engine.runner.graphs.graphs}
    finally:
        engine.stop()
    # each tower's part of the batch ran eagerly, then was captured, then replayed
    assert kinds == {False, True}, "a batch of texts and images ran outside the towers' graphs"
    expected = np.concatenate([expected_images, expected_texts])
    for rows in got:
        assert float((rows * expected).sum(1).min()) >= 0.999
