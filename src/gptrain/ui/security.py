"""Who may talk to the console, checked on every request before any route runs.

- Bound to a loopback address (the default), the console answers only requests whose Host is a
  loopback name (a web page that re-points its own domain at 127.0.0.1, "DNS rebinding", is
  refused), and needs no token.
- Bound to anything else, every request (pages, API, event streams, static files) must carry the
  access token: `?token=` in the URL printed at start (as Jupyter does; it is then kept in an
  HttpOnly, SameSite=Strict cookie), the cookie, or an `Authorization: token T` header.
- Every POST (stop, remove) must come from the console's own pages: an Origin (or Referer) of
  this very host and port, AND the per-server CSRF token the pages carry in an X-CSRF-Token
  header. Another site can send neither.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from http.cookies import SimpleCookie
from urllib.parse import parse_qs, urlsplit

COOKIE = "gptrain_ui_token"
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def new_token() -> str:
    return secrets.token_urlsafe(24)


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def _host_name(host_header: str) -> str:
    """'127.0.0.1' of '127.0.0.1:8765', '::1' of '[::1]:8765'."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class Guard:
    """ASGI middleware: the checks above, then the app. token=None means loopback mode."""

    def __init__(self, app, token: str | None, csrf: str):
        self.app, self.token, self.csrf = app, token, csrf

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if self.token is None and not is_loopback(_host_name(host)):
            return await _deny(send, 403, "this console answers only loopback host names")
        set_cookie = False
        if self.token is not None:
            given = self._token_of(scope, headers)
            if not _same(given, self.token):
                return await _deny(send, 401, "missing or wrong token: open the URL `gptrain ui` printed")
            set_cookie = _same(_cookie(headers), self.token) is False
        if scope["method"] not in ("GET", "HEAD"):
            why = self._csrf_problem(headers, host, scope.get("scheme", "http"))
            if why:
                return await _deny(send, 403, why)
        if not set_cookie:
            return await self.app(scope, receive, send)

        async def send_with_cookie(message):
            if message["type"] == "http.response.start":
                cookie = f"{COOKIE}={self.token}; HttpOnly; SameSite=Strict; Path=/"
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"set-cookie", cookie.encode())]}
            await send(message)

        return await self.app(scope, receive, send_with_cookie)

    def _token_of(self, scope, headers) -> str | None:
        auth = headers.get("authorization", "")
        if auth.lower().startswith("token "):
            return auth[6:].strip()
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "token" in query:
            return query["token"][0]
        return _cookie(headers)

    def _csrf_problem(self, headers, host: str, scheme: str) -> str | None:
        source = headers.get("origin") or headers.get("referer")
        if not source or source == "null":
            return "cross-site request refused: no Origin or Referer"
        parts = urlsplit(source)
        if parts.netloc != host or parts.scheme != scheme:
            return f"cross-site request refused: Origin {parts.scheme}://{parts.netloc} is not this console"
        if not _same(headers.get("x-csrf-token"), self.csrf):
            return "cross-site request refused: missing or wrong X-CSRF-Token"
        return None


def _cookie(headers) -> str | None:
    jar = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header is no cookie
        return None
    return jar[COOKIE].value if COOKIE in jar else None


async def _deny(send, status: int, why: str) -> None:
    body = (why + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
