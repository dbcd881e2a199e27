"""A lean HTTP/1.1 client for the bench hot path: keep-alive connections, one request at a time each.

Why: the bench client's own CPU per request bounds the load it can offer and delays its timestamps
(InferenceX utils/bench_serving/KNOWN_LIMITATION.md; https://github.com/vllm-project/vllm/issues/39963). aiohttp's general request
machinery costs ~0.3 ms of CPU per request; this path writes one pre-built request and parses the
response in ``data_received`` (no coroutine switch per network read), feeding each read, with its
arrival timestamp, to the same SSE state machine as the aiohttp path (``client._Stream``). It speaks
only what OpenAI-compatible streaming servers send: ``200`` with ``Transfer-Encoding: chunked``,
``Content-Length``, or read-until-close; plain ``http://`` and ``https://`` (TLS via ``ssl``).
No proxies, no redirects, no compression (``Accept-Encoding: identity``).
"""

from __future__ import annotations

import asyncio
import socket
import ssl as _ssl
import time
from typing import Protocol
from urllib.parse import urlsplit


class Sink(Protocol):
    """Where a response's bytes go as they arrive (m3ctl.loadgen.client's SSE state machine)."""

    def feed(self, ts: float, raw: bytes) -> None: ...


class HTTPStatus(Exception):
    """A response whose status is not 200: its ``status`` and body ``text`` (m3ctl.loadgen.client counts it as
    a failed request of that kind)."""

    def __init__(self, status: int, text: str):
        super().__init__(status)
        self.status, self.text = status, text


class _Proto(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.fut: asyncio.Future | None = None
        self.stream: Sink | None = None
        self._reset()

    def _reset(self) -> None:
        self.hbuf = b""
        self.status = 0
        self.mode = ""  # chunked | length | close
        self.remaining = 0  # bytes left in the current chunk (chunked) or body (length)
        self.cbuf = b""  # undecoded chunked framing
        self.skip = 0  # CRLF bytes to skip after a chunk
        self.close_after = False
        self.err_body = bytearray()

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:  # pragma: no cover
                pass

    def connection_lost(self, exc) -> None:
        self.transport = None
        if self.fut is not None and not self.fut.done():
            if self.mode == "close" and self.status:
                self._complete()
            else:
                self.fut.set_exception(ConnectionResetError("connection closed mid-response"))

    def _complete(self) -> None:
        fut = self.fut
        if fut is None:  # every caller checked first that a request waits
            return
        if self.status != 200:
            fut.set_exception(HTTPStatus(self.status, bytes(self.err_body).decode(errors="replace")))
        else:
            fut.set_result(None)

    def _body(self, ts: float, data: bytes) -> None:
        if not data:
            return
        if self.status == 200:
            if self.stream is not None:  # request() sets it before it sends
                self.stream.feed(ts, data)
        else:
            self.err_body += data

    def data_received(self, data: bytes) -> None:
        ts = time.perf_counter()
        if self.fut is None or self.fut.done():
            return
        if not self.status:
            self.hbuf += data
            end = self.hbuf.find(b"\r\n\r\n")
            if end < 0:
                return
            head, data = self.hbuf[:end].decode("latin-1"), self.hbuf[end + 4 :]
            self.hbuf = b""
            lines = head.split("\r\n")
            self.status = int(lines[0].split(" ", 2)[1])
            hdrs = {}
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                hdrs[k.strip().lower()] = v.strip().lower()
            if "chunked" in hdrs.get("transfer-encoding", ""):
                self.mode = "chunked"
            elif "content-length" in hdrs:
                self.mode, self.remaining = "length", int(hdrs["content-length"])
            else:
                self.mode = "close"
            self.close_after = hdrs.get("connection") == "close"
            if self.mode == "length" and self.remaining == 0:
                self._complete()
                return
        if self.mode == "length":
            take = data[: self.remaining]
            self.remaining -= len(take)
            self._body(ts, take)
            if self.remaining <= 0:
                self._complete()
        elif self.mode == "close":
            self._body(ts, data)
        else:
            self._chunked(ts, data)

    def _chunked(self, ts: float, data: bytes) -> None:
        buf = self.cbuf + data if self.cbuf else data
        pieces: list[bytes] = []
        i, n = 0, len(buf)
        if not self.skip and not self.remaining:
            # Fast path: whole "size CRLF data CRLF" chunks, one step each (a read often holds many of them).
            find = buf.find
            while True:
                j = find(b"\r\n", i)
                if j < 0:
                    break
                line = buf[i:j]
                size = int(line if b";" not in line else line.split(b";", 1)[0], 16)
                if size == 0:  # last chunk (trailers, if any, are not used)
                    self.cbuf = b""
                    self._body(ts, b"".join(pieces))
                    self._complete()
                    return
                end = j + 2 + size
                if end + 2 > n:  # incomplete: the general loop below takes it from the size line
                    break
                pieces.append(buf[j + 2 : end])
                i = end + 2
        while i < n:
            if self.skip:
                k = min(self.skip, n - i)
                self.skip -= k
                i += k
                continue
            if self.remaining:
                k = min(self.remaining, n - i)
                pieces.append(buf[i : i + k])
                self.remaining -= k
                i += k
                if not self.remaining:
                    self.skip = 2
                continue
            j = buf.find(b"\r\n", i)
            if j < 0:
                break
            size = int(buf[i:j].split(b";", 1)[0], 16)
            i = j + 2
            if size == 0:  # last chunk (trailers, if any, are not used)
                self.cbuf = b""
                self._body(ts, b"".join(pieces))
                self._complete()
                return
            self.remaining = size
        self.cbuf = buf[i:]
        self._body(ts, b"".join(pieces) if len(pieces) != 1 else pieces[0])


class Connection:
    """One keep-alive connection to ``base_url``; ``request`` sends a POST and streams the answer into ``stream``."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout_s: float | None = None):
        self.timeout_s = timeout_s  # whole request (connect to last byte), as aiohttp's ClientTimeout(total=)
        u = urlsplit(base_url)
        self.host = u.hostname or "127.0.0.1"
        self.tls = u.scheme == "https"
        self.port = u.port or (443 if self.tls else 80)
        self.prefix = u.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self._head = (
            f"Host: {u.netloc}\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"
            f"Accept-Encoding: identity\r\nConnection: keep-alive\r\n{extra}"
        ).encode()
        self._proto: _Proto | None = None

    async def _connect(self) -> _Proto:
        loop = asyncio.get_running_loop()
        ctx = _ssl.create_default_context() if self.tls else None
        _, proto = await loop.create_connection(_Proto, self.host, self.port, ssl=ctx)
        return proto

    async def request(self, path: str, body: bytes, stream: Sink, request_id: str = "") -> None:
        """POST ``body`` to ``path`` (with ``X-Request-Id: request_id`` when given); raises ``client._HTTPStatus`` on non-200, ``OSError`` on connection loss and
        ``TimeoutError`` after ``timeout_s`` (the connection is then dropped)."""
        loop = asyncio.get_running_loop()
        t_end = loop.time() + self.timeout_s if self.timeout_s else None
        p = self._proto
        if p is None or p.transport is None or p.transport.is_closing():
            if t_end is None:
                p = self._proto = await self._connect()
            else:
                p = self._proto = await asyncio.wait_for(self._connect(), self.timeout_s)
        transport = p.transport
        if transport is None:  # connection_made sets it; a fresh connection has one
            raise ConnectionResetError("connection closed before the request was sent")
        p._reset()
        p.stream = stream
        p.fut = fut = loop.create_future()
        timer = loop.call_at(t_end, _expire, p, fut, self.timeout_s) if t_end is not None and self.timeout_s else None
        transport.write(
            b"POST "
            + (self.prefix + path).encode()
            + b" HTTP/1.1\r\n"
            + self._head
            + (b"X-Request-Id: " + request_id.encode() + b"\r\n" if request_id else b"")
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        try:
            await fut
        finally:
            if timer is not None:
                timer.cancel()
            p.fut = None
            if p.close_after and p.transport is not None:
                p.transport.close()

    def close(self) -> None:
        if self._proto is not None and self._proto.transport is not None:
            self._proto.transport.close()


def _expire(p: _Proto, fut: asyncio.Future, timeout_s: float) -> None:
    if not fut.done():
        fut.set_exception(TimeoutError(f"no complete response within {timeout_s:g} s"))
        if p.transport is not None:
            p.transport.abort()


class ConnectionPool:
    """Idle keep-alive connections, reused last-in first-out; grows on demand (bounded by the callers' concurrency)."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout_s: float | None = None):
        self.base_url, self.headers, self.timeout_s = base_url, headers, timeout_s
        self._idle: list[Connection] = []
        self._all: list[Connection] = []

    def acquire(self) -> Connection:
        if self._idle:
            return self._idle.pop()
        c = Connection(self.base_url, self.headers, self.timeout_s)
        self._all.append(c)
        return c

    def release(self, c: Connection) -> None:
        self._idle.append(c)

    def close(self) -> None:
        for c in self._all:
            c.close()
