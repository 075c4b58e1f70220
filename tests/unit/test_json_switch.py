"""One --json (cli/render.json_switch and as_json, as Determined's render): every command that
shows a table or a report takes it and prints one indented JSON document, and no other CLI module
handles --json or prints JSON itself (the guard is shown failing on a planted branch)."""

import json
import re
from pathlib import Path

import pytest

from tests.conftest import run_cli

CLI = Path(__file__).resolve().parents[2] / "src" / "gptrain" / "cli"
OWN = re.compile(r"""["']--json["']|\bargs\.json\b|\bjson\.dumps\(""")


def handlers(files: dict[str, str]) -> list[str]:
    """The CLI modules, render.py aside, that handle --json or write JSON themselves."""
    return sorted(name for name, text in files.items() if name != "render.py" and OWN.search(text))


def modules() -> dict[str, str]:
    return {p.name: p.read_text() for p in CLI.glob("*.py")}


def test_only_render_handles_json():
    assert handlers(modules()) == []


@pytest.mark.parametrize("planted", ['    p.add_argument("--json", action="store_true")\n',
                                     "    if args.json:\n        pass\n", "    print(json.dumps(rows))\n"])
def test_the_guard_finds_a_planted_branch(planted):
    files = modules()
    assert handlers({**files, "jobs.py": files["jobs.py"] + planted}) == ["jobs.py"]


@pytest.mark.parametrize("command", [("jobs",), ("data", "list"), ("source", "list")])
def test_each_list_prints_one_indented_document(isolated_home, command):
    from gptrain.jobs import store

    store.create_job("shown", {"name": "shown"}, 1, 1, "local")
    r = run_cli(*command, "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert rows == [] if command != ("jobs",) else [j["name"] for j in rows] == ["shown"]
    if rows:
        assert r.stdout.startswith("[\n  {"), r.stdout[:40]
