"""`gptrain ui`: the web console as an ASGI app (Starlette) served by uvicorn.

create_app builds the app behind security.Guard; serve runs it, printing the URL to open (with
the access token when bound to a non-loopback address: printed once, never stored).
"""

from __future__ import annotations

import sys
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
    token = None if security.is_loopback(host) else security.new_token()
    app = create_app(token)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/" + (f"?token={token}" if token else "")
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    print(f"gptrain ui: serving $GPTRAIN_HOME at {url}" +
          ("" if token else "  (loopback only; --host ADDR to share it, with a token)"), flush=True)
    if open_browser:
        import webbrowser

        webbrowser.open(url)
    from gptrain.ui.views import warm

    threading.Thread(target=warm, name="warm-metrics", daemon=True).start()
    server.run()
    if not server.started:
        raise UserError(f"could not listen on {host}:{port} (in use? try --port)")
    sys.stdout.flush()
