"""run_three_times: each request through a fresh engine three times, one request at a time: the first
runs eagerly, the second captures its CUDA graph, the third replays it (the GPU tests' graph check)."""

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
