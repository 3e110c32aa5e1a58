"""EngineConfig: every limit of the runtime in one place, each documented."""

from __future__ import annotations

from dataclasses import dataclass

# --model-impl: "auto" packs what posy has a family for and runs anything else through transformers
MODEL_IMPLS = ("auto", "posy", "transformers")

GPU_MAX_BATCH_TOKENS = 16384
CPU_MAX_BATCH_TOKENS = 4096
QUEUE_BATCHES = 64
CUDA_GRAPH_MODES = ("off", "lazy", "eager-warmup")
QUANTIZATIONS = ("none", "fp8")  # --quantization (engine/layers/fp8.py)
# token buckets: multiples of SMALL_TOKEN_STEP up to SMALL_TOKEN_LIMIT, then of LARGE_TOKEN_STEP
SMALL_TOKEN_STEP = 64
SMALL_TOKEN_LIMIT = 1024
LARGE_TOKEN_STEP = 256
# sequence-length buckets of a graph: powers of two from MIN_SEQLEN_BUCKET; the padding tail is cut
# into dummy sequences no longer than the bucket, at most LARGE_TOKEN_STEP // MIN_SEQLEN_BUCKET of them
MIN_SEQLEN_BUCKET = 64
MAX_DUMMY_SEQS = LARGE_TOKEN_STEP // MIN_SEQLEN_BUCKET
SLOT_STEP = 64


@dataclass(frozen=True, slots=True)
class EngineConfig:
    # "cpu" or "cuda[:N]"; the CLI resolves "auto" before building this.
    device: str = "cpu"
    # "float32", "bfloat16" or "float16"; CPU runs float32.
    dtype: str = "float32"
    # attention backend name, resolved once at start-up (see engine/attention).
    attention_backend: str = "auto"
    # tokens one forward pass may hold; never below the largest model window.
    max_batch_tokens: int = CPU_MAX_BATCH_TOKENS
    # sequences one forward pass may hold.
    max_batch_seqs: int = 512
    # tokens waiting in the queue before new work is refused with Overloaded (429).
    max_queue_tokens: int = QUEUE_BATCHES * CPU_MAX_BATCH_TOKENS
    # whole-model CUDA graphs: "off"; "lazy" (a bucket's first hit runs eagerly, its second
    # captures, later hits replay); "eager-warmup" (capture every bucket at start-up, largest first)
    cuda_graphs: str = "lazy"
    # a causal scorer's pairs run the prefix they share (template head and query) once a batch, where the
    # measured rule of engine/prefixes.py says it pays; False: always as whole pairs
    shared_prefixes: bool = True
    # "fp8": the backbone's projections in FP8 (engine/layers/fp8.py); "none": the model dtype throughout
    quantization: str = "none"
    # with "fp8": the rows from which a projection's input runs in FP8; None: from where it is faster, as
    # measured per shape at start-up on CUDA (engine/layers/fp8_choice.py); always on the CPU
    fp8_min_rows: int | None = None

    def check(self, max_window: int) -> None:
        if self.max_batch_tokens < max_window:
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) must be at least the largest model "
                f"window ({max_window})"
            )
        if self.max_batch_seqs < 1:
            raise ValueError("max_batch_seqs must be at least 1")
        if self.max_queue_tokens < self.max_batch_tokens:
            raise ValueError("max_queue_tokens must be at least max_batch_tokens")
        if self.cuda_graphs not in CUDA_GRAPH_MODES:
            raise ValueError(f"cuda_graphs must be one of {', '.join(CUDA_GRAPH_MODES)}")
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}")

    @property
    def uses_cuda_graphs(self) -> bool:
        return self.device.startswith("cuda") and self.cuda_graphs != "off"

    def token_bucket(self, num_tokens: int) -> int | None:
        """The graph size for a batch of `num_tokens` (a batch exactly on a bucket needs no padding);
        None above the largest bucket, which runs eagerly."""
        step = SMALL_TOKEN_STEP if num_tokens <= SMALL_TOKEN_LIMIT else LARGE_TOKEN_STEP
        bucket = -(-num_tokens // step) * step
        largest = -(-self.max_batch_tokens // LARGE_TOKEN_STEP) * LARGE_TOKEN_STEP
        return bucket if bucket <= largest else None

    @staticmethod
    def key_bucket(num_keys: int) -> int:
        """The gathered keys a graph of shared-prefix batches holds (every sequence's prefix and own keys,
        the dummies' own): rounded as token buckets are, with no largest (an index entry costs its gather
        only)."""
        step = SMALL_TOKEN_STEP if num_keys <= SMALL_TOKEN_LIMIT else LARGE_TOKEN_STEP
        return -(-num_keys // step) * step

    def sequence_bucket(self, num_slots: int, token_bucket: int) -> int:
        """Sequence slots of a graph for `num_slots` real and dummy sequences: a power of two up to
        SLOT_STEP, then a multiple of it (each empty slot still costs attention a thread block per
        head), at most what a batch of that many tokens can hold plus the dummies."""
        if num_slots <= SLOT_STEP:
            slots = 1 << (num_slots - 1).bit_length()
        else:
            slots = -(-num_slots // SLOT_STEP) * SLOT_STEP
        return min(slots, min(token_bucket, self.max_batch_seqs) + MAX_DUMMY_SEQS)

    @staticmethod
    def seqlen_bucket(max_seqlen: int, largest: int) -> int:
        """The longest sequence a graph is built for: a power of two, at least MIN_SEQLEN_BUCKET.
        Attention kernels size their grids by it, so short inputs get small grids."""
        return min(max(MIN_SEQLEN_BUCKET, 1 << (max_seqlen - 1).bit_length()), largest)

    def token_buckets(self) -> list[int]:
        """Every token bucket, largest first (the capture order of eager-warmup)."""
        buckets = {self.token_bucket(n) for n in range(1, self.max_batch_tokens + 1, SMALL_TOKEN_STEP // 2)}
        buckets.add(self.token_bucket(self.max_batch_tokens))
        return sorted((bucket for bucket in buckets if bucket is not None), reverse=True)


def default_max_batch_tokens(device: str) -> int:
    return GPU_MAX_BATCH_TOKENS if device.startswith("cuda") else CPU_MAX_BATCH_TOKENS


def sized_for(
    max_window: int,
    device: str,
    dtype: str,
    attention_backend: str = "auto",
    cuda_graphs: str = "lazy",
    max_batch_tokens: int | None = None,
    max_batch_seqs: int = 512,
    max_queue_tokens: int | None = None,
    quantization: str = "none",
) -> EngineConfig:
    """The engine config of `posy serve` and `posy embed` for models whose largest window is `max_window`
    (device and dtype resolved): by default a batch holds at least one sequence of that window (Qwen3's
    reach 32k) and the queue QUEUE_BATCHES batches. Fails on a batch budget below the window."""
    max_batch_tokens = max_batch_tokens or max(default_max_batch_tokens(device), max_window)
    config = EngineConfig(
        device=device,
        dtype=dtype,
        attention_backend=attention_backend,
        cuda_graphs=cuda_graphs,
        max_batch_tokens=max_batch_tokens,
        max_batch_seqs=max_batch_seqs,
        max_queue_tokens=max_queue_tokens or QUEUE_BATCHES * max_batch_tokens,
        quantization=quantization,
    )
    config.check(max_window)
    return config
