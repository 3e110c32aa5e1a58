"""`python -m benchmarks.profile`: where a BERT-base-shaped engine step spends its time on the GPU
(top kernels) and on the host (top operators), at batch 1 x 128 and at a full 16k-token batch."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np


def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.engine import random_sequences, save_random_bert
    from engine.batch import pack
    from engine.build import build_engine
    from engine.config import EngineConfig
    from engine.loader import resolve_model

    folder = Path(tempfile.mkdtemp())
    save_random_bert(folder)
    config = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=16384, max_queue_tokens=2**20)
    engine = build_engine(resolve_model(str(folder)), config)
    runner = engine.runner
    cases = {"batch1x128": random_sequences([128], 1), "full-50tok": random_sequences([50] * 327, 2)}
    try:
        for name, sequences in cases.items():
            for _ in range(4):
                runner.step(pack(sequences)).result()
            host = []
            for _ in range(50):
                start = time.perf_counter()
                batch = pack(sequences)
                packed = time.perf_counter()
                lazy = runner.step(batch)
                stepped = time.perf_counter()
                lazy.result()
                host.append((packed - start, stepped - packed, time.perf_counter() - stepped))
            pack_s, step_s, wait_s = (1000 * float(np.median(column)) for column in zip(*host))
            print(f"== {name}: pack {pack_s:.3f} ms, step (host) {step_s:.3f} ms, wait {wait_s:.3f} ms")
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as trace:
                for _ in range(5):
                    runner.step(pack(sequences)).result()
            table = trace.key_averages().table(
                sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=60
            )
            print(table)
    finally:
        engine.stop()


if __name__ == "__main__":
    main()
