"""run_three_times: each request through a fresh engine three times, one request at a time: the first
runs eagerly, the second captures its CUDA graph, the third replays it (the GPU tests' graph check); and
the encoders' GPU tests' fp32 reference and engine check built on it."""

import asyncio

from engine.build import build_engine


def run_three_times(spec, config, requests):
    """(the rows of each run of each request, the engine's GraphCache or None)."""
    engine = build_engine(spec, config)

    async def main():
        return [[await engine.run(request) for _ in range(3)] for request in requests]

    try:
        return asyncio.run(main()), engine.runner.graphs
    finally:
        engine.stop()


def mean_vectors_on_cuda(reference, batch):
    """An encoder's fp32 transformers reference on the GPU, one sequence at a time (no padding), mean-
    pooled and normalized -> [len(batch), hidden] on the host."""
    import torch
    import torch.nn.functional as F

    reference = reference.to("cuda")
    with torch.inference_mode():
        rows = [reference(input_ids=torch.tensor([ids], device="cuda")).last_hidden_state[0] for ids in batch]
    rows = [hidden.mean(0) for hidden in rows]
    return F.normalize(torch.stack(rows), dim=-1).cpu()


def assert_engine_gives(spec, expected, batch, tolerance=0.999):
    """Each sequence alone through the engine on CUDA in bf16 (CUDA graphs captured and replayed) gives the
    expected row, cosine >= tolerance, in every run."""
    import numpy as np

    from engine.config import EngineConfig

    config = EngineConfig(device="cuda", dtype="bfloat16")
    results, graphs = run_three_times(spec, config, [[ids] for ids in batch])
    assert graphs is not None and graphs.graphs, "no graph was captured"
    for row, runs in zip(np.asarray(expected), results):
        for rows in runs:
            assert float((rows[0] * row).sum() / np.linalg.norm(rows[0])) >= tolerance
