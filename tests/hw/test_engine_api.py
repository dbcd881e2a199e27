"""The container engine's API over its unix socket (m3ctl.hw.host._engine_get, the standard library's HTTP client):
each answer form an engine may send is read: a ``Content-Length`` body (also on a connection the engine keeps
open), a body ended by closing the connection, a chunked one; anything else is a finding, never a crash."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from m3ctl.hw.host import _engine_get, container_facts, inspect_image_config

VERSION = {"Version": "28.1.1", "ApiVersion": "1.49"}
INFO = {"Runtimes": {"runc": {}, "nvidia": {}}, "OperatingSystem": "Debian"}


def _length(doc: dict) -> bytes:
    body = json.dumps(doc).encode()
    head = f"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


def _chunked(doc: dict) -> bytes:
    body = json.dumps(doc).encode()
    parts = [body[:7], body[7:]]
    chunks = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts)
    return b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"


def _until_close(doc: dict) -> bytes:
    return b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + json.dumps(doc).encode()


@contextlib.contextmanager
def engine(tmp_path: Path, answers: dict[str, bytes], *, keep_open: bool = False) -> Iterator[tuple[str, list[str]]]:
    """A fake engine on a unix socket: each request's path gets its canned answer (404 otherwise), then the
    connection is closed (``keep_open``: left open until the test ends). Yields the socket path and the request
    lines it received."""
    path = str(tmp_path / "engine.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen()
    seen: list[str] = []
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return  # closed: the test is over
            req = b""
            while b"\r\n\r\n" not in req and (chunk := conn.recv(4096)):
                req += chunk
            line = req.split(b"\r\n")[0].decode()
            seen.append(line)
            url = line.split(" ")[1]
            conn.sendall(answers.get(url, b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n"))
            if keep_open:
                held.append(conn)
            else:
                conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        yield path, seen
    finally:
        srv.shutdown(socket.SHUT_RDWR)
        srv.close()
        for c in held:
            c.close()
        t.join(timeout=10)


@pytest.mark.parametrize("form", [_length, _chunked, _until_close])
def test_each_answer_form_is_read(tmp_path, form):
    with engine(tmp_path, {"/version": form(VERSION)}) as (path, seen):
        assert _engine_get(path, "/version", 5.0) == VERSION
    assert seen == ["GET /version HTTP/1.1"]


def test_a_length_answer_on_a_connection_kept_open_is_read_without_waiting_for_the_close(tmp_path):
    with engine(tmp_path, {"/version": _length(VERSION)}, keep_open=True) as (path, _):
        assert _engine_get(path, "/version", 30.0) == VERSION


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.0 500 Internal Server Error\r\nContent-Length: 2\r\n\r\n{}", OSError),
        (b"SSH-2.0-OpenSSH_9.2\r\n", ValueError),  # no HTTP at all
        (b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nnope!", ValueError),  # no JSON
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", ValueError),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{}", ValueError),  # cut short
    ],
)
def test_a_bad_answer_is_an_error_the_probe_reports(tmp_path, answer, error):
    with engine(tmp_path, {"/version": answer}) as (path, _), pytest.raises(error):
        _engine_get(path, "/version", 5.0)


def test_container_facts_read_the_engine_version_and_runtimes(tmp_path):
    with engine(tmp_path, {"/version": _chunked(VERSION), "/info": _length(INFO)}) as (path, seen):
        c = container_facts(Path("/"), {"DOCKER_HOST": f"unix://{path}"})
    assert c.docker_reachable and c.docker_version == "28.1.1" and c.docker_socket == path
    assert c.runtimes == ("nvidia", "runc")
    assert seen == ["GET /version HTTP/1.1", "GET /info HTTP/1.1"]


def test_an_engine_that_answers_no_http_is_unreachable_with_why(tmp_path):
    with engine(tmp_path, {"/version": b"garbage\r\n\r\n"}) as (path, _):
        c = container_facts(Path("/"), {"DOCKER_HOST": f"unix://{path}"})
    assert c.docker_reachable is False and c.docker_error.startswith("ValueError: no HTTP answer")


def test_an_image_not_pulled_has_no_config(tmp_path):
    cfg = {"Config": {"Env": ["A=1"], "Labels": {"x": "y"}}}
    with engine(tmp_path, {"/images/vllm%2Fvllm-openai%3Av1/json": _until_close(cfg)}) as (path, _):
        env = {"DOCKER_HOST": f"unix://{path}"}
        assert inspect_image_config("vllm/vllm-openai:v1", env) == cfg["Config"]
        assert inspect_image_config("not/pulled:1", env) is None  # 404
