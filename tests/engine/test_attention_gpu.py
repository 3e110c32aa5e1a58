"""Every CUDA attention backend against the torch reference, run in fp32 on the same bf16 inputs, over
ragged batches of 1 to 2048 tokens: per-sequence relative error (norm of the difference / norm of the
reference) <= 1e-2, no NaN or inf, no row left unwritten. The graph-safe backends also with max_seqlen as
an upper bound, with zero-length sequences in cu_seqlens, and replayed from a CUDA graph (handed each
run's host lengths first, `prepare`, as the graph cache does)."""

import os

import pytest
import torch

from engine.attention import AttentionMetadata, normalize_window, select_backend, varlen_attention
from engine.attention.torch_backend import TorchAttention
from engine.errors import AttentionBackendUnavailable

pytestmark = pytest.mark.gpu

# "triton-packed": the triton backend with its packed kernel on every batch, long sequences included
CUDA_BACKENDS = ["torch-varlen", "flashinfer", "flash-attn", "triton", "triton-packed"]
GRAPH_SAFE = ["torch-varlen", "flashinfer", "flash-attn", "triton", "triton-packed"]
TOLERANCE = 1e-2
DTYPE = torch.bfloat16
HEADS = [(8, 8), (8, 2)]  # (query heads, key/value heads): plain and grouped-query attention


@pytest.fixture(autouse=True, scope="module")
def no_flashinfer_jit():
    """A flashinfer kernel that is not prebuilt must fail (and skip) at once, never compile for minutes."""
    before = os.environ.get("FLASHINFER_DISABLE_JIT")
    os.environ["FLASHINFER_DISABLE_JIT"] = before or "1"
    yield
    if before is None:
        del os.environ["FLASHINFER_DISABLE_JIT"]


def backend_for(name, num_heads, num_kv_heads, head_dim, causal=False, window=None):
    if name == "triton-packed":
        backend = backend_for("triton", num_heads, num_kv_heads, head_dim, causal, window)
        backend.long_sequences = None
        return backend
    try:
        return select_backend(
            name,
            "cuda",
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            dtype=DTYPE,
            window=normalize_window(window, causal),
        )
    except AttentionBackendUnavailable as error:
        pytest.skip(str(error))


def ragged_lengths(seed, count=12):
    """A 1-token and a 2048-token sequence and random lengths between, shuffled."""
    generator = torch.Generator().manual_seed(seed)
    lengths = [1, 2048, *torch.randint(2, 2048, (count - 2,), generator=generator).tolist()]
    return [lengths[i] for i in torch.randperm(count, generator=generator).tolist()]


def split(num_tokens, num_seqs, seed):
    """num_seqs positive lengths that add up to num_tokens."""
    generator = torch.Generator().manual_seed(seed)
    cuts = (torch.randperm(num_tokens - 1, generator=generator)[: num_seqs - 1] + 1).sort().values.tolist()
    bounds = [0, *cuts, num_tokens]
    return [end - start for start, end in zip(bounds, bounds[1:])]


def cumulative(lengths):
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def exact_meta(lengths):
    return AttentionMetadata.build(cumulative(lengths), max(lengths)).to("cuda")


def segments_of(cu_seqlens):
    """[num_tokens] int64 on the device: the slot each token belongs to (empty slots own none)."""
    cu_seqlens = cu_seqlens.cpu().long()
    slots = torch.arange(cu_seqlens.shape[0] - 1)
    return torch.repeat_interleave(slots, cu_seqlens.diff()).to("cuda")


def device_meta(cu_seqlens, max_seqlen, num_tokens, backend):
    """Metadata as a CUDA graph holds it: cu_seqlens and segment ids on the device, max_seqlen an upper
    bound, no host lengths (a backend that read them would see only zeros); `backend` is handed the
    lengths through `prepare`, as before a graph runs."""
    cu_seqlens = cu_seqlens.to("cuda")  # the same tensor when it is there already
    num_slots = cu_seqlens.shape[0] - 1
    segment_ids = segments_of(cu_seqlens)
    assert segment_ids.shape[0] == num_tokens
    meta = AttentionMetadata(
        cu_seqlens=cu_seqlens,
        max_seqlen=max_seqlen,
        seqlens=(0,) * num_slots,
        runs=(),
        segment_ids=segment_ids,
        lengths=torch.zeros(num_slots, dtype=torch.int64, device="cuda"),
    )
    backend.prepare(meta, cu_seqlens.cpu())
    return meta


def random_qkv(num_tokens, num_heads, num_kv_heads, head_dim, seed=0):
    generator = torch.Generator(device="cuda").manual_seed(seed)

    def randn(heads):
        return torch.randn(num_tokens, heads, head_dim, generator=generator, device="cuda", dtype=DTYPE)

    return randn(num_heads), randn(num_kv_heads), randn(num_kv_heads)


def reference(q, k, v, lengths, causal=False, window=None):
    window = normalize_window(window, causal)
    return TorchAttention().forward(q.float(), k.float(), v.float(), exact_meta(lengths), causal, window)


def run(backend, q, k, v, meta, causal=False, window=None):
    # best effort: free a NaN-filled block of the output's size first, so that the caching allocator likely
    # hands it to the output and a row the backend never writes reads NaN rather than stale numbers
    torch.full((q.numel(),), float("nan"), dtype=DTYPE, device="cuda")
    return varlen_attention(q, k, v, meta, backend=backend, causal=causal, window=window)


def assert_matches(out, expected, lengths):
    """Per sequence: relative error <= TOLERANCE; and no NaN, inf or all-zero row anywhere."""
    assert out.shape == expected.shape, (tuple(out.shape), tuple(expected.shape))
    out = out.float()
    assert torch.isfinite(out).all(), "NaN or inf in the output"
    unwritten = out.abs().amax(dim=(1, 2)) == 0
    assert not unwritten.any(), f"{int(unwritten.sum())} output rows are all zero"
    errors, start = [], 0
    for length in lengths:
        end = start + length
        errors.append((out[start:end] - expected[start:end]).norm() / expected[start:end].norm())
        start = end
    errors = torch.stack(errors).cpu()
    worst = int(errors.argmax())
    assert errors[worst] <= TOLERANCE, (
        f"sequence {worst} of {len(lengths)} ({lengths[worst]} tokens): relative error "
        f"{float(errors[worst]):.2e} > {TOLERANCE}"
    )


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_matches_reference(name, head_dim, causal, num_heads, num_kv_heads):
    backend = backend_for(name, num_heads, num_kv_heads, head_dim, causal)
    lengths = ragged_lengths(seed=head_dim + causal)
    q, k, v = random_qkv(sum(lengths), num_heads, num_kv_heads, head_dim)
    out = run(backend, q, k, v, exact_meta(lengths), causal)
    assert out.dtype == DTYPE
    assert_matches(out, reference(q, k, v, lengths, causal), lengths)


@pytest.mark.parametrize(("num_heads", "num_kv_heads"), HEADS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_short_sequences_match_reference(name, head_dim, causal, num_heads, num_kv_heads):
    """Many sequences of 1 to 64 tokens: the packed kernel's tiles then span several of them."""
    backend = backend_for(name, num_heads, num_kv_heads, head_dim, causal)
    generator = torch.Generator().manual_seed(head_dim + causal + num_kv_heads)
    lengths = torch.randint(1, 65, (150,), generator=generator).tolist()
    q, k, v = random_qkv(sum(lengths), num_heads, num_kv_heads, head_dim, seed=head_dim)
    out = run(backend, q, k, v, exact_meta(lengths), causal)
    assert_matches(out, reference(q, k, v, lengths, causal), lengths)


@pytest.mark.parametrize(("causal", "window"), [(True, 64), (False, (32, 16)), (False, 100)])
@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_windows(name, causal, window):
    backend = backend_for(name, 8, 2, 64, causal, window)
    lengths = ragged_lengths(seed=3, count=6)
    q, k, v = random_qkv(sum(lengths), 8, 2, 64, seed=3)
    out = run(backend, q, k, v, exact_meta(lengths), causal, window)
    assert_matches(out, reference(q, k, v, lengths, causal, window), lengths)


@pytest.mark.parametrize("name", CUDA_BACKENDS)
def test_strided_views_of_a_fused_qkv(name):
    """BERT's layout: q, k and v are views into one [num_tokens, 3, heads, head_dim] projection."""
    backend = backend_for(name, 8, 8, 64)
    lengths = ragged_lengths(seed=4, count=6)
    generator = torch.Generator(device="cuda").manual_seed(4)
    qkv = torch.randn(sum(lengths), 3 * 8 * 64, generator=generator, device="cuda", dtype=DTYPE)
    q, k, v = qkv.view(-1, 3, 8, 64).unbind(1)
    out = run(backend, q, k, v, exact_meta(lengths))
    assert_matches(out, reference(q, k, v, lengths), lengths)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", GRAPH_SAFE)
def test_upper_bound_and_zero_length_sequences(name, causal):
    backend = backend_for(name, 8, 2, 64, causal)
    lengths = ragged_lengths(seed=5, count=8)
    num_tokens = sum(lengths)
    q, k, v = random_qkv(num_tokens, 8, 2, 64, seed=5)
    exact = run(backend, q, k, v, exact_meta(lengths), causal)
    assert_matches(exact, reference(q, k, v, lengths, causal), lengths)

    bounded = run(backend, q, k, v, device_meta(cumulative(lengths), 4096, num_tokens, backend), causal)
    assert_matches(bounded, exact.float(), lengths)

    # zero-length slots (equal consecutive cu_seqlens) first, in the middle, twice, and last
    padded = [0, *lengths[:3], 0, 0, *lengths[3:], 0]
    out = run(backend, q, k, v, device_meta(cumulative(padded), 4096, num_tokens, backend), causal)
    assert_matches(out, exact.float(), lengths)


@pytest.mark.parametrize("name", GRAPH_SAFE)
def test_one_token_sequences_between_zero_length_slots(name):
    """max_seqlen 1 with grouped-query heads and empty slots: FlashAttention's one-token GQA shortcut
    assumes a token in every sequence; the adapter must keep it off."""
    backend = backend_for(name, 8, 2, 64)
    lengths = [1] * 5
    q, k, v = random_qkv(5, 8, 2, 64, seed=6)
    padded = [1, 0, 1, 1, 0, 0, 1, 1, 0]
    out = run(backend, q, k, v, device_meta(cumulative(padded), 1, 5, backend))
    assert_matches(out, reference(q, k, v, lengths), lengths)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", GRAPH_SAFE)
def test_graph_replay_with_new_lengths_matches_eager(name, causal):
    backend = backend_for(name, 8, 2, 64, causal)
    num_tokens, num_slots, max_seqlen = 4096, 16, 4096
    splits = [
        [1, 2048, *split(num_tokens - 2049, 8, seed=7)],
        split(num_tokens, num_slots, seed=8),
        [*split(num_tokens, 5, seed=9), *[0] * (num_slots - 5)],  # zero-length slots pad the tail
    ]
    q, k, v = random_qkv(num_tokens, 8, 2, 64, seed=7)
    cu_seqlens = torch.zeros(num_slots + 1, dtype=torch.int32, device="cuda")
    cu_seqlens.copy_(cumulative(splits[0] + [0] * (num_slots - len(splits[0]))))
    meta = device_meta(cu_seqlens, max_seqlen, num_tokens, backend)  # the graph reads these buffers

    # capture: a warm-up outside the graph first (kernels load or compile once)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        varlen_attention(q, k, v, meta, backend=backend, causal=causal)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = varlen_attention(q, k, v, meta, backend=backend, causal=causal)

    # replay: new inputs and new lengths of the same total, in the same buffers; the last lengths twice
    # (a backend may keep its plan for lengths it has planned already)
    for seed, slot_lengths in enumerate([*splits, splits[-1]]):
        slot_lengths = slot_lengths + [0] * (num_slots - len(slot_lengths))
        lengths = [length for length in slot_lengths if length]
        for buffer, fresh in zip((q, k, v), random_qkv(num_tokens, 8, 2, 64, seed=10 + seed)):
            buffer.copy_(fresh)
        cu_seqlens.copy_(cumulative(slot_lengths))
        meta.segment_ids.copy_(segments_of(cu_seqlens))
        backend.prepare(meta, cumulative(slot_lengths))
        graph.replay()
        eager = run(backend, q, k, v, exact_meta(lengths), causal)
        assert_matches(static_out, eager.float(), lengths)
        assert_matches(static_out, reference(q, k, v, lengths, causal), lengths)


def test_flashinfer_plans_each_batch_while_the_host_runs_ahead():
    """Batches queued back to back behind a slow GPU: each plans afresh (shared by its two "layers"), and
    no plan's queued copy of its schedule reads a later batch's."""
    backend = backend_for("flashinfer", 8, 2, 128, causal=True)
    batches = []
    for seed in range(6):
        lengths = ragged_lengths(seed=20 + seed, count=4 + seed)
        batches.append((lengths, *random_qkv(sum(lengths), 8, 2, 128, seed=20 + seed)))
    outputs = []
    for lengths, q, k, v in batches:
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time: the host plans the next batch meanwhile
        meta = exact_meta(lengths)
        for _ in range(2):
            out = varlen_attention(q, k, v, meta, backend=backend, causal=True)
        outputs.append(out)
    for (lengths, q, k, v), out in zip(batches, outputs):
        assert_matches(out, reference(q, k, v, lengths, causal=True), lengths)


def test_auto_on_this_gpu():
    shape = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 64, "dtype": DTYPE}
    with_graphs = select_backend("auto", "cuda", graphs=True, **shape)
    assert with_graphs.name in GRAPH_SAFE and with_graphs.graph_safe, with_graphs.reason
    eager = select_backend("auto", "cuda", graphs=False, **shape)
    try:
        select_backend("flashinfer", "cuda", **shape)
    except AttentionBackendUnavailable:
        assert eager.name != "flashinfer"
    else:
        assert eager.name == "flashinfer", eager.reason
    fp32 = select_backend("auto", "cuda", graphs=True, **{**shape, "dtype": torch.float32})
    assert fp32.name == "torch" and "CUDA graphs stay off" in fp32.reason


def test_triton_runs_short_batches_itself_and_hands_longer_ones_on():
    from engine.attention.triton_backend import SHORT_SEQLEN

    backend = backend_for("triton", 8, 2, 64)
    long_sequences = backend.long_sequences
    assert long_sequences is not None
    # the first of FA3 (flashinfer), FA4 (flash-attn) and FlashAttention 2 (torch-varlen) that loads here
    for name in ("flashinfer", "flash-attn", "torch-varlen"):
        try:
            select_backend(name, "cuda", num_heads=8, num_kv_heads=2, head_dim=64, dtype=DTYPE)
        except AttentionBackendUnavailable:
            continue
        assert long_sequences.name == name
        break
    calls = []

    class Spy:
        def forward(self, *args):
            calls.append(args[3].max_seqlen)
            return long_sequences.forward(*args)

    backend.long_sequences = Spy()
    for lengths in ([SHORT_SEQLEN, 5], [SHORT_SEQLEN + 1, 5]):
        q, k, v = random_qkv(sum(lengths), 8, 2, 64, seed=len(calls))
        out = run(backend, q, k, v, exact_meta(lengths))
        assert_matches(out, reference(q, k, v, lengths), lengths)
    assert calls == [SHORT_SEQLEN + 1]


@pytest.mark.parametrize("name", ["torch-varlen", "flashinfer", "flash-attn", "triton"])
@pytest.mark.parametrize("window", [None, 96])
def test_shared_prefixes_match_the_torch_reference(name, window):
    # two prefixes, each continued by several sequences, and a plain sequence between: every
    # continuation's keys are its prefix's, then its own (the mask aligned at the end)
    from engine.batch import pack

    backend = backend_for(name, 16, 8, 128, causal=True, window=window)
    lengths = [100, 150, 3, 260, 40, 57, 1, 512]
    prefix_of = [-1, 0, 0, 0, -1, -1, 5, 5]
    batch = pack([[0] * n for n in lengths], prefix_of=prefix_of)
    meta = AttentionMetadata.build(batch.cu_seqlens, batch.max_seqlen, batch.prefix_of).to("cuda")
    generator = torch.Generator(device="cuda").manual_seed(7)
    q, k, v = (
        torch.randn(sum(lengths), heads, 128, device="cuda", dtype=DTYPE, generator=generator)
        for heads in (16, 8, 8)
    )
    got = varlen_attention(q, k, v, meta, backend=backend, causal=True, window=window)
    want = varlen_attention(
        q.float(), k.float(), v.float(), meta, backend=TorchAttention(), causal=True, window=window
    )
    for start, end in zip(meta.cu_seqlens.tolist(), meta.cu_seqlens.tolist()[1:]):
        error = (got[start:end].float() - want[start:end]).norm() / want[start:end].norm()
        assert error.item() <= TOLERANCE, (name, start, error.item())
