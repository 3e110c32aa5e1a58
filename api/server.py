"""Server: what the app's lifespan owns — config, metrics, the served models and readiness. It starts the
models' engines itself (in process, or as replica processes), or, in a gateway worker of `--api-workers`,
connects to replicas another process started (one ReplicaHandles per model)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from tokenizers import Tokenizer

from api.allocator import keep_freed_memory
from api.config import ServerConfig
from api.decode_turns import GatewayTurns
from api.errors import NotReady
from api.metrics import Metrics, replica_batch_observer
from api.models import ModelRegistry, ServedModel, listwise_model
from api.summary import startup_summary
from api.tokenize import TextEncoder
from api.tokenizer_pool import TokenizerPool
from engine.build import build_engine
from engine.checkpoint.source import ModelSource
from engine.checkpoint.spec import ModelSpec
from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import EngineError
from engine.interface import EngineInterface
from engine.replicas.replica_set import ReplicaHandles, ReplicaSet, replica_count
from scoring.late_interaction import LateInteraction
from scoring.templates import pair_prompt

logger = logging.getLogger(__name__)

BUNDLED_ALIAS = "all-MiniLM-L6-v2"


class Server:
    def __init__(
        self,
        config: ServerConfig,
        replicas: Sequence[ReplicaHandles] | None = None,
        decode_turns: GatewayTurns | None = None,
    ):
        """`replicas`: per model, the replicas to run on (started elsewhere); None: start the engines.
        `decode_turns`: a gateway's turns at the host's cores for its image decoding (api/decode_turns.py)."""
        self.config = config
        self._remote = replicas
        self._decode_turns = decode_turns
        self._following = threading.Event()  # set to stop following the remote replicas' liveness
        self.metrics = Metrics()
        self._registry: ModelRegistry | None = None
        self._specs: list[ModelSpec] | None = None
        self._replica_sets: list[ReplicaSet] = []
        self.draining = False
        self.engine_settings: EngineConfig | None = None  # what load() ran the engines with
        self.refusal: EngineError | None = None  # why load() refused to serve, where it did (api/app.py)
        self.started_at = int(time.time())

    @property
    def ready(self) -> bool:
        return self.unready_reason() is None

    def unready_reason(self) -> str | None:
        """Why /ready is a 503: loading, draining, or a model none of whose engine replicas runs (they are
        restarted); None when ready."""
        if self._registry is None:
            return "loading"
        if self.draining:
            return "draining"
        down = [model.name for model in self._registry.models if not model.engine.accepting]
        return f"no engine replica of {', '.join(down)} is running" if down else None

    def registry(self) -> ModelRegistry:
        if self.draining:
            raise NotReady("the server is shutting down", close=True)
        if self._registry is None:
            raise NotReady("the server is not ready")
        return self._registry

    def resolve(self) -> list[ModelSpec]:
        """Find every model's files and read its configs (fast; fails early on a bad --model)."""
        if self._specs is None:
            specs = [self._resolve_one(model) for model in self.config.models]
            self.engine_config(max(spec.max_seq_length for spec in specs))
            self._specs = specs
        return self._specs

    def load(self) -> None:
        """Load and warm up every model, then start their engines (blocking)."""
        specs = self.resolve()
        engine_config = self.engine_config(max(spec.max_seq_length for spec in specs))
        self.engine_settings = engine_config
        logger.info(
            "engine: device=%s dtype=%s max_batch_tokens=%d max_batch_seqs=%d max_queue_tokens=%d",
            engine_config.device,
            engine_config.dtype,
            engine_config.max_batch_tokens,
            engine_config.max_batch_seqs,
            engine_config.max_queue_tokens,
        )
        served = []
        num_replicas = self.num_replicas(engine_config.device)
        replica_sets = self.start_replicas() if self.runs_engines_apart(num_replicas) else None
        for index, spec in enumerate(specs):
            names = self.names(index, spec)
            if replica_sets is not None:
                engine = replica_sets[index].pool
            else:
                engine = self._engine_here(index, spec, engine_config, names[0])
            self.metrics.track_queue(names[0], lambda engine=engine: engine.queued_tokens)
            self.metrics.model_info.labels(model=names[0]).info(
                {
                    "architecture": spec.architecture,
                    "implementation": spec.implementation,
                    "task": spec.task,
                    "device": engine_config.device,
                    "dtype": engine_config.dtype,
                    **engine.describe(),
                    "gateways": str(self.config.api_workers),
                    "engine_process": str(self._remote is not None or not isinstance(engine, Engine)).lower(),
                }
            )
            encoder = TextEncoder(
                spec.tokenizer_path,
                spec.max_seq_length,
                spec.vocab_size,
                spec.pair_format,
                self.config.tokenizer_threads,
                spec.logit_score.chat_template if spec.logit_score is not None else None,
                spec.text_padding,
                spec.input_layout,
            )
            late = (
                LateInteraction.build(spec.colbert, encoder.single, encoder.content_ids)
                if spec.colbert is not None
                else None
            )
            image_pool = None
            if spec.images is not None:
                image_pool = TokenizerPool(self.config.image_threads, self._decode_turns)
                keep_freed_memory()  # its threads' buffers reused, not faulted in anew an image
            model = ServedModel(
                names=names,
                spec=spec,
                encoder=encoder,
                engine=engine,
                late_interaction=late,
                listwise=listwise_model(spec, encoder, engine),
                image_pool=image_pool,
            )
            served.append(model)
            self.metrics.admission.track(names[0], model)
            logger.info(
                "serving %s as %s (%s, window %d)",
                spec.path,
                ", ".join(names),
                spec.task,
                spec.max_seq_length,
            )
        self._registry = ModelRegistry(served)
        if self._remote is None:  # a gateway worker's supervisor says it once for all of them
            described = [(model.names, model.spec, model.engine.describe()) for model in served]
            logger.info("%s", startup_summary(self.config, engine_config, described, num_replicas))

    def admission_estimates(self) -> str:
        """What admission judges each model's work on now, in words (api/refusals.py)."""
        if self._registry is None:
            return "none yet"
        described = []
        for model in self._registry.models:
            engines = ", ".join(
                "not measured" if seconds is None else f"{seconds * 1e3:.4f} ms a token (margin {margin:.2f})"
                for seconds, margin in model.engine.rates()
            )
            pool = model.encoder.pool
            per_char = pool.seconds_per_char
            tokenizer = "not measured" if per_char is None else f"{per_char * 1e6:.3f} us a character"
            queued = f"{pool.queued_chars} characters queued"
            described.append(f"{model.name}: engine {engines}; tokenizer {tokenizer}, {queued}")
        return "; ".join(described)

    def stop(self) -> None:
        self.draining = True
        self._following.set()
        if self._registry is not None:
            for model in self._registry.models:
                model.engine.stop()
                model.encoder.close()
                if model.image_pool is not None:
                    model.image_pool.close()
        for replica_set in self._replica_sets:
            replica_set.stop()

    def num_replicas(self, device: str) -> int:
        return replica_count(self.config.replicas, device)

    def runs_engines_apart(self, num_replicas: int) -> bool:
        """Whether this server starts its models' engines as replica processes."""
        return self._remote is None and (num_replicas > 1 or self.config.engine_process)

    def start_replicas(self) -> list[ReplicaSet]:
        """Every model's engine replica processes, warm; this server stops them. All are spawned before any
        is waited for: their imports and loads overlap (one model at a time, the compat suite's server of
        many tiny models took 120 s to start on 2 cores, all at once 70)."""
        specs = self.resolve()
        engine_config = self.engine_config(max(spec.max_seq_length for spec in specs))
        num_replicas = self.num_replicas(engine_config.device)
        config = self.config
        for index, spec in enumerate(specs):
            replica_set = ReplicaSet(
                self.source(config.models[index]), num_replicas, engine_config, config.log_level,
                metrics_model=self.names(index, spec)[0], batch_observer=replica_batch_observer,
            )  # fmt: skip
            self._replica_sets.append(replica_set)
            replica_set.spawn()
        for replica_set in self._replica_sets:
            replica_set.wait_ready()
        return self._replica_sets

    def _engine_here(
        self, index: int, spec: ModelSpec, engine_config: EngineConfig, name: str
    ) -> EngineInterface:
        """The engine in this process, or, in a gateway worker, the replicas it was handed (the replica
        processes of a server that runs its engines apart start in load(), all at once)."""
        if self._remote is not None:
            handles = self._remote[index]
            pool = handles.pool()
            threading.Thread(
                target=handles.follow, args=(pool, self._following), name="posy-liveness", daemon=True
            ).start()
            return pool
        return build_engine(spec, engine_config, self.metrics.batch_observer(name))

    def source(self, model: str | None) -> ModelSource:
        """A --model as the server's flags read it."""
        return ModelSource(model, self.config.model_flags)

    def _resolve_one(self, model: str | None) -> ModelSpec:
        spec = self.source(model).resolve()
        if spec.logit_score is not None:  # a chat template that cannot lay out a pair fails here, early
            tokenizer = Tokenizer.from_file(str(spec.tokenizer_path))
            pair_prompt(spec.pair_format, tokenizer, spec.logit_score.chat_template)
        return spec

    def engine_config(self, max_window: int) -> EngineConfig:
        return self.config.engine.engine_config(max_window)

    def names(self, index: int, spec: ModelSpec) -> tuple[str, ...]:
        given = self.config.served_model_names
        if given and len(self.config.models) == 1:
            return tuple(name for names in given for name in names)
        if index < len(given):
            return given[index]
        if self.config.models[index] is None:
            return (spec.name, BUNDLED_ALIAS)
        return (spec.name,)
