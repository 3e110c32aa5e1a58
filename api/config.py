"""ServerConfig: what `posy serve` was asked for, resolved once at start-up."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from api.images import ImageLimits
from engine.checkpoint.source import ModelFlags

if TYPE_CHECKING:
    from engine.config import EngineConfig

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_INPUTS = 2048
MAX_DOCUMENTS = 1000
# tokens one request may send to the model after tokenization (rerank: all the pairs it scores);
# 2048 inputs of 512 tokens, as many as the default GPU queue holds (64 x 16384)
MAX_REQUEST_TOKENS = 1024 * 1024
# the floats of token vectors one response holds (64 MiB as float32; as JSON lists, about 0.5 GB of
# Python floats while it is encoded): at MAX_REQUEST_TOKENS, bge-m3's 1,024-wide token vectors would be
# a billion, some 30 GB
MAX_TOKEN_OUTPUT_FLOATS = 1 << 24
# the floats of the engine rows behind one /embed_sparse request (256 MiB as float32): a SPLADE model's
# rows are its vocabulary's weights, a text each (250,002 of them for an XLM-R vocabulary: 2 GB at 2,048
# texts), bge-m3's a token each
MAX_SPARSE_ROWS_FLOATS = 1 << 26
REQUEST_TIMEOUT_S = 60.0
# a request's head must arrive within HEADER_TIMEOUT_S of its connection's accept (or of its first byte,
# on a kept-alive connection), its body within BODY_TIMEOUT_S of its head's end: 8 MiB at 280 kB/s
HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_CHUNKS_PER_DOC = 10
DEFAULT_MAX_TOKENS_PER_DOC = 4096


DRAIN_GRACE_S = 5.0
SHUTDOWN_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class EngineFlags:
    """The engine flags `posy serve` and `posy embed` share."""

    device: str = "auto"
    dtype: str = "auto"
    attention_backend: str = "auto"
    cuda_graphs: str = "lazy"
    quantization: str = "none"  # EngineConfig's
    # None: the device's default, raised to the largest model window
    max_batch_tokens: int | None = None
    max_batch_seqs: int = 512
    max_queue_tokens: int | None = None
    # a causal judge's pairs run their shared prefix once a batch where that pays (EngineConfig's)
    shared_prefixes: bool = True

    def engine_config(self, max_window: int) -> EngineConfig:
        """The engine config these flags ask for, with device and dtype resolved, for models whose largest
        window is `max_window`."""
        from engine.config import sized_for
        from engine.device import resolve_device, resolve_dtype

        device = resolve_device(self.device)
        config = sized_for(
            max_window, device, resolve_dtype(self.dtype, device), self.attention_backend, self.cuda_graphs,
            self.max_batch_tokens, self.max_batch_seqs, self.max_queue_tokens, self.quantization,
        )  # fmt: skip
        return replace(config, shared_prefixes=self.shared_prefixes)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    # model paths or hub ids; None is the bundled all-MiniLM-L6-v2
    models: tuple[str | None, ...] = (None,)
    # names per model (aliases); empty: the path or hub id as given
    served_model_names: tuple[tuple[str, ...], ...] = ()
    host: str = "127.0.0.1"
    port: int = 8000
    engine: EngineFlags = EngineFlags()
    # how every model is read (--bidirectional, --max-model-len, --model-impl, --trust-remote-code, --pooling)
    model_flags: ModelFlags = ModelFlags()
    # engine replicas per model: one runs in the server process, more run as worker processes the
    # gateway splits requests over; None: one per visible GPU, one on CPU
    replicas: int | None = None
    # gateway processes sharing the port (JSON and tokenization on several cores); above 1 the engines
    # always run as replica processes, which hold the queue limits for all gateways. `posy serve` picks
    # both from the host unless told (api/layout.py)
    api_workers: int = 1
    # the engine runs in a process of its own even with one gateway and one replica
    engine_process: bool = False
    # threads a gateway splits a large request's tokenization over (its share of the cores)
    tokenizer_threads: int = 2
    # threads a gateway decodes a request's images on, for a model that takes images
    image_threads: int = 2
    auto_truncate: bool = False
    # OpenAI token-id inputs are the served model's own ids only where this is set: the OpenAI ecosystem's
    # clients (LangChain's OpenAIEmbeddings by default) send tiktoken's, which would embed other text
    accept_token_ids: bool = False
    # what images a request may send (--max-image-pixels, --allow-image-urls)
    images: ImageLimits = ImageLimits()
    api_key: str | None = None
    max_inputs: int = MAX_INPUTS
    max_body_bytes: int = MAX_BODY_BYTES
    max_documents: int = MAX_DOCUMENTS
    max_request_tokens: int = MAX_REQUEST_TOKENS
    # seconds from a request's arrival after which one still waiting on the model gets a 504; 0: never
    request_timeout: float = REQUEST_TIMEOUT_S
    # seconds for a request's head and for its body to arrive whole, else a 408 (api/connection_limits.py);
    # 0: no limit
    header_timeout: float = HEADER_TIMEOUT_S
    body_timeout: float = BODY_TIMEOUT_S
    # connections a gateway process holds open at once; past it a new one's request gets a 503. None: half
    # the process's open-file limit
    max_connections: int | None = None
    log_level: str = "info"
    # SIGTERM: seconds of 503 before the listener closes, then seconds for admitted work to finish
    drain_grace: float = DRAIN_GRACE_S
    shutdown_timeout: float = SHUTDOWN_TIMEOUT_S
