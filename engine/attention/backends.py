"""Attention backends by name, `select_backend` (chosen once at start-up, with its reason) and the one
entry point, `varlen_attention`.

How "auto" chooses: the first backend in its row of AUTO_ORDER that imports, runs on the device and fits
the model (heads, head dim, dtype, window; see each backend's `check`):

    device  CUDA graphs  order                                 why
    cpu     either       torch                                 the only CPU path
    cuda    on           triton, flash-attn, flashinfer,       graph-safe, fastest first: triton's packed
                         torch-varlen, torch                   kernel runs batches of sequences up to 128
                                                               tokens and hands longer ones to the first
                                                               of flashinfer (FA3), flash-attn (FA4) and
                                                               torch-varlen (FA2) that fits; if none
                                                               fits, graphs go off
    cuda    off          flashinfer, flash-attn, triton,       flashinfer's host plan (0.1-1 ms a batch)
                         torch-varlen, torch                   hides behind the overlap of batches

Measured on the H200 (bf16, per layer, CUDA-graph replays): FA3 against FA4 on Qwen3-0.6B's heads, 142
against 122 us on one causal text of 4096 tokens but 174 against 206 on 50 x 512; both far ahead of FA2
(359 and 578, its key/value heads repeated first). FA4 won only the first, by 14%, so it follows FA3.
torch, the reference, is always last. flashinfer fits head dims 64/128/256 in bf16/fp16 only, and as a
candidate (auto, or triton's long sequences) only where its kernels need no compiling (prebuilt or in its
JIT cache): a first request must not wait minutes for one; asked for by name, it compiles them. Without
the model's head_dim and dtype, auto passes over every backend that has limits on them. A model with a
relative position bias (MPNet) runs where one is added to the scores: triton (every length) or torch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.attention.base import AttentionBackend, Window
from engine.attention.flash_attn_backend import flash_attn_backend
from engine.attention.flashinfer_backend import flashinfer_backend
from engine.attention.metadata import AttentionMetadata
from engine.attention.position_bias import PositionBias
from engine.attention.torch_backend import TorchAttention
from engine.attention.torch_varlen import torch_varlen_backend
from engine.attention.triton_backend import triton_backend
from engine.errors import AttentionBackendUnavailable


def _torch_backend(device: torch.device) -> AttentionBackend:
    return TorchAttention()


# name -> factory; a factory raises AttentionBackendUnavailable when its backend cannot run on the device
# (a heavy import such as flashinfer happens in the factory, at start-up, never at import)
BACKENDS: dict[str, Callable[[torch.device], AttentionBackend]] = {
    "torch": _torch_backend,
    "torch-varlen": torch_varlen_backend,
    "flashinfer": flashinfer_backend,
    "flash-attn": flash_attn_backend,
    "triton": triton_backend,
}

# (device type, CUDA graphs on) -> the order "auto" tries; the table in the module docstring says why
AUTO_ORDER: dict[tuple[str, bool], tuple[str, ...]] = {
    ("cpu", False): ("torch",),
    ("cpu", True): ("torch",),
    ("cuda", True): ("triton", "flash-attn", "flashinfer", "torch-varlen", "torch"),
    ("cuda", False): ("flashinfer", "flash-attn", "triton", "torch-varlen", "torch"),
}
_AUTO_RULES = {
    ("cpu", False): "CPU: torch",
    ("cuda", True): "CUDA with graphs: graph-safe backends, fastest first",
    ("cuda", False): "CUDA without graphs: flashinfer first, its host plan hidden by batch overlap",
}


def select_backend(
    name: str,
    device: torch.device | str,
    *,
    num_heads: int | None = None,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
    dtype: torch.dtype | None = None,
    window: Window | None = None,
    position_bias: bool = False,
    graphs: bool = False,
) -> AttentionBackend:
    """The backend `name` ("auto" or a key of BACKENDS) for a model of this shape, its `reason` set.

    A shape argument left out is not checked, but "auto" then passes over every backend with head-dim or
    dtype limits (without the shape it gives torch, as before). `window` is the normalized (left, right)
    window, as `normalize_window` gives it. `position_bias`: the model adds a PositionBias to its scores.
    `graphs` says whether the engine wants CUDA graphs; it steers "auto" only.
    """
    device = torch.device(device)
    shape = {
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "head_dim": head_dim,
        "dtype": dtype,
        "window": window,
        "position_bias": position_bias,
    }
    graphs = graphs and device.type == "cuda"
    if name == "auto":
        passed_over = []
        for candidate in AUTO_ORDER.get((device.type, graphs), ("torch",)):
            try:
                backend = _build(candidate, device, shape)
                _check_shape_given(backend, head_dim, dtype)
            except AttentionBackendUnavailable as error:
                passed_over.append(f"{candidate} ({error})")
                continue
            reason = f"auto ({_AUTO_RULES.get((device.type, graphs), device.type + ': torch')})"
            if passed_over:
                reason += "; passed over " + ", ".join(passed_over)
            backend.reason = reason + _graphs_note(backend, graphs)
            return backend
        raise AttentionBackendUnavailable(f"no attention backend runs on {device}: {', '.join(passed_over)}")
    if name not in BACKENDS:
        known = ", ".join(["auto", *BACKENDS])
        raise AttentionBackendUnavailable(f"unknown attention backend {name!r}; known: {known}")
    try:
        backend = _build(name, device, shape, asked_for=True)
    except AttentionBackendUnavailable as error:
        raise AttentionBackendUnavailable(
            f"attention backend {name!r} cannot run on {device}: {error}"
        ) from error
    backend.reason = "asked for" + _graphs_note(backend, graphs)
    return backend


def for_head_dim(backend: AttentionBackend, head_dim: int) -> AttentionBackend:
    """The backend for a second model inside the model whose heads are of `head_dim` (a vision tower's:
    Qwen2-VL-2B's 80, SigLIP-so400m's 72, which FlashInfer lacks): `backend` where it runs them; else,
    `backend` being a CUDA one of a bf16 or fp16 model (only those have head-dim limits), torch's
    FlashAttention 2 (torch-varlen: one kernel a batch) where it runs them; else torch's, which takes any
    size on any device (a kernel and a copy for each run of equal lengths)."""
    if backend.runs_head_dim(head_dim):
        return backend
    if backend.dtypes is not None:
        try:
            varlen = _build("torch-varlen", torch.device("cuda"), {"head_dim": head_dim})
        except AttentionBackendUnavailable:
            pass
        else:
            if backend.dtypes <= varlen.dtypes:
                return varlen
    return select_backend("torch", "cpu")


def _build(name: str, device: torch.device, shape: dict, asked_for: bool = False) -> AttentionBackend:
    backend = BACKENDS[name](device)
    backend.asked_for = asked_for
    backend.check(**shape)
    return backend


def _check_shape_given(backend: AttentionBackend, head_dim: int | None, dtype: torch.dtype | None) -> None:
    """auto picks a backend with limits only when it knows the model fits them."""
    if (backend.head_dims is not None and head_dim is None) or (backend.dtypes is not None and dtype is None):
        raise AttentionBackendUnavailable("auto needs the model's head_dim and dtype to choose it")


def _graphs_note(backend: AttentionBackend, graphs: bool) -> str:
    return "; not graph-safe, so CUDA graphs stay off" if graphs and not backend.graph_safe else ""


def normalize_window(window: int | tuple[int, int] | None, causal: bool) -> Window | None:
    """An int is the left window; (left, right) counts keys on each side, -1 unbounded; None is no window."""
    if window is None:
        return None
    left, right = (window, -1) if isinstance(window, int) else window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    return (left, right)


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    meta: AttentionMetadata,
    *,
    backend: AttentionBackend,
    causal: bool = False,
    window: int | tuple[int, int] | None = None,
    scale: float | None = None,
    bias: PositionBias | None = None,
) -> torch.Tensor:
    # q [num_tokens, num_heads, head_dim], k/v [num_tokens, num_kv_heads, head_dim] -> like q; `scale`
    # multiplies the scores before softmax (None: 1 / sqrt(head_dim); Gemma3: query_pre_attn_scalar ** -0.5)
    if q.shape[1] % k.shape[1] != 0 or k.shape != v.shape:
        raise ValueError(f"bad attention shapes: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    window = normalize_window(window, causal)
    if meta.keys is not None:  # sequences that continue shared prefixes: each one's keys gathered
        if not backend.reads_key_layout or bias is not None:
            raise ValueError(f"attention backend {backend.name} cannot run shared prefixes")
        k, v = k.index_select(0, meta.keys.index), v.index_select(0, meta.keys.index)
    if bias is None:
        return backend.forward(q, k, v, meta, causal, window, scale)
    if not backend.adds_position_bias:  # select_backend never picks one for such a model
        raise ValueError(f"attention backend {backend.name} cannot add a position bias")
    return backend.forward(q, k, v, meta, causal, window, scale, bias)
