"""The suite runs on two pytest-xdist workers (pyproject's addopts), a module to a worker; two marks say
what a module may share the host with:

- `serial`: it times the server (admission's refusals by deadline, answers within a timeout) or loads the
  host with client processes: beside another worker's test it would measure that test's CPU, not posy. Its
  tests run alone, in one turn from its first test's setup to its last one's teardown.
- `busy`: what its fixtures start keeps working between its tests (a Ray cluster): it runs beside other
  tests, never beside a serial one, in one shared turn through the module.

Every other test takes a shared turn of its own. The turn is a lock on a file; a gate taken before it keeps
a waiting serial module from being overtaken by the other worker's next tests. Busy modules run first and
serial ones last, so that a busy one overlaps the plain tests rather than holding a serial one up. Without
xdist (one process) the lock is never contended."""

from __future__ import annotations

import fcntl
import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

SERIAL, BUSY = "serial", "busy"


def _lock_folder() -> Path:
    # one lock a run: xdist gives its workers a shared id; a run without xdist uses its own pid
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID", f"pid{os.getpid()}")
    folder = Path(tempfile.gettempdir()) / f"posy-tests-{run}"
    folder.mkdir(exist_ok=True)
    return folder


@contextmanager
def host_turn(exclusive: bool) -> Iterator[None]:
    """Hold the host's turn lock: alone (`exclusive`) or beside other shared holders."""
    folder = _lock_folder()
    with open(folder / "gate", "a+") as gate, open(folder / "turn", "a+") as turn:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(turn, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(turn, fcntl.LOCK_UN)


def kind_of(item) -> str | None:
    """SERIAL, BUSY or None (a plain test)."""
    return next((mark for mark in (SERIAL, BUSY) if item.get_closest_marker(mark) is not None), None)


class SerialTurns:
    """The plugin: each test's setup, call and teardown inside its turn; a marked module's tests in one."""

    NAME = "posy-serial-turns"

    def __init__(self):
        self._module_turn: ExitStack | None = None  # held through a marked module

    @staticmethod
    def register(config) -> None:
        """From each test folder's conftest: once, whichever folders a run collects."""
        if not config.pluginmanager.has_plugin(SerialTurns.NAME):
            config.pluginmanager.register(SerialTurns(), SerialTurns.NAME)

    def pytest_collection_modifyitems(self, items) -> None:
        """Busy modules first, serial ones last (a stable sort: each module's tests stay together and in
        order, the same order on every worker)."""
        rank = {BUSY: 0, None: 1, SERIAL: 2}
        items.sort(key=lambda item: rank[kind_of(item)])

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        kind = kind_of(item)
        if kind is None:
            with host_turn(exclusive=False):
                return (yield)
        if self._module_turn is None:
            self._module_turn = ExitStack()
            self._module_turn.enter_context(host_turn(exclusive=kind == SERIAL))
        try:
            return (yield)
        finally:
            if nextitem is None or nextitem.module is not item.module or kind_of(nextitem) != kind:
                self._module_turn.close()
                self._module_turn = None
