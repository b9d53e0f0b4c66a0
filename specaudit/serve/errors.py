"""Errors the server answers as OpenAI-shaped JSON, and the statuses it uses.

    {"error": {"message": "...", "type": "invalid_request_error", "param": "max_tokens", "code": "invalid_value"}}

Statuses:
    400  malformed JSON (bad syntax, a number too long to read, nesting too deep, text
         that is not valid Unicode), a body that is not an object
    408  the body did not arrive within the body-read deadline (http.BODY_READ_S)
    404  unknown path or model        405  wrong method for a known path
    413  body over the size limit, or a prompt that alone fills the context
    422  unknown fields, wrong types, values out of range (prompt + max_tokens past the
         context included: code context_length_exceeded), sampling options this greedy
         (lossless) server does not implement
    429  the queue is full: retry later
    500  a bug of ours (logged with its traceback; the client gets one line)
    503  the server is shutting down
"""
from __future__ import annotations

STATUSES = (400, 404, 405, 408, 413, 422, 429, 500, 503)


class HTTPError(Exception):
    """An error answered as OpenAI-shaped JSON with `status`."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 etype: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.etype = etype or ("server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.etype, "param": self.param, "code": self.code}}


def short(v, n: int = 60) -> str:
    """A client's value quoted in an error message, cut to n characters (a 4000-digit
    number or a megabyte string must not come back whole)."""
    try:
        s = repr(v)
    except Exception:
        s = f"<{type(v).__name__}>"
    return s if len(s) <= n else s[: n - 3] + "..."
