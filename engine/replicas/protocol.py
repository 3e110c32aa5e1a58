"""The messages between a gateway and an engine replica process, never pickle: small msgspec (msgpack)
frames on a Unix stream socket, each behind its 4-byte length, while token ids and rows travel through
the shared-memory rings of engine/replicas/shm_ring.py that the frames point into. A replica answers every Run
with a Result or a Failure, and reports its queue and its measured rate in both so that gateways
balance and estimate on fresh numbers."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import msgspec

from engine.outputs import HeadOutput

LENGTH = struct.Struct("<I")


class Capabilities(msgspec.Struct, tag="capabilities", array_like=True):
    """What a replica's engine gives and does, as it tells its ReplicaSet once warm: its head's output,
    the fewest saved tokens from which callers should send sequences as continuations of a shared prefix
    (None: it runs none), and how it runs, for logs and metrics (Engine.describe)."""

    output: HeadOutput
    shared_prefixes_from: int | None
    description: dict[str, str]


class Refused(msgspec.Struct, tag="refused", array_like=True):
    """A replica that refused its model (its config, its backend): why, for the gateway to say once."""

    reason: str


def start_file(endpoint: str) -> Path:
    """Where a replica listening on `endpoint` writes its Capabilities or its Refused."""
    return Path(f"{endpoint}.start")


def write_start(endpoint: str, message: Capabilities | Refused) -> None:
    """Whole or not at all: a reader never sees half of it."""
    path = start_file(endpoint)
    partial = path.with_suffix(".partial")
    partial.write_bytes(msgspec.msgpack.encode(message))
    os.replace(partial, path)


def read_start(endpoint: str) -> Capabilities | Refused | None:
    """What the replica on `endpoint` wrote at its start; None before it has."""
    try:
        data = start_file(endpoint).read_bytes()
    except FileNotFoundError:
        return None
    return msgspec.msgpack.decode(data, type=Capabilities | Refused)


class Hello(msgspec.Struct, tag="hello", array_like=True):
    """A gateway's first frame on a new connection: the two rings it made for it (file names in the
    replica's folder) and their sizes."""

    requests: str
    requests_size: int
    replies: str
    replies_size: int


class Run(msgspec.Struct, tag="run", array_like=True):
    """Sequences to embed. The request ring holds at `offset`: lengths (int32 [num_seqs]), token ids
    (int32 [num_tokens]), with `has_types` token type ids (int32 [num_tokens]), then the ids of a shared
    prefix that every sequence continues (int32 [prefix_tokens]: Engine.submit's `prefix`), then with
    `span_words` each sequence's number of span boundaries (int32 [num_seqs], -1: no spans) and the
    boundaries (Engine.submit's `spans`), then with `image_words` each sequence's number of images (int32
    [num_seqs], 0 for a text), each of those images' index among the distinct images (int32, in order of
    first use: an image that several sequences hold is sent once), each distinct image's grid of patches
    (int32 [num_distinct, 2]: rows and columns) and their pixels (uint8 [patches, patch_dim], RowRequest's
    `images`, zero bytes after them to a whole word); or the file `spill`. `first_rows` and `columns`: the
    rest of Engine.submit's RowRequest."""

    id: int
    num_seqs: int
    num_tokens: int
    has_types: bool
    offset: int
    end: int  # the ring position after this payload, which the replica acknowledges
    spill: str | None = None
    # the request's deadline (time.perf_counter(): CLOCK_MONOTONIC, one clock for the host's processes),
    # not the time left: a Run can wait in the socket while the replica's thread runs a batch, seconds on
    # a busy CPU, and a time left read then would give the request that wait again; None: no deadline
    deadline: float | None = None
    replies_read: int = 0  # the gateway has read the reply ring up to here
    prefix_tokens: int = 0
    span_words: int = 0
    first_rows: bool = False
    columns: tuple[int, int] | None = None
    image_words: int = 0
    patch_dim: int = 0


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    """The gateway gave up on a Run (timeout, client gone): drop whatever of it is still queued."""

    id: int


class Freed(msgspec.Struct, tag="freed", array_like=True):
    """The gateway has read the reply ring up to here (sent when no Run carries it soon enough)."""

    replies_read: int


class Result(msgspec.Struct, tag="result", array_like=True):
    """Rows (float32 [num_rows, dim]) at `offset` of the reply ring, or in the file `spill`."""

    id: int
    num_rows: int
    dim: int
    offset: int
    end: int
    spill: str | None
    queue_s: float
    inference_s: float
    queued_tokens: int
    requests_read: int  # the replica has copied every Run's payload up to this request-ring position
    seconds_per_token: float | None = None  # the replica's measured rate; None before it has one
    num_tokens: int = 0  # the tokens the model ran for the Run (EngineOutput's)
    margin: float = 1.0  # what the replica's admission stretches its estimates by (ServiceRate.margin)
    idle_seconds_per_token: float | None = None  # its idle probes' rate (ServiceRate's)
    # when its rows were done (time.perf_counter()): from the gateway's send to it less inference_s is the
    # Run's queue time, the wait in the socket included
    finished_at: float = 0.0
    # the quiet host's rate, toward which the gateway lets the other two recover as its report ages
    quiet_seconds_per_token: float | None = None


class Failure(msgspec.Struct, tag="failure", array_like=True):
    id: int
    # "overloaded": the queue is full or too slow for the deadline (429); "invalid": the request itself is
    # wrong (400); "stopped": the replica is shutting down (503); "failed": the model failed on it (500)
    kind: str
    message: str
    queued_tokens: int
    requests_read: int
    retry_after_s: float = 1.0
    seconds_per_token: float | None = None
    margin: float = 1.0
    idle_seconds_per_token: float | None = None
    quiet_seconds_per_token: float | None = None


class Load(msgspec.Struct, tag="load", array_like=True):
    """Unasked: the replica's idle probe changed its rate (engine/service_rate.py), which its gateways
    would otherwise hear of only with their next Run's answer, and a gateway that refuses work on a rate
    measured on a busy host sends none."""

    queued_tokens: int
    requests_read: int
    seconds_per_token: float | None
    margin: float
    idle_seconds_per_token: float | None
    quiet_seconds_per_token: float | None = None


ToReplica = Hello | Run | Cancel | Freed
FromReplica = Result | Failure | Load


def frame(encoder: msgspec.msgpack.Encoder, message: msgspec.Struct) -> bytes:
    body = encoder.encode(message)
    return LENGTH.pack(len(body)) + body


class FrameReader:
    """Reassembles frames from a stream's chunks."""

    def __init__(self, decoder: msgspec.msgpack.Decoder):
        self.decoder = decoder
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list:
        buffer = self._buffer
        buffer += data
        messages, start = [], 0
        while len(buffer) - start >= LENGTH.size:
            (size,) = LENGTH.unpack_from(buffer, start)
            if len(buffer) - start - LENGTH.size < size:
                break
            begin = start + LENGTH.size
            messages.append(self.decoder.decode(buffer[begin : begin + size]))
            start = begin + size
        if start:
            del buffer[:start]
        return messages


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def replica_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(ToReplica)


def gateway_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(FromReplica)
