"""The messages between a gateway and an engine replica process: msgspec-encoded (msgpack), token ids in,
float32 rows out, never pickle. A replica answers every Run with a Result or a Failure, and reports its
queued tokens in both so that gateways balance on fresh numbers."""

from __future__ import annotations

import msgspec
import numpy as np


class Run(msgspec.Struct, tag="run", array_like=True):
    id: int
    token_ids: list[list[int]]
    token_type_ids: list[list[int] | None] | None = None


class Cancel(msgspec.Struct, tag="cancel", array_like=True):
    """The gateway gave up on a Run (timeout, client gone): drop whatever of it is still queued."""

    id: int


class Result(msgspec.Struct, tag="result", array_like=True):
    id: int
    rows: bytes  # [num_rows, dim] little-endian float32
    num_rows: int
    queued_tokens: int

    def array(self) -> np.ndarray:
        return np.frombuffer(self.rows, dtype="<f4").reshape(self.num_rows, -1)


class Failure(msgspec.Struct, tag="failure", array_like=True):
    id: int
    # "overloaded": the queue is full (429); "invalid": the request itself is wrong (400); "stopped": the
    # replica is shutting down (503); "failed": the model failed on it (500)
    kind: str
    message: str
    queued_tokens: int
    retry_after_s: float = 1.0


ToReplica = Run | Cancel
FromReplica = Result | Failure


def encoder() -> msgspec.msgpack.Encoder:
    return msgspec.msgpack.Encoder()


def replica_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(ToReplica)


def gateway_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(FromReplica)
