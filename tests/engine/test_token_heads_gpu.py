"""The token-level heads on CUDA in bf16 against the same tiny random checkpoints in fp32 on the CPU (whose
parity with colbert-ai, SparseEncoder and FlagEmbedding tests/engine/test_colbert_parity.py and
test_sparse_parity.py show): ColBERT query and document vectors (the queries' expansion tokens, which are
no keys, run eagerly; documents through CUDA graphs, captured and replayed) and MaxSim, SPLADE weights,
bge-m3's three outputs and its first rows, a listwise ranker's marker vectors (eager: its rows are chosen
tokens), with every attention backend that runs here. Each is held to the reference package's own bf16 run
against its fp32, on the same inputs in the same test: posy's distance from fp32 within FLOOR_FACTOR of
the reference's (cosine, or weight error over the largest weight), or within the fixed tolerance (cosine
>= 0.999, weights within 2e-2)."""

import asyncio

import numpy as np
import pytest
import torch

from benchmarks.token_checkpoints import (
    TINY_HEAD_DIM_64,
    TINY_QWEN3,
    byte_level_tokenizer,
    colbert_checkpoints,
    listwise_checkpoint,
    m3_checkpoint,
    splade_checkpoint,
)
from benchmarks.token_outputs import (
    FLOOR_FACTOR,
    TOLERANCES,
    distance,
    min_row_cosine,
    score_error,
    weight_error,
)
from benchmarks.token_references import (
    colbert_ai_documents,
    colbert_ai_max_sim,
    colbert_ai_queries,
    flag_m3_rows,
    listwise_vectors,
    sparse_encoder_weights,
)
from engine.attention import select_backend
from engine.batch import pack
from engine.build import build_engine
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig
from engine.errors import AttentionBackendUnavailable
from engine.outputs import RowRequest
from engine.weights import load_model
from scoring.late_interaction import max_sim
from tests.engine.graph_runs import run_three_times
from tests.engine.test_colbert_parity import token_ids

pytestmark = pytest.mark.gpu

BACKENDS = ["torch", "torch-varlen", "triton", "flashinfer", "flash-attn"]
TEXTS = [[101, *range(2000, 2000 + n), 102] for n in (1, 7, 30, 61, 120)]


def cosines(got: np.ndarray, expected: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(got, axis=-1) * np.linalg.norm(expected, axis=-1)
    return (got * expected).sum(-1) / np.maximum(norms, 1e-12)


def bf16_floor(reference, sequences, measure, columns=slice(None)) -> float:
    """The reference package's own bf16 rows of `sequences` against its fp32 ones, on CUDA."""
    expected = reference(sequences, "cuda", torch.float32)[:, columns]
    return measure(reference(sequences, "cuda", torch.bfloat16)[:, columns], expected)


def assert_within_floor(metric: str, ours: float, floor: float) -> None:
    allowed = max(TOLERANCES[metric], FLOOR_FACTOR * distance(metric, floor))
    assert distance(metric, ours) <= allowed, f"{metric} {ours:.5f}; the reference's own bf16: {floor:.5f}"


def cpu_rows(spec, sequences):
    """The fp32 CPU model's rows, packed as its head declares (a ColBERT query's expansion: query-only)."""
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    with torch.inference_mode():
        return model(pack(sequences, output=model.output)).numpy()


def cuda_model(spec, backend):
    try:
        attention = select_backend(
            backend, "cuda", num_heads=2, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16
        )
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))
    return load_model(spec, "cuda", torch.bfloat16, attention)


# the checkpoints' random scale: the CPU parity tests' 0.2 makes even two tiny layers chaotic in bf16 (on the
# H200 one rounding choice or another moved SPLADE's largest weight error between 0.08 and 0.15, the
# reference's 0.06); near trained weights' scale bf16 is measured, not amplified, and a wrong row still fails
STD = 0.08


@pytest.fixture(scope="module")
def folders(minilm_path, tmp_path_factory):
    root, shape = tmp_path_factory.mktemp("token-gpu"), TINY_HEAD_DIM_64
    colbert_ai, pylate = colbert_checkpoints(minilm_path, root / "colbert", shape=shape, std=STD)
    listwise_shape = {**TINY_QWEN3, "head_dim": 64}
    return {
        "colbert-ai": colbert_ai,
        "colbert": pylate,
        "splade": splade_checkpoint(minilm_path, root / "splade", shape=shape, std=STD),
        "m3": m3_checkpoint(minilm_path, root / "m3", shape=shape, std=STD),
        "listwise": listwise_checkpoint(root / "listwise", shape=listwise_shape, std=STD),
    }


@pytest.fixture(scope="module")
def colbert_floor(folders):
    """colbert-ai's own bf16 against its fp32 (no autocast): the least cosine of its query and document
    vectors (the rows it gives one: its skiplist's are zeros)."""
    spec = resolve_model(str(folders["colbert"]))
    _, queries, documents = token_ids(spec)
    return min(
        bf16_floor(colbert_ai_queries(folders["colbert-ai"]), queries, min_row_cosine),
        bf16_floor(colbert_ai_documents(folders["colbert-ai"]), documents, min_row_cosine),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_colbert_on_cuda_gives_the_cpu_vectors(folders, colbert_floor, backend):
    spec = resolve_model(str(folders["colbert"]))
    _, queries, documents = token_ids(spec)
    model = cuda_model(spec, backend)
    expected = cpu_rows(spec, queries + documents)
    with torch.inference_mode():
        batch = pack(queries + documents, output=model.output)
        got = model(batch.to("cuda")).float().cpu().numpy()
    assert_within_floor("min_cosine", float(cosines(got, expected).min()), colbert_floor)


def test_colbert_documents_through_cuda_graphs(folders, colbert_floor):
    spec = resolve_model(str(folders["colbert"]))
    _, queries, documents = token_ids(spec)
    expected = cpu_rows(spec, documents)
    results, graphs = run_three_times(spec, EngineConfig(device="cuda", dtype="bfloat16"), [documents])
    assert graphs is not None and graphs.graphs
    for rows in results[0]:
        assert_within_floor("min_cosine", float(cosines(rows, expected).min()), colbert_floor)
    engine = build_engine(spec, EngineConfig(device="cuda", dtype="bfloat16"))
    try:
        rows = asyncio.run(engine.run(queries))  # expansion tokens: eager, with the query-only key layout
        # MaxSim on the device
        scores = asyncio.run(engine.run(documents, rows=RowRequest(prefix=queries[0])))
    finally:
        engine.stop()
    query_rows = cpu_rows(spec, queries)
    assert_within_floor("min_cosine", float(cosines(rows, query_rows).min()), colbert_floor)
    late, _, _ = token_ids(spec)
    parts = np.split(expected, np.cumsum([len(ids) for ids in documents])[:-1])
    kept = [late.kept(ids, part, is_query=False) for ids, part in zip(documents, parts)]
    expected_scores = max_sim(query_rows[: len(queries[0])], kept)
    floor = bf16_floor(colbert_ai_max_sim(folders["colbert-ai"], queries[0]), documents, score_error)
    assert_within_floor("max_score_error", score_error(scores[:, :1], expected_scores[:, None]), floor)


def test_splade_on_cuda_through_graphs_gives_the_cpu_weights(folders):
    spec = resolve_model(str(folders["splade"]))
    expected = cpu_rows(spec, TEXTS)
    floor = bf16_floor(sparse_encoder_weights(folders["splade"]), TEXTS, weight_error)
    results, graphs = run_three_times(spec, EngineConfig(device="cuda", dtype="bfloat16"), [TEXTS])
    assert graphs is not None and graphs.graphs
    for rows in results[0]:
        assert_within_floor("max_weight_error", weight_error(rows, expected), floor)


@pytest.fixture(scope="module")
def m3_floors(folders):
    """FlagEmbedding's own bf16 against its fp32: the least cosine of the vectors, the weights' error."""
    reference = flag_m3_rows(folders["m3"])
    cosine = bf16_floor(reference, TEXTS, min_row_cosine, slice(None, -1))
    return cosine, bf16_floor(reference, TEXTS, weight_error, -1)


def test_bge_m3_on_cuda_through_graphs_gives_the_cpu_outputs(folders, m3_floors):
    spec = resolve_model(str(folders["m3"]))
    expected = cpu_rows(spec, TEXTS)
    results, graphs = run_three_times(spec, EngineConfig(device="cuda", dtype="bfloat16"), [TEXTS])
    assert graphs is not None and graphs.graphs
    for rows in results[0]:
        assert_within_floor("min_cosine", float(cosines(rows[:, :-1], expected[:, :-1]).min()), m3_floors[0])
        assert_within_floor("max_weight_error", weight_error(rows[:, -1], expected[:, -1]), m3_floors[1])


def test_bge_m3_dense_requests_take_their_first_rows_through_cuda_graphs(folders, m3_floors):
    """first_rows (bge-m3's dense vectors): gathered after the graph, a row a text, as eager, captured
    and replayed."""
    spec = resolve_model(str(folders["m3"]))
    firsts = np.cumsum([0, *map(len, TEXTS[:-1])])
    expected = cpu_rows(spec, TEXTS)[firsts]
    engine = build_engine(spec, EngineConfig(device="cuda", dtype="bfloat16"))

    async def three_times():
        return [(await engine.enqueue(TEXTS, rows=RowRequest(first_rows=True))).rows for _ in range(3)]

    try:
        results = asyncio.run(three_times())
    finally:
        engine.stop()
    assert engine.runner.graphs is not None and engine.runner.graphs.graphs
    for rows in results:
        assert rows.shape == expected.shape
        cosine = float(cosines(rows[:, :-1], expected[:, :-1]).min())
        assert_within_floor("min_cosine", cosine, m3_floors[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_listwise_ranker_on_cuda_gives_the_cpu_marker_vectors(folders, backend):
    spec = resolve_model(str(folders["listwise"]))
    tokenizer = byte_level_tokenizer()
    text = "<|im_start|>user\n" + "".join(f"passage {n} cats eat fish<|embed_token|>\n" * n for n in (1, 3))
    prompts = [
        tokenizer.encode(text + "query<|rerank_token|>" * 1).ids,
        tokenizer.encode("a<|embed_token|>b<|rerank_token|>").ids,
    ]
    model = load_model(spec, "cpu", torch.float32, select_backend("torch", "cpu"))
    with torch.inference_mode():
        expected = model(pack(prompts, output=model.output)).numpy()
    floor = bf16_floor(listwise_vectors(folders["listwise"]), prompts, min_row_cosine)
    try:
        attention = select_backend(
            backend, "cuda", num_heads=4, num_kv_heads=2, head_dim=64, dtype=torch.bfloat16
        )
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))
    model = load_model(spec, "cuda", torch.bfloat16, attention)
    with torch.inference_mode():
        got = model(pack(prompts, output=model.output).to("cuda")).float().cpu().numpy()
    assert len(expected) == 7
    assert_within_floor("min_cosine", float(cosines(got, expected).min()), floor)
