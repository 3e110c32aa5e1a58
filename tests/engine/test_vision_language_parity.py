"""Qwen2-VL and Qwen3-VL (engine/models/vision_language.py, engine/inline_images.py) against transformers'
Qwen2VLModel and Qwen3VLModel (its learned positions resampled to each grid, DeepStack, interleaved
M-RoPE) on tiny random checkpoints: the processor's pixels and grids (api/images.py, any size within its
pixel range), and the last token's normalized row of texts, of texts holding an image, and of an image
alone, in fp32 within 1e-5, packed together in one batch, through the engine's queue and through two
replica processes; an image that several sequences hold runs once; a sequence whose placeholders do not
match its image is refused before it is queued."""

import asyncio
import io

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from api.images import ImageLimits, decode, normalized, patches, pixels
from benchmarks.image_checkpoints import vision_language_checkpoint
from engine.attention import select_backend
from engine.batch import pack
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.inline_images import inline_images
from engine.outputs import RowRequest
from engine.weights import load_model

TOLERANCE = 1e-5
# (height, width): wider, taller, under the pixel range (scaled up), over it (scaled down)
SIZES = [(50, 70), (90, 40), (20, 30), (200, 260)]


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen3_vl"])
def checkpoint(request, tmp_path_factory):
    kind = request.param
    return vision_language_checkpoint(tmp_path_factory.mktemp(kind) / kind, kind=kind)


def random_images(seed: int = 0) -> list[Image.Image]:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for h, w in SIZES]


def rgb(image: Image.Image) -> Image.Image:
    """The image as the gateway decodes it from a PNG a client sent."""
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return decode(buffer.getvalue(), ImageLimits(), "input")


def grids(spec) -> list[np.ndarray]:
    return [patches(pixels(rgb(image), spec.images), spec.images.patch_size) for image in random_images()]


def merged_order(grid: np.ndarray, spec) -> np.ndarray:
    """A grid's patches in the order the vision tower merges them (as the engine lays them out)."""
    image_token, merge = spec.config.image_token_id, spec.images.merge
    ids = np.full(grid.shape[0] * grid.shape[1] // merge**2, image_token)
    return inline_images(np.array([0, len(ids)]), ids, [grid], image_token, merge).patches[0]


def test_preprocessing_matches_the_models_processor(checkpoint):
    """Resized within the pixel range to whole merged patches, rescaled and normalized (by the model, on
    the device) as transformers' processor does; its two temporal copies of an image are one here."""
    from transformers import AutoImageProcessor

    folder, _ = checkpoint
    spec = resolve_model(str(folder))
    processor = AutoImageProcessor.from_pretrained(folder)
    for image, grid in zip(random_images(), grids(spec)):
        expected = processor(images=[image], return_tensors="np")
        assert [1, *grid.shape[:2]] == expected["image_grid_thw"][0].tolist()
        frames = expected["pixel_values"].reshape(len(expected["pixel_values"]), 3, 2, -1)
        ours = normalized(merged_order(grid, spec).reshape(-1, 3, 1, frames.shape[-1]), spec.images)
        np.testing.assert_allclose(ours[:, :, 0], frames[:, :, 0], atol=1e-6, rtol=0)
        np.testing.assert_array_equal(frames[:, :, 0], frames[:, :, 1])


def sequences_of(spec, tokenizer, grids_):
    """A text alone, texts around an image, and an image alone, as the model's chat layout places them:
    each image a run of placeholders between its start and end tokens."""
    config = spec.config
    start, end = tokenizer.token_to_id("<|vision_start|>"), tokenizer.token_to_id("<|vision_end|>")
    eos = tokenizer.token_to_id("<|endoftext|>")

    def text(words: str) -> list[int]:
        return tokenizer.encode(words, add_special_tokens=False).ids

    def image(grid) -> list[int]:
        return [start, *[config.image_token_id] * (grid.shape[0] * grid.shape[1] // 4), end]

    sequences = [text("a photo of a cat") + [eos]]
    images = [None]
    for index, grid in enumerate(grids_):
        around = (text("describe this picture"), text("in words")) if index % 2 else ([], [])
        sequences.append(around[0] + image(grid) + around[1] + [eos])
        images.append(grid)
    return sequences, images


def reference_rows(model, spec, sequences, images):
    """transformers' Qwen2VLModel on each sequence alone: its last token's row, normalized."""
    rows = []
    for ids, grid in zip(sequences, images):
        inputs = {"input_ids": torch.tensor([ids])}
        if grid is not None:
            values = normalized(
                merged_order(grid, spec).reshape(-1, 3, 1, spec.images.patch_size**2), spec.images
            )
            frames = np.repeat(values, 2, axis=2).reshape(len(values), -1)  # the processor's two copies
            inputs["pixel_values"] = torch.from_numpy(frames)
            inputs["image_grid_thw"] = torch.tensor([[1, *grid.shape[:2]]])
            inputs["mm_token_type_ids"] = (inputs["input_ids"] == spec.config.image_token_id).int()
        with torch.inference_mode():
            hidden = model.model(**inputs).last_hidden_state[0, -1]
        rows.append(F.normalize(hidden, dim=-1).numpy())
    return np.stack(rows)


@pytest.fixture(scope="module")
def inputs(checkpoint):
    from tokenizers import Tokenizer

    folder, model = checkpoint
    spec = resolve_model(str(folder))
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    sequences, images = sequences_of(spec, tokenizer, grids(spec))
    return spec, sequences, images, reference_rows(model, spec, sequences, images)


def test_texts_and_images_inside_them_match_transformers(inputs):
    spec, sequences, images, expected = inputs
    assert spec.task == "embed" and spec.images.pixel_range is not None
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    assert model.output.takes_images and model.output.image_run == (spec.config.image_token_id, 2)
    with torch.inference_mode():
        packed = model(pack(sequences, images=images, output=model.output)).numpy()
        texts_alone = model(pack(sequences[:1])).numpy()
    np.testing.assert_allclose(packed, expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(texts_alone, expected[:1], atol=TOLERANCE, rtol=0)


@pytest.fixture(scope="module")
def replicas(checkpoint):
    """Two replica processes of the checkpoint, which the tests that only send them requests share: chunks of
    at most 96 tokens, so that a request of several sequences goes to both."""
    from engine.checkpoint.source import ModelSource
    from engine.replicas.replica_set import ReplicaSet

    config = EngineConfig(device="cpu", dtype="float32", max_batch_tokens=96, max_queue_tokens=10**5)
    replica_set = ReplicaSet(ModelSource(str(checkpoint[0])), 2, config)
    replica_set.start()
    yield replica_set
    replica_set.stop()


def test_through_the_engine_and_two_replicas(inputs, replicas):
    """The engine's queue (batches of the longest sequence: the sequences split over several) and two
    replica processes (the grids cross the request ring, in chunks to both) give the rows of the model
    alone, in order."""
    spec, sequences, images, expected = inputs
    order = np.random.default_rng(1).permutation(len(sequences))
    ordered = [sequences[i] for i in order]
    rows = RowRequest(images=[images[i] for i in order])
    longest = max(map(len, sequences))
    config = EngineConfig(device="cpu", dtype="float32", max_batch_tokens=longest, max_queue_tokens=10**5)
    engine = build_engine(spec, config)
    try:
        got = asyncio.run(engine.run(ordered, rows=rows))
    finally:
        engine.stop()
    np.testing.assert_allclose(got, expected[order], atol=TOLERANCE, rtol=0)
    before = list(replicas.pool.chunks_sent)

    async def run():
        return (await replicas.pool.enqueue(ordered * 2, rows=RowRequest(images=list(rows.images) * 2))).rows

    got = asyncio.run(asyncio.wait_for(run(), 120))
    assert all(after > sent for after, sent in zip(replicas.pool.chunks_sent, before))  # both took chunks
    np.testing.assert_allclose(got, np.concatenate([expected[order]] * 2), atol=TOLERANCE, rtol=0)


def test_a_batch_budgets_the_vision_towers_patches(inputs):
    """Two images whose tokens fit one batch run in two where their patches (four a merged token) do not:
    the queue counts what the vision tower runs too."""
    spec, sequences, images, expected = inputs
    chosen = [index for index, grid in enumerate(images) if grid is not None][:2]
    budget = sum(len(sequences[index]) for index in chosen)
    assert sum(images[index].shape[0] * images[index].shape[1] for index in chosen) > 0
    batches = []
    config = EngineConfig(device="cpu", dtype="float32", max_batch_tokens=budget, max_queue_tokens=10**5)
    engine = build_engine(spec, config, on_batch=lambda tokens, seqs: batches.append(seqs))
    try:
        rows = RowRequest(images=[images[index] for index in chosen])
        got = asyncio.run(engine.run([sequences[index] for index in chosen], rows=rows))
    finally:
        engine.stop()
    assert batches == [1, 1]
    np.testing.assert_allclose(got, expected[chosen], atol=TOLERANCE, rtol=0)


def test_placeholders_that_do_not_match_the_image_are_refused(inputs):
    spec, sequences, images, _ = inputs
    engine = build_engine(spec, EngineConfig(device="cpu", dtype="float32"))
    try:
        short = sequences[1][:2] + sequences[1][3:]  # one placeholder less
        for ids, grid, needle in (
            (short, images[1], "image tokens, not one run"),
            (sequences[1], images[1][:3], "does not merge by 2"),
            (sequences[0], images[1], "holds 0 image tokens"),
        ):
            with pytest.raises(ValueError, match=needle):
                asyncio.run(engine.run([ids], rows=RowRequest(images=[grid])))
        assert asyncio.run(engine.run(sequences[:2], rows=RowRequest(images=images[:2]))).shape == (2, 64)
    finally:
        engine.stop()


def test_a_text_that_continues_a_prefix_beside_an_image(inputs):
    """A rerank's pairs that continue their shared prompt (a text judge's) may share a batch with an image:
    their positions go on after the prefix there too, so that each row is its whole text's."""
    spec, sequences, images, _ = inputs
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    prefix, continuation = sequences[0][:3], sequences[0][3:]
    with torch.inference_mode():
        whole = model(pack(sequences[:1])).numpy()
        mixed = model(
            pack([prefix, continuation, sequences[1]], prefix_of=[-1, 0, -1], images=[None, None, images[1]],
                 output=model.output)
        ).numpy()  # fmt: skip
    np.testing.assert_allclose(mixed[1], whole[0], atol=TOLERANCE, rtol=0)


def test_a_sequence_of_two_images_and_texts(inputs, checkpoint, replicas):
    """Two images in one sequence (a reranker's pair of an image query and an image document, a fused
    input of several images): each its run of placeholders, the text after each going on from it, as
    transformers' model lays out the positions of several images; alone, beside a text, and through two
    replica processes (the images of a sequence cross the request ring together)."""
    from tokenizers import Tokenizer

    spec, sequences, images, _ = inputs
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    first, second = images[1], images[2]
    one, two = sequences[1][:-1], sequences[2]  # an image with texts around it, then another alone
    ids = [*one, *tokenizer.encode(" and then", add_special_tokens=False).ids, *two]
    model = checkpoint[1]
    inputs_ = {"input_ids": torch.tensor([ids])}
    values = [
        normalized(merged_order(grid, spec).reshape(-1, 3, 1, spec.images.patch_size**2), spec.images)
        for grid in (first, second)
    ]
    frames = [np.repeat(value, 2, axis=2).reshape(len(value), -1) for value in values]
    inputs_["pixel_values"] = torch.from_numpy(np.concatenate(frames))
    inputs_["image_grid_thw"] = torch.tensor([[1, *grid.shape[:2]] for grid in (first, second)])
    inputs_["mm_token_type_ids"] = (inputs_["input_ids"] == spec.config.image_token_id).int()
    with torch.inference_mode():
        expected = F.normalize(model.model(**inputs_).last_hidden_state[0, -1], dim=-1).numpy()
    ours = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    with torch.inference_mode():
        packed = ours(pack([sequences[0], ids], images=[None, (first, second)], output=ours.output)).numpy()
    np.testing.assert_allclose(packed[1], expected, atol=TOLERANCE, rtol=0)
    with pytest.raises(ValueError, match="not one run of the"):
        ours(pack([ids], images=[(first,)], output=ours.output))
    rows = RowRequest(images=[None, (first, second), images[1]] * 2)

    async def run():
        return (await replicas.pool.enqueue([sequences[0], ids, sequences[1]] * 2, rows=rows)).rows

    got = asyncio.run(asyncio.wait_for(run(), 120))
    np.testing.assert_allclose(got[1], expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(got[4], expected, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(got[2], inputs[3][1], atol=TOLERANCE, rtol=0)


def test_an_image_that_several_sequences_hold_runs_once(inputs, checkpoint):
    """A vision-language ranker's image query sits in each of its pairs, the same grid: the vision tower
    runs it once and places its merged tokens in each sequence, whose rows are those each has with a copy
    of its own (the image alone twice, and beside another image in one sequence), in fp32 within 1e-5;
    and through the engine's queue and a replica process (the image crosses the request ring once), the
    same."""
    from tokenizers import Tokenizer

    from engine.checkpoint.source import ModelSource
    from engine.replicas.replica_set import ReplicaSet

    spec, sequences, images, expected = inputs
    tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
    shared, other = images[1], images[2]
    pair = [*sequences[1][:-1], *tokenizer.encode(" and then", add_special_tokens=False).ids, *sequences[2]]
    batch = [sequences[1], pair, sequences[0], sequences[1]]
    held = [shared, (shared, other), None, shared]
    copied = [shared.copy(), (shared.copy(), other), None, shared.copy()]
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    once = pack(batch, images=held, output=model.output)
    laid = once.images
    assert len(laid.patches) == 2 and len(laid.vision_cu_seqlens) == 3  # the shared image and the other
    assert laid.merged_rows is not None and len(laid.merged_rows) == len(laid.token_rows)
    assert pack(batch, images=copied, output=model.output).images.merged_rows is None
    with torch.inference_mode():
        got = model(once).numpy()
        apart = model(pack(batch, images=copied, output=model.output)).numpy()
    np.testing.assert_allclose(got, apart, atol=TOLERANCE, rtol=0)
    np.testing.assert_allclose(got[[0, 2, 3]], expected[[1, 0, 1]], atol=TOLERANCE, rtol=0)
    config = EngineConfig(device="cpu", dtype="float32")
    engine = build_engine(spec, config)
    try:
        queued = asyncio.run(engine.run(batch, rows=RowRequest(images=held)))
    finally:
        engine.stop()
    np.testing.assert_allclose(queued, apart, atol=TOLERANCE, rtol=0)
    replica_set = ReplicaSet(ModelSource(str(checkpoint[0])), 1, config)
    replica_set.start()
    try:

        async def run():
            return (await replica_set.pool.enqueue(batch, rows=RowRequest(images=held))).rows

        crossed = asyncio.run(asyncio.wait_for(run(), 120))
    finally:
        replica_set.stop()
    np.testing.assert_allclose(crossed, apart, atol=TOLERANCE, rtol=0)
