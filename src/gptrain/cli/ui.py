"""`gptrain ui`: the web console over $GPTRAIN_HOME (gptrain/ui/)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("ui", help="open the web console: jobs, curves, logs, checkpoints, datasets",
                       description="Serve the web console on this machine and print the URL to open, "
                       "with your access token (?token=...). Every request needs the token, on "
                       "127.0.0.1 too (other users of the machine reach loopback as well). It is "
                       "kept in $GPTRAIN_HOME/ui-token (0600, made on first use, the same at each "
                       "start; refused if others may read it: chmod 600 it, or remove it for a new "
                       "one). Bound to 127.0.0.1 by default.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0: any free one)")
    p.add_argument("--open", dest="open_browser", action="store_true", help="open the token URL in a browser "
                   "(through a 0600 page in $GPTRAIN_HOME, so no command line shows the token)")
    p.set_defaults(func=cmd_ui)


def cmd_ui(args, extra) -> int:
    from gptrain.ui.app import serve

    serve(args.host, args.port, args.open_browser)
    return 0
