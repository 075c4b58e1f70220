"""Who may talk to the console, checked on every request before any route runs.

- Only its owner. Every request (pages, API, event streams, static files), on every address the
  console is bound to, loopback included, must carry the owner's access token: `?token=` in the
  URL `gptrain ui` prints (as Jupyter does; it is then kept in an HttpOnly, SameSite=Strict
  cookie, and a browser is sent on to the same page without it), the cookie, or an
  `Authorization: token T` header. Without it: 401, and nothing else (no CSRF token, no page).
  The token lives in `$GPTRAIN_HOME/ui-token`, made on first use (0600, O_EXCL) and refused
  when anyone else may read or write it: another user of a shared machine can reach 127.0.0.1
  as well as the owner can.
- Bound to a loopback address (the default), the console also answers only requests whose Host
  is a loopback name (a web page that re-points its own domain at 127.0.0.1, "DNS rebinding",
  is refused).
- Every POST (stop, remove) must come from the console's own pages: an Origin (or Referer) of
  this very host and port, AND the per-server CSRF token the pages carry in an X-CSRF-Token
  header. Another site can send neither.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import re
import secrets
import stat
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import parse_qs, unquote_plus, urlsplit

from gptrain.errors import UserError

COOKIE = "gptrain_ui_token"
LOOPBACK_NAMES = ("localhost",)
TOKEN_FILE = "ui-token"  # under $GPTRAIN_HOME
TOKEN_RE = re.compile(r"[A-Za-z0-9_-]{32,256}")


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


def cookie_name(port: int) -> str:
    """One cookie per port: a browser sends a host's cookies to all its ports, and two consoles
    (two $GPTRAIN_HOMEs, two tokens) would otherwise overwrite each other's."""
    return f"{COOKIE}_{port}"


# ---- the owner's token ------------------------------------------------------------------------

def owner_token(path: Path) -> str:
    """The console's access token, kept in `path`: read it, or make it on first use (0600,
    created under a temporary name with O_EXCL and linked into place, so two `gptrain ui`
    starting at once read the same whole token). A file anyone but its owner, us, may read or
    write, a link, or anything but a token is refused in one line, its content never shown."""
    for _ in range(3):
        try:
            return _read_token(path)
        except FileNotFoundError:
            _make_token(path)
    return _read_token(path)


def _read_token(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as e:  # a link (ELOOP), no permission, ...
        why = "is a symbolic link" if os.path.islink(path) else f"cannot be read ({e.strerror})"
        raise UserError(f"the console's token file {path} {why}: remove it "
                        "(`gptrain ui` then makes a new one)") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"the console's token file {path} is not a regular file: remove it "
                            "(`gptrain ui` then makes a new one)")
        if st.st_uid != os.geteuid():
            raise UserError(f"the console's token file {path} belongs to uid {st.st_uid}, not to you "
                            f"(uid {os.geteuid()}): remove it (`gptrain ui` then makes a new one)")
        if st.st_mode & 0o077:
            raise UserError(f"the console's token file {path} has mode {stat.S_IMODE(st.st_mode):04o}: "
                            f"others may read or change it; run `chmod 600 {path}` (or remove it for a "
                            "new token if someone may have read it)")
        token = os.read(fd, 4096).decode("ascii", "replace").strip()
    finally:
        os.close(fd)
    if not TOKEN_RE.fullmatch(token):
        raise UserError(f"the console's token file {path} holds no token: remove it "
                        "(`gptrain ui` then makes a new one)")
    return token


def _make_token(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        os.unlink(tmp)  # left by a killed process that had our pid
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask: readable by us, by no one else
        os.write(fd, (secrets.token_urlsafe(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another `gptrain ui` made it a moment ago: theirs is read
    finally:
        os.unlink(tmp)


# ---- the checks -------------------------------------------------------------------------------

def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def _host_name(host_header: str) -> str:
    """'127.0.0.1' of '127.0.0.1:8765', '::1' of '[::1]:8765'."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0]
    return host_header.rsplit(":", 1)[0] if host_header.count(":") == 1 else host_header


class Guard:
    """ASGI middleware: the checks above, then the app. `loopback`: the console is bound to a
    loopback address, so only loopback Host names are answered."""

    def __init__(self, app, token: str, csrf: str, loopback: bool = True, cookie: str = COOKIE):
        if not token:
            raise ValueError("the console needs an access token")
        self.app, self.token, self.csrf, self.loopback, self.cookie = app, token, csrf, loopback, cookie

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self.app(scope, receive, send)
        if scope["type"] != "http":  # the console has no websockets: nothing else gets past
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})
            return None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host = headers.get("host", "")
        if self.loopback and not is_loopback(_host_name(host)):
            return await _deny(send, 403, "this console answers only loopback host names")
        given, where = self._token_of(scope, headers)
        if not _same(given, self.token):
            return await _deny(send, 401, "missing or wrong token: open the URL `gptrain ui` printed")
        if scope["method"] not in ("GET", "HEAD"):
            why = self._csrf_problem(headers, host, scope.get("scheme", "http"))
            if why:
                return await _deny(send, 403, why)
        if where == "query" and scope["method"] == "GET" and _navigation(headers):
            return await self._without_token(scope, send)
        if where == "cookie":
            return await self.app(scope, receive, send)

        async def send_with_cookie(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self._set_cookie()]}
            await send(message)

        return await self.app(scope, receive, send_with_cookie)

    def _set_cookie(self) -> tuple[bytes, bytes]:
        return b"set-cookie", f"{self.cookie}={self.token}; HttpOnly; SameSite=Strict; Path=/".encode()

    async def _without_token(self, scope, send) -> None:
        """A browser that opened the printed URL gets its cookie and is sent on to the same page
        without ?token=, so the token stays out of the address bar (and what it shows others)."""
        raw = scope.get("raw_path") or scope["path"].encode()
        path = b"/" + raw.lstrip(b"/\\").replace(b"\\", b"%5C")  # never //other.host nor /\other.host
        query = b"&".join(p for p in scope.get("query_string", b"").split(b"&")  # (%74oken= too)
                          if p and unquote_plus(p.split(b"=", 1)[0].decode("latin-1")) != "token")
        location = path + (b"?" + query if query else b"")
        await send({"type": "http.response.start", "status": 303,
                    "headers": [(b"location", location), self._set_cookie(), (b"cache-control", b"no-store"),
                                (b"referrer-policy", b"no-referrer"), (b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    def _token_of(self, scope, headers) -> tuple[str | None, str]:
        """The token the request carries, and where: "header", "query" or "cookie"."""
        auth = headers.get("authorization", "")
        if auth.lower().startswith("token "):
            return auth[6:].strip(), "header"
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if "token" in query:
            return query["token"][0], "query"
        return _cookie(headers, self.cookie), "cookie"

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


def _navigation(headers) -> bool:
    """A browser opening a page (not a script's fetch, an EventSource, curl or urllib)."""
    mode = headers.get("sec-fetch-mode")
    return mode == "navigate" if mode else "text/html" in headers.get("accept", "")


def _cookie(headers, name: str) -> str | None:
    jar = SimpleCookie()
    try:
        jar.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header is no cookie
        return None
    return jar[name].value if name in jar else None


async def _deny(send, status: int, why: str) -> None:
    body = (why + "\n").encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
