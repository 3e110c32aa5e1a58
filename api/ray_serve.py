"""`posy serve --ray`: the posy app as a Ray Serve deployment, so that replicas run on many hosts behind
one endpoint. Each Serve replica is a whole posy server (the same routes, limits and errors) with one
in-process engine on its own GPU (or CPUs); Serve's proxy spreads requests over them and scales their
number between the given bounds. `app_builder` is the same for a Serve config file (`serve run`)."""

from __future__ import annotations

import dataclasses
import logging
import shlex
import signal
import threading
from typing import Any

from api.config import ServerConfig

logger = logging.getLogger(__name__)

APP_NAME = "posy"
# posy queues and refuses (429) by itself: Serve only keeps a replica from taking more than this at once
MAX_ONGOING_REQUESTS = 256
TARGET_ONGOING_REQUESTS = 32  # autoscaling adds a replica when each has more in flight than this


class PosyReplica:
    """One Serve replica: builds the posy app (its lifespan loads the engine) when the replica starts."""

    def __init__(self, config: ServerConfig):
        self.config = config

    def __serve_build_asgi_app__(self):
        from api.app import create_app

        return create_app(self.config)


def deployment(config: ServerConfig, min_replicas: int, max_replicas: int, gpus: bool):
    """The bound Serve application: `min_replicas` to `max_replicas` copies of the app, each on one GPU
    where `gpus`."""
    from ray import serve

    if not 1 <= min_replicas <= max_replicas:
        raise ValueError(f"need 1 <= min replicas ({min_replicas}) <= max replicas ({max_replicas})")
    # inside a replica: one engine in its own process on the one GPU Ray gave it, one gateway
    device = "cuda" if gpus and config.engine.device != "cpu" else config.engine.device
    replica_config = dataclasses.replace(
        config, replicas=1, api_workers=1, engine=dataclasses.replace(config.engine, device=device)
    )
    options: dict[str, Any] = {
        "name": APP_NAME,
        "max_ongoing_requests": MAX_ONGOING_REQUESTS,
        "ray_actor_options": {"num_gpus": 1} if gpus else {"num_cpus": 1},
    }
    if min_replicas == max_replicas:
        options["num_replicas"] = min_replicas
    else:
        options["autoscaling_config"] = {
            "min_replicas": min_replicas,
            "max_replicas": max_replicas,
            "target_ongoing_requests": TARGET_ONGOING_REQUESTS,
        }
    return serve.deployment(serve.ingress()(PosyReplica), **options).bind(replica_config)


def app_builder(args: dict[str, Any]):
    """For a Serve config file: `import_path: api.ray_serve:app_builder` with `args:` `flags` (posy serve's
    flags as one string), and optionally `min_replicas`, `max_replicas` and `gpus` (default: whether the
    cluster has any)."""
    import ray

    from api.cli import apply_environment, build_parser, config_from_args

    parser, serve_parser = build_parser()
    apply_environment(serve_parser, {})
    config = config_from_args(parser.parse_args(["serve", *shlex.split(args.get("flags", ""))]))
    gpus = bool(args["gpus"]) if "gpus" in args else ray.cluster_resources().get("GPU", 0) > 0
    minimum = int(args.get("min_replicas", 1))
    return deployment(config, minimum, int(args.get("max_replicas", minimum)), gpus)


def serve_on_ray(
    config: ServerConfig, address: str, min_replicas: int | None, max_replicas: int | None
) -> int:
    """Starts the app on the cluster at `address` ("auto": this machine's, else a new local one), serving
    HTTP on the config's host and port, until SIGINT or SIGTERM."""
    import ray
    from ray import serve

    ray.init(address=None if address == "auto" else address, logging_level=logging.WARNING)
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        use_gpus = gpus > 0 and config.engine.device != "cpu"
        minimum = min_replicas or (gpus if use_gpus else 1)
        application = deployment(config, minimum, max_replicas or minimum, use_gpus)
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(application, name=APP_NAME, route_prefix="/")
        logger.info(
            "posy serving on Ray at http://%s:%d: %s to %s replicas, each on %s",
            config.host, config.port, minimum, max_replicas or minimum, "a GPU" if use_gpus else "CPUs",
        )  # fmt: skip
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        stop.wait()
        serve.shutdown()
        return 0
    finally:
        ray.shutdown()
