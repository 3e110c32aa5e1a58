"""Model loading runs in a thread that ends with it (see engine/passing_thread.py): results and errors
come back to the caller, and no thread is left behind."""

import asyncio
import threading

import pytest

from engine.passing_thread import await_in_passing_thread, run_in_passing_thread


def where() -> tuple[str, threading.Thread]:
    return threading.current_thread().name, threading.current_thread()


def test_runs_elsewhere_returns_and_leaves_no_thread():
    name, thread = run_in_passing_thread(where)
    assert name == "posy-load" and thread is not threading.current_thread()
    assert not thread.is_alive()


def test_errors_reach_the_caller():
    def fail():
        raise ValueError("bad model folder")

    with pytest.raises(ValueError, match="bad model folder"):
        run_in_passing_thread(fail)

    with pytest.raises(ValueError, match="bad model folder"):
        asyncio.run(await_in_passing_thread(fail))


def test_the_awaitable_form_keeps_the_loop_free():
    release = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "loaded"

    async def main():
        loading = asyncio.ensure_future(await_in_passing_thread(slow))
        await asyncio.sleep(0.05)
        assert not loading.done()  # the loop ran this coroutine meanwhile
        release.set()
        return await loading

    assert asyncio.run(main()) == "loaded"
