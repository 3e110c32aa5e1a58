"""Load models in a thread that exits afterwards. On the CPU, torch's OpenMP keeps a worker pool per
thread that ran parallel work; while the loading thread's pool lives on (a pooled executor thread, or a
replica's main thread), libgomp counts more threads than cores and throttles its spin-waits, so that every
parallel region of the engine's own thread waits on a sleeping worker: a MiniLM step of a short text took
7.9 ms there instead of 2.9 ms on 2 cores. A thread that exits takes its pool with it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def run_in_passing_thread(function: Callable[[], T]) -> T:
    """`function()` in a new thread that ends with it; its result or its exception."""
    outcome: dict[str, object] = {}

    def target() -> None:
        try:
            outcome["result"] = function()
        except BaseException as error:  # re-raised in the caller's thread
            outcome["error"] = error

    thread = threading.Thread(target=target, name="posy-load")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["result"]  # type: ignore[return-value]


async def await_in_passing_thread(function: Callable[[], T]) -> T:
    """The same without blocking the event loop."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def target() -> None:
        try:
            result = function()
        except BaseException as error:
            loop.call_soon_threadsafe(settle, future, None, error)
        else:
            loop.call_soon_threadsafe(settle, future, result, None)

    threading.Thread(target=target, name="posy-load", daemon=True).start()
    return await future


def settle(future: asyncio.Future, result: object, error: BaseException | None) -> None:
    """From the loop's thread: the future's outcome, unless it is done already (cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
