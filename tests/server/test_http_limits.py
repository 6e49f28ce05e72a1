"""HTTP-level limits: a request with too many header fields or too many header bytes is refused
(431 in the OpenAI error shape, or the HTTP layer's own 400) and its connection closed; the server
goes on serving the next request.
"""

from __future__ import annotations

import contextlib
import socket

import httpx
import pytest

from tests.server.fake_engine import FakeEngine, expected_greedy_text
from tests.server.live import LiveServer

OK = {"model": "fake-model", "prompt": "hi", "max_tokens": 2, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    with LiveServer(FakeEngine) as live:
        yield live


def raw_request(live: LiveServer, headers: list[tuple[str, str]]) -> tuple[int, bytes, bool]:
    """Sends one POST over a raw socket: (status, whole answer, whether the server closed)."""
    body = b'{"prompt": "hi", "max_tokens": 2}'
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += f"Content-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers) + "\r\n"
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        # The server may answer and close before it read everything.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(head.encode("latin-1") + body)
        answer = b""
        while not _complete(answer):
            chunk = _recv(sock)
            if not chunk:
                return int(answer.split()[1]), answer, True
            answer += chunk
        sock.settimeout(0.5)
        closed = _recv(sock) == b""
    return int(answer.split()[1]), answer, closed


def _recv(sock: socket.socket) -> bytes | None:
    try:
        return sock.recv(65536)
    except ConnectionResetError:
        return b""
    except TimeoutError:
        return None


def _complete(answer: bytes) -> bool:
    head, sep, rest = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(rest) >= int(value)
    return False


def assert_refused(status: int, answer: bytes, closed: bool) -> None:
    assert status in (400, 431), answer[:300]
    assert closed  # the connection is not reused after a refused header section
    if status == 431:
        assert b'"code":"request_header_fields_too_large"' in answer
        assert b'"type":"invalid_request_error"' in answer


def test_a_100kb_header_is_refused_and_the_server_goes_on(server):
    status, answer, closed = raw_request(server, [("X-Big", "a" * 100_000)])
    assert_refused(status, answer, closed)
    ok = httpx.post(server.url + "/v1/completions", json=OK)
    assert ok.json()["choices"][0]["text"] == expected_greedy_text(
        server.state.tokenizer.encode("hi", True), 2
    )


def test_200_header_fields_are_refused_with_431(server):
    status, answer, closed = raw_request(server, [(f"X-H{i}", "v") for i in range(200)])
    assert status == 431 and closed
    assert_refused(status, answer, closed)
    assert httpx.post(server.url + "/v1/completions", json=OK).status_code == 200


def test_headers_just_under_the_limits_are_served(server):
    many = [(f"X-H{i}", "v") for i in range(80)]
    assert raw_request(server, many)[0] == 200
    assert raw_request(server, [("X-Big", "a" * 20_000)])[0] == 200


def test_header_limits_are_settings():
    with LiveServer(FakeEngine, max_headers=10, max_header_bytes=2048) as live:
        assert raw_request(live, [(f"X-H{i}", "v") for i in range(12)])[0] == 431
        assert raw_request(live, [("X-Big", "a" * 3000)])[0] == 431
        assert raw_request(live, [("X-Ok", "a" * 500)])[0] == 200
        tgi = httpx.post(
            live.url + "/generate", json={"inputs": "x"}, headers={"X-Big": "a" * 3000}
        )
        assert tgi.status_code == 431 and tgi.json()["error_type"] == "validation"
