"""`gptrain ui`: the web console as an ASGI app (Starlette) served by uvicorn.

create_app builds the app behind security.Guard; serve runs it, printing the URL to open (with
the access token when bound to a non-loopback address: printed once, never stored).
"""

from __future__ import annotations

import socket
import threading

from gptrain.errors import UserError
from gptrain.ui import security


def create_app(token: str | None = None, csrf: str | None = None):
    from starlette.applications import Starlette

    from gptrain.ui.routes import ROUTES

    app = Starlette(routes=ROUTES)
    app.state.csrf = csrf or security.new_token()
    return security.Guard(app, token, app.state.csrf)


def serve(host: str = "127.0.0.1", port: int = 8765, open_browser: bool = False) -> None:
    try:
        import uvicorn
    except ImportError:
        raise UserError("the console needs its extra: pip install 'gptrain[ui]'") from None
    sock = bind(host, port)
    address, port = sock.getsockname()[:2]
    token = None if security.is_loopback(address) else security.new_token()
    app = create_app(token)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    config = uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    print(f"gptrain ui: serving $GPTRAIN_HOME at {url}" +
          ("" if token else "  (loopback only; --host ADDR to share it, with a token)"), flush=True)
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    from gptrain.ui.views import warm

    threading.Thread(target=warm, name="warm-metrics", daemon=True).start()
    server.run(sockets=[sock])


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
