"""GET /health (liveness), /ready (weights loaded, warm, not draining) and /metrics (Prometheus)."""

from __future__ import annotations

from litestar import Response, get
from litestar.di import NamedDependency

from api.errors import RESTART_RETRY_S, NotReady
from api.server import Server


@get("/health", sync_to_thread=False)
def health() -> dict[str, str]:
    """Liveness: 200 while the process runs."""
    return {"status": "ok"}


@get("/ready", sync_to_thread=False)
def ready(server: NamedDependency[Server]) -> dict[str, str]:
    """Readiness: 200 once the models are loaded and warm and an engine replica of each runs; 503 with
    Retry-After while loading, draining or restarting."""
    reason = server.unready_reason()
    if reason is not None:
        retry_after_s = RESTART_RETRY_S if reason.startswith("no engine") else 1
        raise NotReady(reason, retry_after_s, close=reason == "draining")
    return {"status": "ready"}


@get("/metrics", sync_to_thread=False)
def metrics(server: NamedDependency[Server]) -> Response[bytes]:
    """Prometheus metrics: requests, stages, batches, queues and the models' description."""
    return Response(content=server.metrics.render(), media_type=server.metrics.content_type)
