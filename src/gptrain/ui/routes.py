"""The console's URLs: six pages, their JSON API, the live streams and the actions.

Pages are one HTML shell (static/page.html) naming the page's script; the data comes from the
API, then from an event stream. Actions are POST only (security.py checks origin and CSRF
token before they get here) and call what the CLI calls: `gptrain stop`, `gptrain rm`,
`gptrain run` (a new run, or a job run again with its flags and config edited: jobs/api.py's
Request, the same checks and one-line errors), `gptrain generate` (models/api.py).
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from pathlib import Path

from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from gptrain.errors import BadName, NotFound, UserError
from gptrain.jobs import api
from gptrain.models import api as models_api
from gptrain.ui import sse, views
from gptrain.ui.downsample import MAX_POINTS
from gptrain.ui.metrics import CURVES, XS

STATIC = resources.files("gptrain.ui") / "static"
class CachedStatic(StaticFiles):
    """The scripts, styles and chart library: cached by browsers for a day; pages name them with
    ?v=VERSION, which changes whenever any of them does."""

    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "public, max-age=86400"
        return response


def _version() -> str:
    import hashlib

    from gptrain import __version__

    stamp = [__version__] + [f"{p.name}:{p.stat().st_mtime_ns}" for p in sorted(Path(str(STATIC)).iterdir())]
    return hashlib.sha1("|".join(stamp).encode()).hexdigest()[:10]


VERSION = _version()
# how numbers and tables read, the same spec the CLI's render.py reads, and the jobs' states and
# stop grace (jobs/api.FACTS): the page's gp.R (an attribute value: HTML-escaped)
RENDER = html.escape(json.dumps({**json.loads((resources.files("gptrain") / "assets" / "render.json").read_text()),
                                 **api.FACTS}), quote=True)
LOG_PAGES_PER_TICK = 8  # a log stream sends at most 8 pages (512 KiB) each half second
PAGES = {"jobs": "Jobs", "job": "Job", "compare": "Compare", "datasets": "Datasets", "sweeps": "Sweeps",
         "sweep": "Sweep"}
NAMED = {"job": api.known, "sweep": api.sweep_report}  # a page of one thing: refused when it is not there


def _int(value, default: int, low: int = 0, high: int = 10 ** 12) -> int:
    try:
        return min(max(int(value), low), high)
    except (TypeError, ValueError):
        return default


async def _call(fn, *args):
    """fn(*args) in a worker thread, its answer as JSON; our exceptions as 400/404/409."""
    try:
        return JSONResponse(await run_in_threadpool(fn, *args))
    except UserError as e:
        return JSONResponse({"error": str(e)}, status_code=_status(e))


def answer(fn, *names):
    """An endpoint answering fn(the path parameters `names`) as JSON (_call)."""
    async def endpoint(request):
        return await _call(fn, *(request.path_params[n] for n in names))
    return endpoint


def _status(e: Exception) -> int:
    """400 for a malformed name, 404 for an unknown one, 409 for what the job refuses."""
    return 400 if isinstance(e, BadName) else 404 if isinstance(e, NotFound) else 409


def _refused(e: Exception) -> PlainTextResponse:
    """A page, download or stream refused, in plain text."""
    return PlainTextResponse(str(e), status_code=_status(e))


# ---- pages ------------------------------------------------------------------------------------

def page(name: str):
    async def endpoint(request):
        title = PAGES[name]
        if name in NAMED:
            try:
                await run_in_threadpool(NAMED[name], request.path_params["name"])
            except UserError as e:
                return _refused(e)
            title = request.path_params["name"]
        html = (STATIC / "page.html").read_text().replace("{{title}}", title).replace(
            "{{page}}", name).replace("{{csrf}}", request.app.state.csrf).replace("{{v}}", VERSION).replace(
            "{{render}}", RENDER)
        return HTMLResponse(html, headers={"Cache-Control": "no-store"})
    return endpoint


# ---- API --------------------------------------------------------------------------------------

async def api_jobs(request):
    return await _call(api.rows, request.query_params.get("state") or None)


def job_detail(name: str) -> dict:
    """What the job page shows but curves and logs: `inspect`'s report, as the table last found it."""
    return api.report(name, fresh=False)


async def api_curves(request):
    x = request.query_params.get("x", "step")
    if x not in XS:
        return JSONResponse({"error": f"x must be one of {', '.join(XS)}"}, status_code=400)
    points = _int(request.query_params.get("max"), MAX_POINTS, 0, 10 ** 6)
    return await _call(views.curves, request.path_params["name"], x, points or None)


def _offset(request) -> int | None:
    """The byte offset a log read starts at; None (the log's last page) when not given."""
    offset = request.query_params.get("offset")
    return _int(offset, 0) if offset is not None else None


async def api_log(request):
    """One page of a rank's log (whole lines, capped, masked) and the offset of the next."""
    def read():
        text, end = api.read_log(request.path_params["name"], request.path_params["rank"], _offset(request))
        return {"text": text, "offset": end}
    return await _call(read)


async def api_sweep(request):
    return await _call(views.sweep, request.path_params["name"], _int(request.query_params.get("max"), MAX_POINTS, 1, 10 ** 6))


def download(fmt: str):
    """A checkpoint as a zip: as it is (`native`) or exported as a HF model (`hf`)."""
    async def endpoint(request):
        try:
            tmp, top = await run_in_threadpool(api.checkpoint_zip, request.path_params["name"],
                                               request.path_params["id"], fmt)
        except UserError as e:
            return _refused(e)
        return FileResponse(tmp, media_type="application/zip", filename=f"{top}.zip",
                            background=BackgroundTask(os.unlink, tmp))
    return endpoint


# ---- actions ----------------------------------------------------------------------------------

def _stop(name: str) -> dict:
    """What `gptrain stop NAME` does: the workers save a checkpoint and exit (forced after
    api.STOP_TIMEOUT_S)."""
    return {"state": api.stop(name, api.STOP_TIMEOUT_S)}


def _remove(name: str) -> dict:
    views.forget(name)
    return {"removed": name}


MAX_BODY = 1 << 20  # an action's JSON: a form's fields, a config, a prompt


async def _body(request) -> dict:
    """The JSON object a form posted (UserError: too large, not JSON, not an object)."""
    import json

    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise UserError(f"the request is larger than {MAX_BODY} bytes")
    try:  # nesting and item count bounded: a 100,000-deep body is one line, not a RecursionError (500)
        body = api.parse_user_text(json.loads, raw or b"{}", "the request")
    except ValueError:
        raise UserError("the request is not JSON") from None
    if not isinstance(body, dict):
        raise UserError("the request is not a JSON object")
    return body


def _text(body: dict, key: str, default: str | None = "") -> str | None:
    value = body.get(key, default)
    if value is not None and not isinstance(value, str):
        raise UserError(f"{key} must be text")
    return value


def _flags(text: str | None) -> list[str] | None:
    """Flags or arguments as typed (a shell's words, one line or many)."""
    import shlex

    if text is None:
        return None
    try:
        return shlex.split(text)
    except ValueError as e:
        raise UserError(f"the flags: {e}") from None


def _submitted(spec_notes) -> dict:
    spec, notes = spec_notes
    return {"name": spec.name, "notes": notes}


LAUNCH_FIELDS = {"name", "dataset", "args", "config", "scheduler", "nodes", "accels", "options"}


def _launch(body: dict) -> dict:
    """A new run: `gptrain run NAME --dataset DS [--scheduler S --nodes N --accels M --ENGINE-OPTION V]
    [--config] -- FLAGS`; each engine's options as it declares them (jobs/api.ENGINE_OPTIONS)."""
    dataset, scheduler = _text(body, "dataset"), _text(body, "scheduler") or None
    accels = _text(body, "accels") or None
    if accels is not None and not accels.strip().isdigit():
        raise UserError(f"accels must be a whole number, got {accels!r}")
    engine = {"slurm": {}, "kubernetes": {}}
    given = body.get("options") or {}
    if not isinstance(given, dict):
        raise UserError("options must be a mapping of an engine's options")
    declared = {o.key: o for o in api.ENGINE_OPTIONS.get(scheduler, ()) if o.flag}
    for key, text in given.items():
        if key not in declared:
            raise UserError(f"{scheduler or 'the default'} scheduler has no option {key!r}")
        if text not in (None, ""):
            engine[scheduler][key] = _option_value(declared[key], text)
    request = api.Request(name=_text(body, "name") or None, datasets=[dataset] if dataset else None,
                          entry=_flags(_text(body, "args")) or [], config_text=_text(body, "config", None) or None,
                          scheduler=scheduler, nodes=_text(body, "nodes") or None,
                          accels=int(accels) if accels is not None else None, **engine)
    return _submitted(api.submit(request))


def _option_value(option, text):
    """An engine option's value as its flag takes it: a number, words, or the text."""
    if not isinstance(text, str):
        raise UserError(f"{option.flag} must be text")
    if option.kind == "int":
        if not text.strip().isdigit():
            raise UserError(f"{option.flag} must be a whole number, got {text!r}")
        return int(text)
    return _flags(text) if option.kind == "list" else text


def _rerun(old: str, body: dict) -> dict:
    return _submitted(api.rerun(old, _text(body, "name"), _flags(_text(body, "args", None)),
                                _text(body, "config", None)))


def _generate(name: str, body: dict) -> dict:
    """Text from the job's checkpoint `checkpoint` (an ID; default its newest): `gptrain generate`."""
    def number(key, kind, default):
        value = body.get(key, default)
        if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{key} must be a number")
        return kind(value)

    api.known(name)
    ckpt = _text(body, "checkpoint") or None
    sampling = models_api.Sampling(prompt=_text(body, "prompt"), max_new_tokens=number("max_new_tokens", int, 50),
                                   temperature=number("temperature", float, 0.8))
    return {"texts": api.generate(api.checkpoint(ckpt, name)["id"] if ckpt else name, sampling)}


async def action_launch(request):
    try:
        body = await _body(request)
        unknown = sorted(set(body) - LAUNCH_FIELDS)
        if unknown:  # (a misspelled field launched a run without it)
            raise UserError(f"unknown field {unknown[0]!r} in the run's form: use {', '.join(sorted(LAUNCH_FIELDS))}")
    except UserError as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    return await _call(_launch, body)


async def action_rerun(request):
    try:
        body = await _body(request)
    except UserError as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    return await _call(_rerun, request.path_params["name"], body)


async def action_generate(request):
    try:
        body = await _body(request)
    except UserError as e:
        return JSONResponse({"error": str(e)}, status_code=400)
    return await _call(_generate, request.path_params["name"], body)


# ---- live streams -----------------------------------------------------------------------------

async def stream_jobs(request):
    state = request.query_params.get("state") or None
    last = {"rows": None}

    def tick():
        rows = api.rows(state)
        if rows == last["rows"]:
            return []
        last["rows"] = rows
        return [("jobs", rows)]
    return sse.stream(request, tick)


async def stream_job(request):
    """The job's record when it changes, and its new metric rows as they are written: `from`
    counts of train and eval rows the page already has (it loaded the curves first)."""
    name = request.path_params["name"]
    try:
        await run_in_threadpool(api.known, name)
    except (BadName, NotFound) as e:
        return _refused(e)
    seen = {"train": _int(request.query_params.get("train"), 0),
            "eval": _int(request.query_params.get("eval"), 0), "detail": None}

    def tick():
        out = []
        try:
            detail = job_detail(name)
        except NotFound:
            return [("gone", {"name": name})]  # removed meanwhile
        if detail != seen["detail"]:
            seen["detail"] = detail
            out.append(("job", detail))
        mf = views.metrics_of(name)
        new = {}
        for key, (prefix, _) in CURVES.items():
            if mf.count(prefix) > seen[prefix]:
                new[key] = mf.curve(key, "step", start=seen[prefix])
        if new:
            seen["train"], seen["eval"] = mf.count("train"), mf.count("eval")
            out.append(("metrics", new))
        return out
    return sse.stream(request, tick)


async def stream_log(request):
    name, rank = request.path_params["name"], request.path_params["rank"]
    try:
        read = await run_in_threadpool(api.log_reader, name, rank)
    except UserError as e:
        return _refused(e)
    pos = {"offset": _offset(request)}

    def tick():  # up to LOG_PAGES_PER_TICK pages: a chatty job is followed, a long log paged
        out = []
        for _ in range(LOG_PAGES_PER_TICK):
            text, pos["offset"] = read(pos["offset"])
            if not text:
                break
            out.append(("log", {"text": text, "offset": pos["offset"]}))
        return out
    return sse.stream(request, tick, interval=0.5)


ROUTES = [
    Route("/", page("jobs")),
    Route("/jobs/{name}", page("job")),
    Route("/compare", page("compare")),
    Route("/datasets", page("datasets")),
    Route("/sweeps", page("sweeps")),
    Route("/sweeps/{name}", page("sweep")),
    Route("/api/jobs", api_jobs),
    Route("/api/jobs/stream", stream_jobs),
    Route("/api/jobs/{name}", answer(job_detail, "name")),
    Route("/api/jobs/{name}/stream", stream_job),
    Route("/api/jobs/{name}/curves", api_curves),
    Route("/api/jobs/{name}/logs/{rank}", api_log),
    Route("/api/jobs/{name}/logs/{rank}/stream", stream_log),
    Route("/api/jobs/{name}/checkpoints/{id}.zip", download("native")),
    Route("/api/jobs/{name}/checkpoints/{id}/hf.zip", download("hf")),
    Route("/api/jobs/{name}/stop", answer(_stop, "name"), methods=["POST"]),
    Route("/api/jobs/{name}/remove", answer(_remove, "name"), methods=["POST"]),
    Route("/api/jobs/{name}/rerun", action_rerun, methods=["POST"]),
    Route("/api/jobs/{name}/generate", action_generate, methods=["POST"]),
    Route("/api/runs", action_launch, methods=["POST"]),
    Route("/api/datasets", answer(views.datasets)),
    Route("/api/sweeps", answer(views.sweeps)),
    Route("/api/sweeps/{name}", api_sweep),
    Mount("/static", app=CachedStatic(directory=str(STATIC)), name="static"),
]
