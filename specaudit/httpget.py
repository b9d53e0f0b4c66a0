"""One bounded HTTP GET: a whole-request deadline, a cap on the body, no redirects.

    from specaudit.httpget import get, Timeout, TooLarge, Redirect
    status, content_type, body = get(url, headers, timeout_s=5.0, max_bytes=64 << 20, ssl_context=None)

Why not urllib.request.urlopen: its timeout bounds each socket read, not the request, so a
peer sending one byte a second keeps it reading for ever (a 5 s --timeout ran past 120 s);
it reads any body size into memory (a 2 GB answer took 4.3 GB); and it follows redirects to
another host and port with every header the user gave, an Authorization header included.

Here:
  deadline  a timer shuts the socket down when the whole request (connect, headers, body)
            has taken timeout_s; whatever read was waiting returns, and Timeout is raised.
            Bound: timeout_s plus the time to notice (milliseconds).
  size      a Content-Length over max_bytes is refused before the body is read; a body
            without one is read in 64 KiB pieces and refused as soon as it passes max_bytes.
            Bound: max_bytes + 64 KiB of body in memory.
  redirect  never followed: a 3xx raises Redirect naming where it pointed (printable), so
            credentials never leave the origin the user typed.
"""
from __future__ import annotations

import http.client
import socket
import threading
import time
import urllib.parse

CHUNK = 64 * 1024


class Timeout(OSError):
    """The whole request took longer than its deadline."""


class TooLarge(OSError):
    """The body is larger than max_bytes."""

    def __init__(self, size: int | None, limit: int):
        self.size, self.limit = size, limit
        super().__init__(f"answer larger than {limit} bytes" + (f" ({size} declared)" if size else ""))


class Redirect(OSError):
    """A 3xx answer: not followed."""

    def __init__(self, status: int, location: str):
        self.status, self.location = status, location
        super().__init__(f"HTTP {status} redirect to {location}")


def _shut(conn, fired: list) -> None:
    fired.append(True)
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def get(url: str, headers: dict, timeout_s: float, max_bytes: int, ssl_context=None) -> tuple[int, str, bytes]:
    """(status, content type, body) of one GET; Timeout, TooLarge, Redirect or another
    OSError (refused, unreachable, TLS) otherwise. Non-2xx answers are returned, not raised."""
    u = urllib.parse.urlsplit(url)
    target = (u.path or "/") + (f"?{u.query}" if u.query else "")
    start = time.monotonic()
    if u.scheme == "https":
        conn = http.client.HTTPSConnection(u.hostname, u.port, timeout=timeout_s, context=ssl_context)
    else:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout_s)
    fired: list = []
    timer = threading.Timer(timeout_s, _shut, (conn, fired))
    timer.daemon = True
    timer.start()
    try:
        conn.request("GET", target, headers=headers)
        r = conn.getresponse()
        if 300 <= r.status < 400:
            raise Redirect(r.status, r.getheader("Location") or "(no Location)")
        declared = r.getheader("Content-Length")
        if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
            raise TooLarge(int(declared), max_bytes)
        chunks, n = [], 0
        while True:
            b = r.read(CHUNK)
            if not b:
                break
            n += len(b)
            if n > max_bytes:
                raise TooLarge(None, max_bytes)
            chunks.append(b)
            if fired:
                break
        if fired:
            raise Timeout(f"no whole answer within {timeout_s:g}s")
        return r.status, r.getheader("Content-Type") or "", b"".join(chunks)
    except (Timeout, TooLarge, Redirect):
        raise
    except (OSError, http.client.HTTPException) as e:
        if fired or time.monotonic() - start >= timeout_s:
            raise Timeout(f"no whole answer within {timeout_s:g}s") from None
        if isinstance(e, OSError):
            raise
        raise OSError(f"not an HTTP answer ({type(e).__name__})") from None
    finally:
        timer.cancel()
        conn.close()
