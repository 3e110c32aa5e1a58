"""The start-up summary names the URL, each model and how it runs, the batch shape and the limits."""

import dataclasses

from api.config import ServerConfig
from api.summary import startup_summary
from engine.checkpoint.resolve import resolve_model
from engine.config import EngineConfig


def test_the_summary_says_what_is_served_how_and_within_which_limits():
    spec = resolve_model(None)
    config = ServerConfig(port=9123, api_key="k", api_workers=2, request_timeout=30)
    engine = EngineConfig(device="cuda", dtype="bfloat16", max_batch_tokens=16384, max_queue_tokens=1048576)
    description = {"attention_backend": "triton", "cuda_graphs": "lazy", "replicas": "2"}
    text = startup_summary(config, engine, [(("minilm", "alias"), spec, description)], 2)
    assert "http://127.0.0.1:9123 (API key required)" in text
    assert "as minilm, alias: BertModel" in text and "384 dimensions (mean pooling, normalized)" in text
    assert "window 256" in text
    assert "CUDA graphs lazy, 2 replicas in processes of their own, 2 gateway processes" in text
    assert "up to 16384 tokens" in text and "by 64 up to 1024, then by 256 up to 16384" in text
    assert "1048576 queued tokens per replica" in text and "2048 inputs" in text and "30 s timeout" in text
    cpu = dataclasses.replace(engine, device="cpu", dtype="float32", cuda_graphs="off")
    plain = startup_summary(ServerConfig(), cpu, [((), spec, {"attention_backend": "torch"})], 1)
    assert "(no API key)" in plain and "1 replica, 1 gateway process" in plain and "buckets" not in plain
