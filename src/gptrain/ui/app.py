"""`gptrain ui`: the web console as an ASGI app (Starlette) served by uvicorn.

create_app builds the app behind security.Guard; serve runs it, printing the URL to open with
the owner's access token (kept in $GPTRAIN_HOME/ui-token, 0600: security.owner_token), on every
address, loopback included: another user of the machine reaches 127.0.0.1 too.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

from gptrain.errors import UserError
from gptrain.home import home
from gptrain.ui import security


def create_app(token: str, csrf: str | None = None, loopback: bool = True, port: int | None = None):
    from starlette.applications import Starlette

    from gptrain.ui.routes import ROUTES

    app = Starlette(routes=ROUTES)
    app.state.csrf = csrf or security.new_token()
    cookie = security.cookie_name(port) if port else security.COOKIE
    return security.Guard(app, token, app.state.csrf, loopback=loopback, cookie=cookie)


def serve(host: str = "127.0.0.1", port: int = 8765, open_browser: bool = False) -> None:
    try:
        import uvicorn
    except ImportError:
        raise UserError("the console needs its extra: pip install 'gptrain[ui]'") from None
    token_file = home() / security.TOKEN_FILE
    token = security.owner_token(token_file)
    sock = bind(host, port)
    address, port = sock.getsockname()[:2]
    loopback = security.is_loopback(address)
    app = create_app(token, loopback=loopback, port=port)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/?token={token}"
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    print(f"gptrain ui: serving $GPTRAIN_HOME at {url}  (only with its token, kept in {token_file}; "
          + ("loopback only: --host ADDR to share it)" if loopback else "open to the network: prefer ssh -L)"),
          flush=True)
    if open_browser:
        open_in_browser(url, home() / "ui-open.html")
    from gptrain.ui.views import warm

    threading.Thread(target=warm, name="warm-metrics", daemon=True).start()
    server.run(sockets=[sock])


def open_in_browser(url: str, page: Path) -> None:
    """Open `url` in a browser without putting the token on a command line (the browser's argv
    is readable by every user of the machine in /proc): the browser opens a 0600 file of ours
    that sends it on to the URL, as Jupyter does."""
    import html
    import webbrowser

    tmp = page.with_name(f".{page.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        target = html.escape(url, quote=True)
        f.write(f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url={target}">'
                f'<title>gptrain ui</title><a href="{target}">open the console</a>\n')
    os.replace(tmp, page)
    webbrowser.open(page.resolve().as_uri())


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0: any free one), or one clear UserError."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port {port} is not a port: use 1-65535 (or 0 for any free one)")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as e:
        raise UserError(f"--host {host}: {e.strerror}; give an address of this machine") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror} (in use? try another --port)") from None
    return sock
