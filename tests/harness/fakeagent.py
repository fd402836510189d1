"""Loopback servers that stand where an agent should: a trickler (one byte at a time, never done)
and an impostor (answers whatever it is told, to any path, and records what it was sent).

Threads on 127.0.0.1, a free port or a given one; `with` stops them (the listening socket is
closed and the threads are daemons that end with it).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable


class _Server:
    def __init__(self, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.stopped = threading.Event()
        self.requests: list[bytes] = []  # each request's head and body as received
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_guarded, args=(conn,), daemon=True).start()

    def _serve_guarded(self, conn: socket.socket) -> None:
        try:
            with conn:
                self.serve(conn, self._read_request(conn))
        except OSError:
            pass

    @staticmethod
    def _read_request(conn: socket.socket) -> bytes:
        conn.settimeout(5)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                break
            body += chunk
        return head + b"\r\n\r\n" + body

    def serve(self, conn: socket.socket, request: bytes) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.stopped.set()
        try:  # wakes the thread blocked in accept(); close() alone leaves the socket listening
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()

    def __enter__(self) -> "_Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Trickler(_Server):
    """Answers 200 with a long body, one byte every `every` seconds, for `total` bytes."""

    def __init__(self, every: float = 0.2, total: int = 100_000, port: int = 0, in_head: bool = False) -> None:
        self.every = every
        self.total = total
        self.in_head = in_head  # trickle the status line and headers too, not only the body
        super().__init__(port)

    def serve(self, conn: socket.socket, request: bytes) -> None:
        self.requests.append(request)
        head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {self.total}\r\n\r\n".encode()
        if not self.in_head:
            conn.sendall(head)
            head = b""
        for b in head + b" " * self.total:
            if self.stopped.is_set():
                return
            conn.sendall(bytes([b]))
            time.sleep(self.every)


class Impostor(_Server):
    """Answers `status` with `body` (JSON) to every request, as a process that took the agent's
    port would; records every request, so a test can see whether a credential was sent to it."""

    def __init__(self, body: Any, status: int = 200, port: int = 0) -> None:
        self.body = json.dumps(body).encode()
        self.status = status
        super().__init__(port)

    def serve(self, conn: socket.socket, request: bytes) -> None:
        self.requests.append(request)
        conn.sendall(f"HTTP/1.1 {self.status} X\r\nContent-Type: application/json\r\nContent-Length: {len(self.body)}"
                     "\r\nConnection: close\r\n\r\n".encode() + self.body)


def signed_headers(key: str, node: str, method: str, url: str, body: bytes, **extra: str) -> dict[str, str]:
    """The headers of a request to `node`'s agent at `url`, signed with `key` now (core/nodeproof.py)."""
    import time as _time

    from podhealth import httpclient, nodeproof

    s = nodeproof.sign(key, node, method, httpclient.request_path(url), body, _time.time())
    return {**extra, **s.headers}


def proving_middleware(key: "str | Callable[[], str]", node: str) -> Any:
    """An aiohttp middleware for a stand-in agent: proves every answer as the real agent does
    (core/nodeproof.py) when its key (`key`, or what `key()` says now) is set; without one it
    answers as an impostor would."""
    import time as _time

    from aiohttp import web

    from podhealth import nodeproof

    @web.middleware
    async def prove(request: web.Request, handler: Any) -> web.StreamResponse:
        resp = await handler(request)
        nonce = nodeproof.nonce_of(request.headers)
        k = key() if callable(key) else key
        if k and nonce and isinstance(resp, web.Response) and isinstance(resp.body, bytes):
            resp.headers.update(nodeproof.prove(k, node, request.method, request.raw_path, nonce, resp.status,
                                                resp.body, _time.time()))
        return resp
    return prove
