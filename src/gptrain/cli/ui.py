"""`gptrain ui`: the web console over $GPTRAIN_HOME (gptrain/ui/)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("ui", help="open the web console: jobs, curves, logs, checkpoints, datasets",
                       description="Serve the web console on this machine. Bound to 127.0.0.1 by "
                       "default; any other --host requires the access token printed in the URL.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free one)")
    p.add_argument("--open", dest="open_browser", action="store_true", help="open it in a browser")
    p.set_defaults(func=cmd_ui)


def cmd_ui(args, extra) -> int:
    from gptrain.ui.app import serve

    serve(args.host, args.port, args.open_browser)
    return 0
