"""Graph buckets and padding (CPU), and on CUDA: replay equals eager at bucket edges and across
many batches through one graph, LazyTensor results with many batches in flight, and eager-warmup
capturing every bucket at start-up."""

import numpy as np
import pytest
import torch

from engine.batch import pack
from engine.config import EngineConfig
from engine.cuda_graphs import stage


def test_token_buckets_round_up_to_64_then_256():
    config = EngineConfig(device="cuda", max_batch_tokens=16384)
    assert config.token_bucket(1) == 64
    assert config.token_bucket(63) == 64
    assert config.token_bucket(64) == 64  # exactly on a bucket: no padding
    assert config.token_bucket(65) == 128
    assert config.token_bucket(1024) == 1024
    assert config.token_bucket(1025) == 1280
    assert config.token_bucket(16384) == 16384
    assert config.token_bucket(16385) is None  # above the largest bucket: eager
    assert config.token_buckets()[0] == 16384 and config.token_buckets()[-1] == 64
    assert EngineConfig(device="cuda", max_batch_tokens=1000).token_buckets()[0] == 1024


def test_sequence_slots_and_length_buckets():
    config = EngineConfig(device="cuda", max_batch_seqs=512)
    assert [config.sequence_bucket(n, 16384) for n in (2, 3, 4, 8, 9, 64, 65, 328, 516)] == [
        2, 4, 4, 8, 16, 64, 128, 384, 516,
    ]  # fmt: skip
    assert config.sequence_bucket(60, 64) == 64
    assert [config.seqlen_bucket(n, 512) for n in (1, 50, 64, 65, 300, 512)] == [64, 64, 64, 128, 512, 512]


def test_stage_pads_with_zero_length_slots_then_dummies_no_longer_than_the_length_bucket():
    batch = pack([[5, 6, 7], [8, 9]], [[0, 0, 1], None])
    # 5 real tokens padded to 12, sequences of at most 4: dummies of 4 and 3 tokens after one empty slot
    ints = stage(batch, (12, 5, 4, 0, 0))
    ids, types, positions, segments = ints[:48].reshape(4, 12).tolist()
    assert ids == [5, 6, 7, 8, 9] + [0] * 7
    assert types == [0, 0, 1] + [0] * 9
    assert positions == [0, 1, 2, 0, 1] + [0] * 7
    assert segments == [0, 0, 0, 1, 1, 3, 3, 3, 3, 4, 4, 4]
    assert ints[48:53].tolist() == [3, 2, 1, 4, 3]  # slot lengths; the empty slot divides by one
    assert ints[53:].tolist() == [0, 3, 5, 5, 9, 12]  # cu_seqlens
    # staging into a used buffer gives the same layout
    assert (stage(batch, (12, 5, 4, 0, 0), out=np.full(59, 7, dtype=np.int64)) == ints).all()


def test_graph_key_reserves_slots_for_the_dummies():
    from engine.cuda_graphs import GraphCache

    config = EngineConfig(device="cuda", max_batch_tokens=4096)
    graphs = GraphCache.__new__(GraphCache)  # key() needs no device
    graphs.config, graphs.largest_seqlen_bucket = config, 512
    assert graphs.key(pack([[1] * 50] * 30)) == (1536, 32, 64, 0, 0)  # 36 padding tokens: one dummy
    assert graphs.key(pack([[1] * 50] * 27)) == (1536, 32, 64, 0, 0)  # 186 padding tokens: three dummies
    assert graphs.key(pack([[1] * 300])) == (320, 2, 512, 0, 0)
    assert graphs.key(pack([[1] * 128])) == (128, 1, 128, 0, 0)  # exactly on a bucket: no dummy


def test_a_batch_of_images_alone_has_a_key_of_its_patch_size():
    """Images alone (a dual encoder's vision tower) run in graphs keyed also by their patch size; texts
    and images together run eagerly."""
    import numpy as np

    from engine.cuda_graphs import GraphCache, stage

    config = EngineConfig(device="cuda", max_batch_tokens=4096)
    graphs = GraphCache.__new__(GraphCache)  # key() needs no device
    graphs.config, graphs.largest_seqlen_bucket = config, 128
    image = np.ones((7, 7, 48), dtype=np.uint8)
    images = pack([[0] * 50] * 3, images=[image] * 3)
    key = graphs.key(images)
    assert key == (192, 4, 64, 0, 48) and stage(images, key).shape[0] > 0
    assert graphs.key(pack([[0] * 50, [5, 6]], images=[image, None])) is None
    assert graphs.key(pack([[5, 6] * 25] * 3)) == (192, 4, 64, 0, 0)


def test_a_sequence_past_the_longest_length_bucket_runs_eagerly():
    """bge-m3's tokens suite sent 512-token texts to a checkpoint of a 126-token window: the graph's
    128-token length bucket left its dummies more slots than it had (a ValueError in staging on the H200)."""
    from engine.cuda_graphs import GraphCache

    graphs = GraphCache.__new__(GraphCache)  # key() needs no device
    graphs.config, graphs.largest_seqlen_bucket = EngineConfig(device="cuda", max_batch_tokens=32768), 128
    batch = pack([[1] * 508] + [[1] * 60] * 99)
    assert graphs.key(batch) is None
    inside = pack([[1] * 128] + [[1] * 60] * 99)
    key = graphs.key(inside)
    assert key == (6144, 128, 128, 0, 0) and stage(inside, key).shape[0] > 0


def test_a_shared_prefix_batch_stages_each_slots_keys_prefix_first():
    from engine.cuda_graphs import GraphCache, host_key_cu_seqlens

    graphs = GraphCache.__new__(GraphCache)  # key() needs no device
    graphs.config, graphs.largest_seqlen_bucket = EngineConfig(device="cuda", max_batch_tokens=4096), 512
    batch = pack([[5, 6, 7], [8, 9], [10, 11, 12, 13]], prefix_of=[-1, 0, 0])
    # 9 tokens in a 64-token bucket, one dummy of 55 tokens; keys 3 + 5 + 7 + the dummy's 55 in 128
    key = graphs.key(batch)
    assert key == (64, 4, 64, 128, 0)
    ints = stage(batch, key)
    index = ints[4 * 64 + 2 * 4 + 1 :][:128]
    assert index[:15].tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 7, 8]
    assert index[15:70].tolist() == list(range(9, 64)) and not index[70:].any()
    assert host_key_cu_seqlens(ints, key).tolist() == [0, 3, 8, 15, 70]
    assert ints[:64][:9].tolist() == [5, 6, 7, 8, 9, 10, 11, 12, 13]
    assert ints[128:192][:9].tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 6]  # positions go on from the prefix
    # a sequence whose keys outrun the longest length bucket runs eagerly
    assert graphs.key(pack([[1] * 300, [2] * 300], prefix_of=[-1, 0])) is None


def test_stage_without_padding_has_no_dummy():
    ints = stage(pack([[5, 6, 7, 8]]), (4, 1, 4, 0, 0))
    assert ints[:16].reshape(4, 4)[3].tolist() == [0, 0, 0, 0]  # every token in sequence 0
    assert ints[16:].tolist() == [4, 0, 4]  # slot length, cu_seqlens


# head dim 64, which every CUDA backend runs (flashinfer's prebuilt kernels are for 64 and 128)
GRAPH_SHAPE = {"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512}
# flashinfer plans on the host before each replay (prepare); triton hands sequences over 128 tokens on
GRAPH_BACKENDS = ["torch-varlen", "flashinfer", "triton"]


def gpu_model(tmp_path, dtype, backend_name="torch-varlen"):
    """(model, its attention backend, spec); skips where the backend cannot run here."""
    from engine.attention import select_backend
    from engine.checkpoint.resolve import resolve_model
    from engine.errors import AttentionBackendUnavailable
    from engine.weights import load_model
    from tests.engine.test_gpu import save_random_bert

    save_random_bert(tmp_path, shape=GRAPH_SHAPE)
    spec = resolve_model(str(tmp_path))
    try:
        backend = select_backend(backend_name, "cuda", num_heads=4, num_kv_heads=4, head_dim=64, dtype=dtype)
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))
    return load_model(spec, "cuda", dtype, backend), backend, spec


def random_batch(lengths, seed):
    generator = torch.Generator().manual_seed(seed)
    return pack([torch.randint(5, 1000, (n,), generator=generator).tolist() for n in lengths])


@pytest.mark.gpu
@pytest.mark.parametrize("backend_name", GRAPH_BACKENDS)
def test_replay_equals_eager_at_bucket_edges_and_across_many_batches(tmp_path, backend_name):
    from engine.attention import AttentionMetadata
    from engine.cuda_graphs import GraphCache

    model, backend, spec = gpu_model(tmp_path, torch.bfloat16, backend_name)
    config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=4096)
    graphs = GraphCache(model, backend, config, torch.device("cuda"), max_seqlen=512)

    def eager(batch):
        meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen).to("cuda")
        return model(batch.to("cuda"), meta).float()

    shapes = [[63], [64], [65], [31, 32], [32, 32], [511, 512], [512, 512], [500, 24], [1, 1, 1]]
    shapes += [
        [int(n) for n in torch.randint(1, 300, (k,), generator=torch.Generator().manual_seed(k))]
        for k in range(2, 9)
    ]
    num_graphed = 0
    with torch.inference_mode():
        eager(random_batch([5], 0))  # compiles the Triton kernels before any capture is timed
        for seed, lengths in enumerate(shapes):
            for repeat in range(3):  # a new bucket: eager, then capture, then replay
                batch = random_batch(lengths, seed * 10 + repeat)
                out = graphs.run(batch)
                if out is None:
                    assert repeat == 0
                    continue
                num_graphed += 1
                cosine = torch.nn.functional.cosine_similarity(out.float(), eager(batch))
                assert cosine.min().item() >= 0.999, (lengths, repeat)
        # many different batches through one graph: same key, different lengths each time
        for seed in range(42):
            lengths = [
                int(n) for n in torch.randint(1, 9, (5,), generator=torch.Generator().manual_seed(100 + seed))
            ]
            batch = random_batch(lengths, 1000 + seed)
            assert graphs.key(batch) == (64, 8, 64, 0, 0)
            out = graphs.run(batch)
            if out is None:  # the key's first hit, unless an earlier shape captured it
                assert seed == 0
                continue
            cosine = torch.nn.functional.cosine_similarity(out.float(), eager(batch))
            assert cosine.min().item() >= 0.999
    assert num_graphed >= 2 * len(shapes)
    assert max(graphs.capture_seconds.values()) < 1.0
    print({"graphs": len(graphs.graphs), "graph_mib": graphs.memory_bytes / 2**20})


@pytest.mark.gpu
@pytest.mark.parametrize("backend_name", GRAPH_BACKENDS)
def test_lazy_tensors_resolve_with_many_batches_in_flight(tmp_path, backend_name):
    """The host runs many batches ahead of the GPU, each with new lengths (over 128 tokens in one of two,
    so that flashinfer plans inside triton's graphs too): no batch's plan or inputs are read by another,
    and rows already read stay as they were while later steps reuse their pinned host buffers."""
    from engine.cuda_graphs import GraphCache
    from engine.runner import ModelRunner

    model, backend, _ = gpu_model(tmp_path, torch.bfloat16, backend_name)
    config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=4096)
    graphs = GraphCache(model, backend, config, torch.device("cuda"), 512)
    runner = ModelRunner(model, torch.device("cuda"), graphs)
    batches = [random_batch([8 + i % 5, 20 + i % 3, 150 * (i % 2) + 1 + i % 7], i) for i in range(64)]
    pending = []
    for batch in batches:  # no result() between steps, the GPU held back so that the host runs ahead
        torch.cuda._sleep(2_000_000)
        pending.append(runner.step(batch))
    results = [lazy.result() for lazy in pending]
    expected = [runner.step(batch).result() for batch in batches]
    for got, want in zip(results, expected):
        assert got.shape == want.shape
        assert (
            torch.nn.functional.cosine_similarity(torch.from_numpy(got), torch.from_numpy(want)).min()
            >= 0.999
        )


def test_the_capture_placeholder_fits_every_key_a_batch_can_produce():
    from engine.cuda_graphs import GraphCache, _placeholder_batch

    config = EngineConfig(device="cuda", max_batch_tokens=4096, max_batch_seqs=64)
    graphs = GraphCache.__new__(GraphCache)
    graphs.config, graphs.largest_seqlen_bucket = config, 512
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        num_seqs = int(torch.randint(1, 65, (1,), generator=generator))
        lengths = torch.randint(1, 513, (num_seqs,), generator=generator).tolist()
        while sum(lengths) > 4096:
            lengths.pop()
        key = graphs.key(pack([[1] * n for n in lengths]))
        stage(_placeholder_batch(key), key)  # raises when the placeholder does not fit
        # and a batch whose later sequences continue its first, where their keys fit the window
        prefix_of = [-1] + [0] * (len(lengths) - 1)
        if len(lengths) > 1 and lengths[0] + max(lengths[1:]) <= 512:
            batch = pack([[1] * n for n in lengths], prefix_of=prefix_of)
            key = graphs.key(batch)
            stage(batch, key)  # raises when its keys do not fit the key bucket
            stage(_placeholder_batch(key), key)


@pytest.mark.gpu
def test_eager_warmup_captures_every_bucket_at_start_then_serves_like_eager(tmp_path, caplog):
    import asyncio
    import logging

    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from tests.engine.test_gpu import save_random_bert

    save_random_bert(tmp_path)
    spec = resolve_model(str(tmp_path))
    generator = torch.Generator().manual_seed(0)
    requests = [
        [torch.randint(5, 1000, (int(n),), generator=generator).tolist() for n in lengths]
        for lengths in ([7], [63, 64, 65], [300, 200, 100], [511] * 2, [5] * 40)
    ]

    def rows(mode):
        config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=1024, cuda_graphs=mode)
        engine = build_engine(spec, config)

        async def run_all():
            return await asyncio.gather(*(engine.run(request) for request in requests))

        try:
            captured_at_start = len(engine.runner.graphs.graphs) if engine.runner.graphs else 0
            out = np.concatenate(asyncio.run(run_all()))
            captured_after = len(engine.runner.graphs.graphs) if engine.runner.graphs else 0
        finally:
            engine.stop()
        return out, captured_at_start, captured_after, config.token_buckets()

    with caplog.at_level(logging.INFO):
        warm, at_start, after, buckets = rows("eager-warmup")
    assert at_start == len(buckets) == 16  # 64, 128, ..., 1024: every bucket, before any request
    assert after == at_start  # serving captured nothing more
    assert f"captured {len(buckets)} CUDA graphs" in caplog.text and "capturing CUDA graphs" in caplog.text
    eager, _, _, _ = rows("off")
    cosine = (warm * eager).sum(1) / np.linalg.norm(warm, axis=1) / np.linalg.norm(eager, axis=1)
    assert cosine.min() >= 0.999  # bf16, graph replay against eager


def test_rows_say_whether_they_are_all_finite():
    from engine.lazy import LazyTensor

    rows = torch.randn(8, 16)
    assert LazyTensor(rows).all_finite()
    rows[3, 5] = float("inf")
    assert not LazyTensor(rows).all_finite()


@pytest.mark.gpu
@pytest.mark.parametrize("num_rows", [10, 20_000])
def test_large_rows_are_checked_for_nan_on_the_device_small_ones_on_the_host(num_rows):
    """20,000 x 128 floats are past DEVICE_CHECK_FLOATS: their check comes back with them."""
    from engine.lazy import DEVICE_CHECK_FLOATS, HostBuffers, LazyTensor

    buffers = HostBuffers()
    rows = torch.randn(num_rows, 128, device="cuda")
    clean = LazyTensor(rows, buffers)
    assert clean._device_checked == (rows.numel() > DEVICE_CHECK_FLOATS)
    assert clean.all_finite()
    np.testing.assert_array_equal(clean.result(), rows.cpu().numpy())
    rows[num_rows // 2, 3] = float("nan")
    dirty = LazyTensor(rows, buffers)  # the first one's buffer again: its flag slot is written anew
    np.testing.assert_array_equal(np.isnan(dirty.result()), torch.isnan(rows).cpu().numpy())
    assert not dirty.all_finite()
