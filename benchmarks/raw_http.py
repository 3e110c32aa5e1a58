"""RawConnection: a keep-alive HTTP/1.1 client on one blocking socket that costs next to nothing (a few
microseconds a request, against an httpx client's 0.5 to 1 ms), so that the HTTP suites measure the
server. Bodies are prepared ahead; responses must carry Content-Length, as posy's and Infinity's do."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

RECEIVE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class RawResponse:
    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


def request_bytes(method: str, path: str, body: bytes | None = None, host: str = "posy") -> bytes:
    """A whole request, ready to send again and again."""
    if body is None:
        return f"{method} {path} HTTP/1.1\r\nhost: {host}\r\n\r\n".encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class RawConnection:
    def __init__(self, url: str, timeout_s: float = 60.0):
        address = urlsplit(url)
        self.sock = socket.create_connection((address.hostname, address.port), timeout=timeout_s)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""

    def send(self, request: bytes) -> RawResponse:
        self.sock.sendall(request)
        while b"\r\n\r\n" not in self._buffer:
            self._receive()
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if "content-length" not in headers:
            raise ValueError(f"a response without content-length (status {status}): not supported")
        length = int(headers["content-length"])
        while len(self._buffer) < length:
            self._receive()
        body, self._buffer = self._buffer[:length], self._buffer[length:]
        return RawResponse(status, headers, body)

    def _receive(self) -> None:
        data = self.sock.recv(RECEIVE_BYTES)
        if not data:
            raise ConnectionError("the server closed the connection")
        self._buffer += data

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
