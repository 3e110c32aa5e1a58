"""ConnectionLimits and the HTTP protocol that holds each connection to them. A request's head must arrive
whole within --header-timeout, counted from the connection's accept (or from the request's first byte on
a kept-alive connection), and its body within --body-timeout of the head's end; else a 408 and the
connection closes. Both are deadlines for the whole part, not for a gap between bytes, so that a client
trickling a byte at a time holds its connection no longer than one that stalls. Past --max-connections
open in the process, a new connection's request gets a 503 with Retry-After and the connection closes.
uvicorn's httptools protocol, which this extends, has neither deadline: a stalled request held its
connection, and a file descriptor, for ever."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import httptools
from litestar.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from api.config import ServerConfig
from api.errors import READ_TIMEOUT, NotReady, ReadTimeout, request_id_of
from api.hooks import RECEIVED
from api.responses import error_answer

logger = logging.getLogger(__name__)
FALLBACK_FD_LIMIT = 1024  # where the platform has no getrlimit
UNLIMITED_FDS = 65536  # what an unlimited one counts as
REFUSAL_RETRY_S = 1

# what a connection is reading
WAITING = "waiting"  # no byte of its first request yet
HEAD = "head"
BODY = "body"
READ = "read"  # the request whole: it is being answered, or the connection idles under uvicorn's keep-alive
UPGRADED = "upgraded"  # handed to a WebSocket protocol


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float  # 0: none
    body_timeout_s: float
    max_connections: int

    @classmethod
    def of(cls, config: ServerConfig) -> ConnectionLimits:
        """The limits of this process's connections (the default cap from its own open-file limit)."""
        return cls(
            config.header_timeout, config.body_timeout, config.max_connections or default_max_connections()
        )


def default_max_connections() -> int:
    """Half this process's open-file limit, its soft limit first raised to the hard one (as Go's runtime
    and nginx's worker_rlimit_nofile do: a shell's default soft 1,024 would cap a server at 512
    connections): the other half is for its own files, its sockets to the replicas, and the connections
    opened past the cap while they are refused."""
    try:
        import resource
    except ImportError:  # Windows
        return FALLBACK_FD_LIMIT // 2
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        wanted = UNLIMITED_FDS if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):  # a platform that caps it lower (macOS: OPEN_MAX)
            pass
    return max(1, (UNLIMITED_FDS if soft == resource.RLIM_INFINITY else soft) // 2)


def limited_protocol(limits: ConnectionLimits) -> Callable[..., LimitedHttpProtocol]:
    """The protocol factory for uvicorn's Config(http=...): every connection's, sharing one RefusalLog."""
    return partial(LimitedHttpProtocol, limits=limits, refusals=RefusalLog(limits.max_connections))


class RefusalLog:
    """Says when a process starts refusing connections past its cap, and when it takes them again."""

    __slots__ = ("max_connections", "refusing")

    def __init__(self, max_connections: int):
        self.max_connections = max_connections
        self.refusing = False

    def note(self, refused: bool) -> None:
        if refused == self.refusing:
            return
        self.refusing = refused
        if refused:
            logger.warning(
                "more than %d connections open (--max-connections): new ones get 503", self.max_connections
            )
        else:
            logger.info("fewer than %d connections open: taking new ones again", self.max_connections)


class LimitedHttpProtocol(HttpToolsProtocol):
    def __init__(self, *args, limits: ConnectionLimits, refusals: RefusalLog, **kwargs):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.refusals = refusals
        self.reading = WAITING
        self.head_timer: asyncio.TimerHandle | None = None
        self.body_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        refused = len(self.connections) > self.limits.max_connections
        if refused:
            self.app = self.refuse
        self.refusals.note(refused)
        self._arm_deadlines()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_deadlines()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # armed once the parser has had the data: a request that arrives whole in one read costs no timer
        self._arm_deadlines()

    def handle_websocket_upgrade(self) -> None:
        self.reading = UPGRADED
        self._cancel_deadlines()
        super().handle_websocket_upgrade()

    # parser callbacks
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["state"][RECEIVED] = time.perf_counter()  # the request's clock (api/hooks.py)
        self.reading = HEAD

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self.reading = BODY
        self.head_timer = _cancel(self.head_timer)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self.reading = READ
        self.body_timer = _cancel(self.body_timer)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm_deadlines()  # a pipelined request started now: its body's time runs from here

    def _arm_deadlines(self) -> None:
        if self.transport.is_closing():
            return
        loop, limits = self.loop, self.limits
        if self.reading in (WAITING, HEAD) and self.head_timer is None and limits.header_timeout_s > 0:
            self.head_timer = loop.call_later(limits.header_timeout_s, self._head_timed_out)
        # a pipelined request waits, unread, for the one before it to be answered: not the client's time
        elif (
            self.reading is BODY
            and self.body_timer is None
            and limits.body_timeout_s > 0
            and not self.pipeline
        ):
            self.body_timer = loop.call_later(limits.body_timeout_s, self._body_timed_out)

    def _cancel_deadlines(self) -> None:
        self.head_timer = _cancel(self.head_timer)
        self.body_timer = _cancel(self.body_timer)

    def _head_timed_out(self) -> None:
        self.head_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # an answer is on its way: the connection closes after it
        elif self.reading is HEAD:
            scope = {**self.scope, "path": _path_of(self.url)}
            self._answer_and_close(
                scope, ReadTimeout("head", self.limits.header_timeout_s, "--header-timeout")
            )
        else:  # no byte of a request: nothing to answer (a 408 could pass a request sent at this moment)
            self.transport.close()

    def _body_timed_out(self) -> None:
        self.body_timer = None
        cycle = self.cycle
        if cycle.response_complete:  # answered without reading the body whole
            self.transport.close()
        elif cycle.response_started:
            cycle.keep_alive = False
        else:
            error = ReadTimeout("body", self.limits.body_timeout_s, "--body-timeout")
            cycle.scope["state"][READ_TIMEOUT] = error
            self._answer_and_close(cycle.scope, error)
            cycle.disconnected = (
                True  # the app's read of the body ends (api/body.py), its answer goes nowhere
            )
            cycle.message_event.set()

    def _answer_and_close(self, scope: Scope, error: Exception) -> None:
        """Answer `error` in the called API's shape, past the app (which may be waiting on the body)."""
        status, headers, body = error_answer(scope, error)
        headers += [(b"x-request-id", request_id_of(scope).encode("latin-1")), (b"connection", b"close")]
        head = [STATUS_LINE[status]]
        for name, value in [*self.server_state.default_headers, *headers]:
            head += [name, b": ", value, b"\r\n"]
        self.transport.write(b"".join([*head, b"\r\n", body]))
        self.transport.close()

    async def refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app of a connection opened past the cap: 503, Retry-After, Connection: close."""
        error = NotReady(
            f"this server process has more than {self.limits.max_connections} connections open "
            "(--max-connections); retry shortly",
            REFUSAL_RETRY_S,
            close=True,
        )
        status, headers, body = error_answer(scope, error)
        headers.append((b"x-request-id", request_id_of(scope).encode("latin-1")))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def awaits_first_request(connection: asyncio.Protocol) -> bool:
    """Open, and no byte of its first request read yet."""
    return getattr(connection, "reading", None) is WAITING


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    if timer is not None:
        timer.cancel()


def _path_of(url: bytes) -> str:
    """The path of a request line read so far, for the error's shape; "" where it is not one yet."""
    try:
        return httptools.parse_url(url).path.decode("latin-1")
    except httptools.HttpParserInvalidURLError:
        return ""
