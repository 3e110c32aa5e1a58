"""DecodeTurns: the host's cores given to the gateways' image decoding in turn, first come first served.

Each gateway decodes a request's images on as many threads as the host has cores. Four gateways decoding
four requests at once shared the cores four ways, so that every request's images were done at the same
late moment and the engine idled until then (Qwen2-VL-2B, 4 clients sending 16 images each to a 16-core
host: 60 ms of decoding before the engine's first batch, where one request's 16 alone take 15). With turns,
the parts a request's images are decoded in take consecutive tickets, and a part starts only once fewer
than `cores` parts of earlier tickets are unfinished: the first request's images are done first, and the
engine runs them while the cores decode the next one's.

The supervisor makes the turns before it spawns the gateways (its counters live in shared memory); each
gateway waits on its own semaphore, which every finished part posts, and a thread of its own wakes exactly
its parts whose turn came. A gateway that dies with tickets unfinished has them counted finished by the
supervisor (`reclaim`), and the lock too where it died holding it; a part that waits past WAIT_S starts
anyway, so that nothing hangs on a ticket lost in between."""

from __future__ import annotations

import heapq
import threading

WAIT_S = 5.0
WATCH_S = 1.0  # a gateway's watcher re-checks at least this often
STUCK_S = 1.0


class DecodeTurns:
    """The shared part, made by the supervisor and passed to the gateways it spawns."""

    def __init__(self, context, cores: int, num_gateways: int):
        self.cores = max(1, cores)
        self._lock = context.Lock()
        self._next = context.RawValue("q", 0)  # the next ticket to hand out
        self._finished = context.RawValue("q", 0)  # tickets finished, in any order
        self._open = context.RawArray("q", num_gateways)  # each gateway's tickets taken and not finished
        self._wakes = [context.Semaphore(0) for _ in range(num_gateways)]

    def gateway(self, index: int) -> GatewayTurns:
        """Gateway `index`'s side of the turns (in its own process)."""
        return GatewayTurns(self, index)

    def take(self, gateway: int, count: int) -> int:
        with self._lock:
            first = self._next.value
            self._next.value += count
            self._open[gateway] += count
        return first

    def finish(self, gateway: int, count: int = 1) -> None:
        with self._lock:
            self._finished.value += count
            self._open[gateway] -= count
        self._wake_all()

    def reclaim(self, gateway: int) -> int:
        """A dead gateway's unfinished tickets counted finished; how many. The lock is held for microseconds:
        held for STUCK_S, it is the dead gateway's, killed holding it, and taken over."""
        self._lock.acquire(timeout=STUCK_S)
        try:
            count = self._open[gateway]
            self._finished.value += count
            self._open[gateway] = 0
        finally:
            self._lock.release()
        self._wake_all()
        return count

    def open_tickets(self, gateway: int) -> int:
        return self._open[gateway]

    def allowed(self) -> int:
        """Tickets below this may start."""
        return self._finished.value + self.cores

    def wait_for_change(self, gateway: int, timeout: float) -> None:
        wake = self._wakes[gateway]
        if wake.acquire(timeout=timeout):
            while wake.acquire(False):  # posts that came meanwhile: one look serves them all
                pass

    def _wake_all(self) -> None:
        for wake in self._wakes:
            wake.release()


class GatewayTurns:
    """A gateway's tickets: `take` a run of them as a request's parts are queued, `wait` on a thread until
    a part's turn, `finish` it once done (refused or failed as well)."""

    def __init__(self, shared: DecodeTurns, index: int):
        self.shared = shared
        self.index = index
        self.wait_s = WAIT_S
        self._waiting: list[tuple[int, int, threading.Event]] = []  # a heap, the earliest ticket first
        self._lock = threading.Lock()
        self._watcher: threading.Thread | None = None

    def take(self, count: int) -> int:
        """`count` consecutive tickets; the first."""
        return self.shared.take(self.index, count)

    def wait(self, ticket: int) -> bool:
        """Block until the ticket's turn; False where it waited `wait_s` without it."""
        if ticket < self.shared.allowed():
            return True
        came = threading.Event()
        with self._lock:
            heapq.heappush(self._waiting, (ticket, id(came), came))
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="posy-decode-turns", daemon=True)
                self._watcher.start()
        self._wake_due()  # a part finished between the look above and the push
        return came.wait(self.wait_s)

    def finish(self, count: int = 1) -> None:
        self.shared.finish(self.index, count)

    def _watch(self) -> None:
        while True:
            self.shared.wait_for_change(self.index, WATCH_S)
            self._wake_due()

    def _wake_due(self) -> None:
        allowed = self.shared.allowed()
        with self._lock:
            while self._waiting and self._waiting[0][0] < allowed:
                heapq.heappop(self._waiting)[2].set()
