"""The facts both faces show (the jobs' states, which of them are active, the tables' columns,
the stop's grace) have one owner in Python, and the console's page is served them (jobs/api.FACTS
and gptrain/assets/render.json, in the page's `render` meta): no script of the console spells a
job state itself. The guard is shown failing on a state list planted in a copy of a real script."""

import html
import json
import re
from pathlib import Path

from gptrain.jobs import folder, store

STATIC = Path(__file__).resolve().parents[2] / "src" / "gptrain" / "ui" / "static"


def spelled_states(scripts: dict[str, str]) -> list[str]:
    """The scripts that write a job state as a string literal of their own."""
    states = "|".join(s.value for s in store.JobState)
    literal = re.compile(rf"""["']({states})["']""")
    return sorted(name for name, text in scripts.items() if literal.search(text))


def scripts() -> dict[str, str]:
    return {p.name: p.read_text() for p in STATIC.glob("*.js") if not p.name.startswith("uPlot")}


def test_no_console_script_spells_a_job_state():
    assert spelled_states(scripts()) == []


def test_the_guard_finds_a_planted_state_list():
    planted = {**scripts()}
    planted["job.js"] += '\nconst ACTIVE = ["queued", "running"];\n'
    assert spelled_states(planted) == ["job.js"]


def test_the_page_is_served_the_facts_the_cli_reads():
    from gptrain.cli import render
    from gptrain.ui import routes

    served = json.loads(html.unescape(routes.RENDER))
    assert served["states"] == [s.value for s in store.JobState]
    assert served["active"] == [s.value for s in store.ACTIVE]
    assert served["stop_timeout_s"] == folder.STOP_TIMEOUT_S
    assert tuple(t.upper() for t in served["columns"]["jobs"]) == render.header("jobs")
    assert tuple(t.upper() for t in served["columns"]["checkpoints"]) == render.header("checkpoints")
