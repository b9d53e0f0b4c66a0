"""Hostile HTTP peers on 127.0.0.1 (a test helper, not a test).

    with HostilePeer("drip") as peer:          # peer.url; peer.seen: the request heads received
        ...

Modes:
    drip        a valid JSON answer sent one byte every `delay` seconds (headers included)
    huge        Content-Length of 2 GB, then zeros as fast as the client reads
    endless     no Content-Length, a body that never ends (chunked), as fast as read
    redirect    302 to `location` (another origin: a recorder); every request head kept
    body        `body` (bytes) as a 200 application/json answer, for every path
    bodies      `bodies[path]` for that path (e.g. /api/v1/series), else 404

Each connection runs in a daemon thread; close() (or leaving the `with`) stops the
listener and every connection. Free port, loopback only.
"""
from __future__ import annotations

import socket
import threading
import time

CRLF = b"\r\n"


class HostilePeer:
    def __init__(self, mode: str, *, body: bytes = b"", bodies: dict | None = None, location: str = "",
                 delay: float = 0.2, status: int = 200):
        self.mode, self.body, self.bodies, self.location = mode, body, bodies or {}, location
        self.delay, self.status = delay, status
        self.seen: list[bytes] = []
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self.stop.set()
        for c in [self.sock, *self.conns]:
            try:
                c.close()
            except OSError:
                pass

    def _accept(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _head(self, c) -> bytes:
        c.settimeout(5)
        buf = b""
        while b"\r\n\r\n" not in buf and len(buf) < 65536:
            b = c.recv(4096)
            if not b:
                break
            buf += b
        self.seen.append(buf)
        return buf

    def _serve(self, c):
        try:
            head = self._head(c)
            path = head.split(b" ", 2)[1].split(b"?", 1)[0].decode() if head.count(b" ") >= 2 else "/"
            m = self.mode
            if m == "drip":
                msg = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                       + str(len(self.body)).encode() + b"\r\n\r\n" + self.body)
                for i in range(len(msg)):
                    if self.stop.is_set():
                        return
                    c.sendall(msg[i:i + 1])
                    time.sleep(self.delay)
            elif m in ("huge", "endless"):
                hdr = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       + (b"Content-Length: 2000000000\r\n" if m == "huge" else b"Transfer-Encoding: chunked\r\n")
                       + b"\r\n")
                c.sendall(hdr)
                block = b"0" * 65536
                chunk = (b"%x\r\n" % len(block)) + block + CRLF
                while not self.stop.is_set():
                    c.sendall(block if m == "huge" else chunk)
            elif m == "redirect":
                c.sendall(f"HTTP/1.1 302 Found\r\nLocation: {self.location}\r\nContent-Length: 0\r\n\r\n".encode())
            else:
                body = self.body if m == "body" else self.bodies.get(path)
                if body is None:
                    c.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                else:
                    c.sendall(f"HTTP/1.1 {self.status} X\r\nContent-Type: application/json\r\nContent-Length: "
                              f"{len(body)}\r\n\r\n".encode() + body)
        except OSError:
            pass
        finally:
            try:
                c.close()
            except OSError:
                pass
