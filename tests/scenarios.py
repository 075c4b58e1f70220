"""Which tests are the suite's end-to-end scenarios: those listed in tests/SCENARIOS.md, read
from the test files themselves (tests/unit/test_scenarios.py holds the two to each other, so
that a scenario is never dropped, or added, without its row).

A test is a scenario when it (or a helper or fixture of its own module that it uses)
- waits for a job it started to run (`job`: real supervisors, torchrun, workers, SQLite),
- trains on several ranks (`ranks`: helpers.train(nproc=N), ranks forked as torchrun starts
  them; `torchrun`: torch.distributed.run itself, as a subprocess),
- takes the `browser` fixture (a real Chromium), or
- lives where a real cluster runs (`cluster`: CLUSTER, Slurm, Ray, podman hosts, S3 on moto).
"""

from __future__ import annotations

import ast
from pathlib import Path

CLUSTER = ("slurm/", "ray/", "hosts/", "s3/", "kubernetes/test_podman.py")
WAITS = {"wait_for", "succeeded", "states_until_done", "wait_until_done", "requeue_when_written",
         "until", "assert_workflow_outcome", "clean_weights"}
KINDS = ("job", "ranks", "torchrun", "browser", "cluster")


def _calls(fn):
    for node in ast.walk(fn):
        if isinstance(node, ast.Call):
            f = node.func
            yield (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""), node


def _kinds(fn, helpers: dict, seen: set) -> set[str]:
    kinds = set()
    for name, call in _calls(fn):
        if name in WAITS:
            kinds.add("job")
        if name == "run_ranks" or (name == "train" and any(k.arg == "nproc" and not (
                isinstance(k.value, ast.Constant) and k.value.value == 1) for k in call.keywords)):
            kinds.add("ranks")
        if name in helpers and name not in seen:
            seen.add(name)
            kinds |= _kinds(helpers[name], helpers, seen)
    launches = any(isinstance(call.func, ast.Attribute) and call.func.attr in ("run", "Popen")
                   and getattr(call.func.value, "id", "") == "subprocess" for _, call in _calls(fn))
    if launches and any(isinstance(n, ast.Constant) and n.value == "torch.distributed.run" for n in ast.walk(fn)):
        kinds.add("torchrun")
    return kinds


def of_module(rel: str, source: str) -> dict[str, set[str]]:
    """{"rel::test_name": kinds} of the scenarios of one test module (`rel`: its path in tests/)."""
    tree = ast.parse(source)
    helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    found = {}
    for fn in helpers.values():
        if not fn.name.startswith("test_"):
            continue
        kinds = _kinds(fn, helpers, {fn.name})
        for arg in fn.args.args:  # the module's own fixtures it takes
            if arg.arg in helpers:
                kinds |= _kinds(helpers[arg.arg], helpers, {fn.name})
            if arg.arg == "browser":
                kinds.add("browser")
        if rel.startswith(CLUSTER):
            kinds.add("cluster")
        if kinds:
            found[f"{rel}::{fn.name}"] = kinds
    return found


def found_in(tests: Path) -> dict[str, set[str]]:
    """Every scenario of the suite (tests/gpu, run only on a GPU machine, aside)."""
    found = {}
    for path in sorted(tests.rglob("test_*.py")):
        rel = path.relative_to(tests).as_posix()
        if not rel.startswith("gpu/"):
            found.update(of_module(rel, path.read_text()))
    return found


def listed(table: Path) -> dict[str, set[str]]:
    """{test: kinds} of the rows of SCENARIOS.md (`| file::test | kinds | what it proves |`)."""
    rows = {}
    for line in table.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and "::" in cells[0]:
            rows[cells[0].strip("`")] = {k.strip() for k in cells[1].split(",") if k.strip()}
    return rows
