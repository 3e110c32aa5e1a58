"""An engine replica process: builds its model's engine on its device, then serves Run messages from the
gateways over a ZeroMQ ROUTER socket, answering each with its rows or a typed Failure. It exits on
SIGTERM (the engine fails what is still queued with EngineStopped) or when its parent is gone."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import EngineError, EngineStopped, Overloaded, SequenceTooLong
from engine.passing_thread import run_in_passing_thread
from engine.replica_protocol import Cancel, Failure, Result, Run, encoder, replica_decoder

logger = logging.getLogger(__name__)
PARENT_CHECK_S = 1.0


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    model: str | None  # as --model gave it; None is the bundled default
    engine: EngineConfig
    endpoint: str  # where the ROUTER socket binds, e.g. ipc:///tmp/posy-1234/m0-r1
    bidirectional: bool = False
    max_model_len: int | None = None
    log_level: str = "info"
    num_threads: int | None = None  # torch's CPU threads; None: torch's default
    metrics_model: str | None = None  # the model's name in the server's metrics
    # metrics_model -> the engine's on_batch callback (or None); a module-level function
    batch_observer: Callable[[str], Callable[[int, int], None] | None] | None = None


def replica_main(config: ReplicaConfig, ready, description) -> None:
    """The spawned process's entry: `ready` (a multiprocessing Event) is set once the engine is warm,
    after `description` (a shared character array) got the engine's describe() as JSON."""
    import json

    import torch

    from engine.build import build_engine
    from engine.loader import resolve_model

    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    logging.basicConfig(
        level=config.log_level.upper(), format=f"%(asctime)s %(levelname)s replica {os.getpid()}: %(message)s"
    )
    spec = resolve_model(config.model, config.bidirectional, config.max_model_len)
    on_batch = None
    if config.batch_observer is not None and config.metrics_model is not None:
        on_batch = config.batch_observer(config.metrics_model)
    # in a thread that exits: this main thread would otherwise slow the engine's CPU steps
    engine = run_in_passing_thread(lambda: build_engine(spec, config.engine, on_batch))
    description.value = json.dumps(engine.describe()).encode()[: len(description) - 1]
    try:
        asyncio.run(serve(engine, config.endpoint, ready))
    finally:
        engine.stop()


async def serve(engine: Engine, endpoint: str, ready) -> None:
    import zmq
    import zmq.asyncio

    context = zmq.asyncio.Context()
    socket = context.socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    socket.bind(endpoint)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    parent = os.getppid()
    encode, decode = encoder(), replica_decoder()
    tasks: dict[tuple[bytes, int], asyncio.Task] = {}

    async def answer(identity: bytes, run: Run) -> None:
        try:
            rows = await engine.run(run.token_ids, run.token_type_ids)
            reply: Result | Failure = Result(
                run.id, rows.astype("<f4").tobytes(), len(rows), engine.queued_tokens
            )
        except Overloaded as error:
            reply = Failure(run.id, "overloaded", str(error), engine.queued_tokens, error.retry_after_s)
        except (SequenceTooLong, ValueError) as error:
            reply = Failure(run.id, "invalid", str(error), engine.queued_tokens)
        except EngineStopped as error:
            reply = Failure(run.id, "stopped", str(error), engine.queued_tokens)
        except EngineError as error:
            reply = Failure(run.id, "failed", str(error), engine.queued_tokens)
        finally:
            tasks.pop((identity, run.id), None)
        await socket.send_multipart([identity, encode.encode(reply)])

    async def receive() -> None:
        while True:
            identity, payload = await socket.recv_multipart()
            message = decode.decode(payload)
            if isinstance(message, Cancel):
                task = tasks.pop((identity, message.id), None)
                if task is not None:
                    task.cancel()  # its engine future is cancelled: the scheduler drops what is queued
            else:
                tasks[identity, message.id] = asyncio.create_task(answer(identity, message))

    async def watch_parent() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_CHECK_S)
        logger.warning("the gateway process is gone: stopping")
        stop.set()

    ready.set()
    logger.info("replica serving %s on %s", engine.attention_backend, endpoint)
    workers = [asyncio.create_task(receive()), asyncio.create_task(watch_parent())]
    await stop.wait()
    for task in [*workers, *tasks.values()]:
        task.cancel()
    socket.close()
    context.term()
