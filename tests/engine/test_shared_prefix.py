"""Shared prefixes: a batch runs a prefix's tokens once and each sequence that continues it attends to the
prefix's keys and then its own, its positions going on from the prefix's length. Scores equal those of
each full sequence alone (fp32, 1e-5), on a tiny random Qwen3 judge and a decoder sequence classifier."""

import dataclasses

import numpy as np
import pytest
import torch

from engine.attention import AttentionMetadata, select_backend, varlen_attention
from engine.batch import pack
from engine.outputs import ALL_ROWS, RowRequest
from tests.engine.fake_flashinfer import fake_flashinfer
from tests.engine.test_decoder_parity import save_random_decoder
from tests.engine.test_qwen3_parity import load, random_sequences, save_random_qwen3

TOLERANCE = 1e-5


def test_continuations_take_positions_after_their_prefix_and_its_keys_first():
    batch = pack([[5, 6, 7], [8, 9], [10], [11, 12]], prefix_of=[-1, 0, -1, 0])
    assert batch.positions.tolist() == [0, 1, 2, 3, 4, 0, 3, 4]
    meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen, batch.prefix_of)
    assert meta.keys.seqlens == (3, 5, 1, 5)
    assert meta.keys.index.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 2, 6, 7]
    assert meta.keys.cu_seqlens.tolist() == [0, 3, 8, 9, 14]


@pytest.mark.parametrize("prefix_of", [[0, -1], [-1, 1], [-1, 0, 1], [-1]])
def test_a_prefix_comes_first_and_continues_nothing(prefix_of):
    with pytest.raises(ValueError):
        pack([[1, 2]] * 3 if len(prefix_of) == 3 else [[1, 2]] * 2, prefix_of=prefix_of)


@pytest.mark.parametrize("window", [None, 4])
def test_a_continuation_attends_as_the_tail_of_the_whole_sequence(window):
    # one causal sequence of 7 + 9 tokens, and the same tokens as a prefix and its continuation: the
    # continuation's rows are the whole sequence's last rows, with and without a sliding window
    torch.manual_seed(0)
    q, k, v = (torch.randn(16, heads, 8) for heads in (4, 2, 2))
    backend = select_backend("torch", "cpu")
    whole = AttentionMetadata.build(torch.tensor([0, 16], dtype=torch.int32), 16)
    expected = varlen_attention(q, k, v, whole, backend=backend, causal=True, window=window)
    split = pack([[0] * 7, [0] * 9], prefix_of=[-1, 0])
    meta = AttentionMetadata.build(split.cu_seqlens, split.max_seqlen, split.prefix_of)
    got = varlen_attention(q, k, v, meta, backend=backend, causal=True, window=window)
    assert torch.allclose(got, expected, atol=1e-6)


def shared_layout(prefixes, suffixes_of, plain=()):
    """[prefix, its suffixes..., plain...] groups: (sequences, prefix_of, the indexes of the rows wanted,
    each wanted row's full sequence)."""
    sequences, prefix_of, wanted, full = [], [], [], []
    for prefix, suffixes in zip(prefixes, suffixes_of):
        sequences.append(prefix)
        prefix_of.append(-1)
        at = len(sequences) - 1
        for suffix in suffixes:
            wanted.append(len(sequences))
            sequences.append(suffix)
            prefix_of.append(at)
            full.append(prefix + suffix)
        for extra in plain:
            wanted.append(len(sequences))
            sequences.append(extra)
            prefix_of.append(-1)
            full.append(extra)
    return sequences, prefix_of, wanted, full


def scores_both_ways(model, prefixes, suffixes_of, plain=()):
    """Logits of [prefix, its suffixes...] groups (and plain sequences between them) packed with shared
    prefixes, and of each full sequence packed on its own."""
    sequences, prefix_of, wanted, full = shared_layout(prefixes, suffixes_of, plain)
    with torch.inference_mode():
        shared = model(pack(sequences, prefix_of=prefix_of))[wanted]
        alone = torch.cat([model(pack([ids])) for ids in full])
    return shared, alone


@pytest.fixture(scope="module")
def judge(tmp_path_factory):
    folder = tmp_path_factory.mktemp("judge")
    save_random_qwen3(folder, "Qwen3ForCausalLM")
    return load(folder)[1]


@pytest.mark.parametrize(
    "prefix_lengths, suffix_lengths",
    [((1,), (1,)), ((9,), (1, 17, 4)), ((40,), (30, 2, 55, 12, 8)), ((5, 23), (9, 1, 31)), ((60,), (60,))],
)
def test_judge_scores_with_a_shared_prefix_equal_each_pair_alone(judge, prefix_lengths, suffix_lengths):
    prefixes = random_sequences(prefix_lengths, seed=11)
    suffixes = [random_sequences(suffix_lengths, seed=12 + n) for n in range(len(prefixes))]
    shared, alone = scores_both_ways(judge, prefixes, suffixes, plain=random_sequences((13,), seed=9))
    assert (shared - alone).abs().max().item() <= TOLERANCE


def test_the_parity_fails_where_a_suffix_misses_its_prefix_or_sees_another(judge):
    # what the parity test above would catch: a suffix scored without its prefix, or after another
    # suffix, differs from its pair by far more than the tolerance
    prefix, first, second = random_sequences((20, 15, 15), seed=21)
    with torch.inference_mode():
        pair = judge(pack([prefix + second]))[0]
        without_prefix = judge(pack([second]))[0]
        after_another = judge(pack([prefix + first + second]))[0]
        shared = judge(pack([prefix, first, second], prefix_of=[-1, 0, 0]))[2]
    assert (shared - pair).abs().max().item() <= TOLERANCE
    assert (without_prefix - pair).abs().max().item() > 100 * TOLERANCE
    assert (after_another - pair).abs().max().item() > 100 * TOLERANCE


@pytest.mark.parametrize(
    "architecture", ["Qwen2ForSequenceClassification", "MistralForSequenceClassification"]
)
def test_a_decoder_classifier_scores_continuations_as_whole_pairs(tmp_path, architecture):
    save_random_decoder(tmp_path, architecture, num_labels=1)
    _, model = load(tmp_path)
    prefixes = random_sequences((17, 3), seed=31)
    suffixes = [random_sequences((8, 25, 1), seed=32), random_sequences((40,), seed=33)]
    shared, alone = scores_both_ways(model, prefixes, suffixes)
    assert shared.shape == (4, 1)
    assert (shared - alone).abs().max().item() <= TOLERANCE
    assert np.ptp(alone.numpy()) > 100 * TOLERANCE  # the scores differ: the comparison can fail


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_graphs_buffers_run_shared_prefixes_as_their_whole_pairs(judge, monkeypatch, seed):
    # what a CUDA graph of a shared-prefix batch replays, on the CPU without the graph: the staged buffers
    # of its key (a fixed-size gather index and key lengths, dummy sequences over the padding) through a
    # backend in graph mode, flashinfer's (a fake that answers with the torch reference), planned from
    # `prepare`'s host lengths only
    from engine.config import EngineConfig
    from engine.cuda_graphs import GraphCache, _StaticInputs, host_cu_seqlens, host_key_cu_seqlens, stage

    flashinfer = fake_flashinfer(monkeypatch)
    graphs = GraphCache.__new__(GraphCache)  # key() needs no device
    graphs.config, graphs.largest_seqlen_bucket = EngineConfig(device="cuda", max_batch_tokens=4096), 512
    rng = np.random.default_rng(seed)
    prefixes = random_sequences(rng.integers(1, 60, 2).tolist(), seed=60 + seed)
    suffixes = [random_sequences(rng.integers(1, 70, int(n)).tolist(), seed=70 + seed) for n in (3, 5)]
    sequences, prefix_of, wanted, whole = shared_layout(prefixes, suffixes)
    batch = pack(sequences, prefix_of=prefix_of)
    key = graphs.key(batch)
    assert key[3] >= 64 * -(-batch.num_tokens // 64) + sum(len(sequences[at]) for at in prefix_of if at >= 0)
    inputs = _StaticInputs.allocate(key, torch.device("cpu"))
    staged = stage(batch, key)
    inputs.ints.copy_(torch.from_numpy(staged))
    for source, narrow in inputs.narrowed:
        narrow.copy_(source)
    flashinfer.prepare(inputs.meta, host_cu_seqlens(staged, key), host_key_cu_seqlens(staged, key))
    layers = [module for module in judge.modules() if hasattr(module, "attention_backend")]
    eager_backend = layers[0].attention_backend
    try:
        for layer in layers:
            layer.attention_backend = flashinfer
        with torch.inference_mode():
            rows = judge(inputs.batch, inputs.meta)[: batch.num_seqs]
    finally:
        for layer in layers:
            layer.attention_backend = eager_backend
    with torch.inference_mode():
        alone = torch.cat([judge(pack([ids])) for ids in whole])
    assert (rows[wanted] - alone).abs().max().item() <= TOLERANCE


def test_the_engine_runs_a_request_with_a_prefix_as_its_whole_pairs_across_batches(judge):
    import asyncio

    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.runner import ModelRunner

    # 20 prefix tokens and 50 suffixes of 10 to 30 under a 100-token budget: the scheduler cuts the
    # request into many batches, each with the prefix once, and a plain request rides along
    engine = Engine(ModelRunner(judge, torch.device("cpu")), EngineConfig(max_batch_tokens=100))
    engine.runs_prefixes = True
    engine.start()
    prefix = random_sequences((20,), seed=41)[0]
    lengths = np.random.default_rng(4).integers(10, 31, 50).tolist()
    suffixes = random_sequences(lengths, seed=42)
    plain = random_sequences((33, 7), seed=43)

    async def both():
        return await asyncio.gather(engine.run(suffixes, rows=RowRequest(prefix=prefix)), engine.run(plain))

    try:
        shared, plain_rows = asyncio.run(both())
        whole = asyncio.run(engine.run([prefix + suffix for suffix in suffixes]))
        alone = asyncio.run(engine.run(plain))
    finally:
        engine.stop()
    assert shared.shape == (50, 2)
    assert np.abs(shared - whole).max() <= TOLERANCE
    assert np.abs(plain_rows - alone).max() <= TOLERANCE


def test_a_requests_output_counts_its_prefix_once_a_batch(judge):
    import asyncio

    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.runner import ModelRunner

    batches = []
    engine = Engine(
        ModelRunner(judge, torch.device("cpu")), EngineConfig(max_batch_tokens=100),
        on_batch=lambda num_tokens, num_seqs: batches.append(num_tokens),
    )  # fmt: skip
    engine.runs_prefixes = True
    engine.start()
    prefix = random_sequences((20,), seed=44)[0]
    suffixes = random_sequences([30] * 7, seed=45)

    async def run():
        return await engine.enqueue(suffixes, rows=RowRequest(prefix=prefix))

    try:
        output = asyncio.run(run())
    finally:
        engine.stop()
    # 20 + 2 x 30 a batch: four batches, the prefix in each
    assert batches == [80, 80, 80, 50] and output.num_tokens == sum(batches) == 7 * 30 + 4 * 20
    assert engine.tokens_to_run([30] * 7, 20) == output.num_tokens


def test_replicas_run_a_prefix_once_a_chunk_and_give_the_whole_pairs_rows(tmp_path):
    import asyncio

    from engine.checkpoint.source import ModelSource
    from engine.config import EngineConfig
    from engine.replicas.replica_set import ReplicaSet

    # a 128-token budget: 12 suffixes of 30 tokens after a 20-token prefix go as 4 chunks of 3, each
    # with the prefix once, through the gateway's pool and a replica process's rings
    save_random_qwen3(tmp_path, "Qwen3ForCausalLM")
    replicas = ReplicaSet(ModelSource(str(tmp_path)), 1, EngineConfig(device="cpu", max_batch_tokens=128))
    replicas.start()
    prefix = random_sequences((20,), seed=46)[0]
    suffixes = random_sequences([30] * 12, seed=47)
    pool = replicas.pool

    async def both():
        shared = await asyncio.wait_for(pool.enqueue(suffixes, rows=RowRequest(prefix=prefix)), 120)
        whole = await asyncio.wait_for(pool.enqueue([prefix + suffix for suffix in suffixes]), 120)
        return shared, whole

    try:
        assert pool.shares_prefix(20, [30] * 12) and not pool.shares_prefix(20, [30])
        shared, whole = asyncio.run(both())
    finally:
        replicas.stop()
    assert np.abs(shared.rows - whole.rows).max() <= TOLERANCE
    assert np.ptp(whole.rows[:, 0]) > 100 * TOLERANCE
    assert shared.num_tokens == 12 * 30 + 4 * 20 == pool.tokens_to_run([30] * 12, 20)
    assert whole.num_tokens == 12 * 50


def test_rerank_with_a_judge_scores_chunked_documents_alike_shared_or_whole(tmp_path):
    # Qwen3-Reranker's template on a tiny random judge (window 128): long documents split into chunks,
    # each chunk a continuation of the one prefix, in batches of 256 tokens cut mid-request; with and
    # without max_tokens_per_doc, the scores equal those of the whole pairs
    import asyncio

    from tokenizers import Tokenizer

    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig
    from scoring.rerank import RerankModel, RerankOptions, rerank_scores
    from scoring.templates import QWEN3_JUDGE, SingleTemplate

    save_random_qwen3(tmp_path, "Qwen3ForCausalLM")
    spec = resolve_model(str(tmp_path))
    engine = build_engine(spec, EngineConfig(device="cpu", max_batch_tokens=256))
    prefixes = []

    class Recording:
        shares_prefix = engine.shares_prefix

        async def run(self, token_ids, token_type_ids=None, rows=ALL_ROWS):
            prefixes.append(rows.prefix)
            return await engine.run(token_ids, token_type_ids, rows)

    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    model = RerankModel(
        Recording(), spec.max_seq_length, SingleTemplate.from_tokenizer(tokenizer),
        QWEN3_JUDGE.pair_template(tokenizer), cross_encoder=True, prompts=QWEN3_JUDGE,
    )  # fmt: skip
    query, *documents = random_sequences((6, 12, 150, 320, 45), seed=48)
    try:
        for max_tokens in (None, 100):
            options = RerankOptions(max_tokens_per_doc=max_tokens, raw_scores=True)
            scores = {}
            for shares in (True, False):
                engine.shares_prefixes = shares
                scores[shares] = asyncio.run(rerank_scores(model, query, documents, options))
            assert np.abs(scores[True] - scores[False]).max() <= TOLERANCE
            assert np.ptp(scores[False]) > 100 * TOLERANCE
    finally:
        engine.stop()
    pair = model.pair
    prefix = [*pair.prefix.ids, *query, *pair.middle.ids]
    assert prefixes == [prefix, None, prefix, None]
    assert len(prefix) + 150 + len(pair.suffix.ids) > spec.max_seq_length  # the documents were chunked


def test_an_engine_that_shares_no_prefixes_refuses_one(judge):
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.runner import ModelRunner

    engine = Engine(ModelRunner(judge, torch.device("cpu")), EngineConfig(max_batch_tokens=100))
    engine.start()
    try:
        with pytest.raises(ValueError, match="shared prefixes"):
            engine.submit(None, [[5, 6]], rows=RowRequest(prefix=[7]))
    finally:
        engine.stop()


def test_a_causal_model_on_a_backend_with_key_layouts_shares_prefixes(tmp_path):
    from engine.build import build_engine
    from engine.checkpoint.resolve import resolve_model
    from engine.config import EngineConfig

    save_random_qwen3(tmp_path / "judge", "Qwen3ForCausalLM")
    save_random_qwen3(tmp_path / "bidirectional", "Qwen3Model", sentence_transformers="mean")
    config = EngineConfig(device="cpu")
    judge = build_engine(resolve_model(str(tmp_path / "judge")), config)
    bidirectional = build_engine(resolve_model(str(tmp_path / "bidirectional"), bidirectional=True), config)
    try:
        # on the CPU (no CUDA graphs) rerank sends its pairs so wherever that saves a token
        assert judge.runs_prefixes and judge.shares_prefixes and not bidirectional.runs_prefixes
        assert judge.shares_prefix(1, [5, 5]) and not judge.shares_prefix(10, [5])
        assert judge.describe()["shared_prefixes"] == "1"
        assert bidirectional.describe()["shared_prefixes"] == "off"
    finally:
        judge.stop()
        bidirectional.stop()
    # --shared-prefixes off: the judge still runs prefixes it is sent, but asks for none
    config = dataclasses.replace(config, shared_prefixes=False)
    judge = build_engine(resolve_model(str(tmp_path / "judge")), config)
    try:
        assert judge.runs_prefixes and not judge.shares_prefix(100, [5] * 50)
        assert judge.describe()["shared_prefixes"] == "off"
    finally:
        judge.stop()


def cuda_judge(folder, backend_name, graphs=False):
    """(a small judge with Qwen3-0.6B's heads, 16/8 of head dim 128, in bf16 on CUDA; its backend), or a
    skip where CUDA, the backend or its key layouts are missing."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from engine.checkpoint.resolve import resolve_model
    from engine.errors import AttentionBackendUnavailable
    from engine.weights import load_model

    save_random_qwen3(
        folder, "Qwen3ForCausalLM", hidden_size=256, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=512, max_position_embeddings=1024,
    )  # fmt: skip
    shape = dict(num_heads=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    try:
        backend = select_backend(backend_name, "cuda", **shape, graphs=graphs)
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))
    if not backend.reads_key_layout:
        pytest.skip(f"{backend.describe()} runs no shared prefixes here")
    return load_model(resolve_model(str(folder)), "cuda", torch.bfloat16, backend), backend


@pytest.mark.gpu
def test_on_cuda_in_bf16_continuations_score_as_their_whole_pairs(tmp_path):
    # on the default backend: the shared-prefix batch's judge logits against the whole pairs' in the
    # same dtype
    model, _ = cuda_judge(tmp_path, "auto")
    prefixes = random_sequences((90,), seed=51)
    suffixes = [random_sequences((150, 7, 300, 150), seed=52)]
    with torch.inference_mode():
        sequences = [prefixes[0], *suffixes[0]]
        batch = pack(sequences, prefix_of=[-1, 0, 0, 0, 0])
        shared = model(batch.to("cuda"))[1:].cpu()
        whole = model(pack([prefixes[0] + s for s in suffixes[0]]).to("cuda")).cpu()
    assert (shared - whole).abs().max().item() <= 0.05 * whole.abs().max().item()


@pytest.mark.gpu
@pytest.mark.parametrize("backend_name", ["torch-varlen", "flashinfer", "triton"])
def test_cuda_graphs_of_shared_prefix_batches_score_as_their_whole_pairs(tmp_path, backend_name):
    # shared-prefix batches of several shapes, each run three times through the graph cache (eager,
    # capture, replay), and many batches of new lengths through one captured key, against the whole pairs
    # run eagerly
    from engine.config import EngineConfig
    from engine.cuda_graphs import GraphCache

    model, backend = cuda_judge(tmp_path, backend_name, graphs=True)
    config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=8192)
    graphs = GraphCache(model, backend, config, torch.device("cuda"), max_seqlen=1024)

    def both(prefix_lengths, suffix_lengths, seed):
        prefixes = random_sequences(prefix_lengths, seed=seed)
        suffixes = [random_sequences(suffix_lengths, seed=seed + 1 + n) for n in range(len(prefixes))]
        sequences, prefix_of, wanted, whole = shared_layout(prefixes, suffixes)
        return pack(sequences, prefix_of=prefix_of), wanted, pack(whole)

    shapes = [((90,), (150, 7, 300, 150)), ((40,), (160,) * 20), ((100, 30), (412, 5)), ((1,), (1, 2))]
    rng = np.random.default_rng(5)
    shapes += [((int(rng.integers(1, 120)),), tuple(rng.integers(1, 200, 6).tolist())) for _ in range(20)]
    with torch.inference_mode():
        for seed, (prefix_lengths, suffix_lengths) in enumerate(shapes):
            batch, wanted, whole = both(prefix_lengths, suffix_lengths, 100 * seed)
            expected = model(whole.to("cuda")).float()
            for repeat in range(3 if seed < 4 else 1):
                out = graphs.run(batch)
                if out is None:
                    continue
                error = (out[wanted].float() - expected).abs().max().item()
                assert error <= 0.05 * expected.abs().max().item(), (prefix_lengths, suffix_lengths, repeat)
    shared_keys = [key for key in graphs.graphs if key[3]]
    assert shared_keys, "no graph of shared-prefix batches was captured"
