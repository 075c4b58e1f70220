"""The layers of src/gptrain, read from the source with ast (every import, function-level ones
included): models <- train <- jobs <- cli/ui, weights/ below them all, no import circle."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
# Another part of issue #20 (the scheduler seam) owns jobs/local.py and jobs/reconcile.py: their
# circle is known and goes when reconcile stops calling back into local. Nothing else may join it.
CONSOLE_STARTER = "gptrain.cli.ui"  # the one cli/ module that may import ui/: it starts the console


def modules() -> dict[str, tuple[Path, list[str]]]:
    """module name -> (file, the package its relative imports start from)."""
    out = {}
    for f in (SRC / "gptrain").rglob("*.py"):
        parts = list(f.relative_to(SRC).with_suffix("").parts)
        package = parts[:-1]
        if parts[-1] == "__init__":
            parts = package = parts[:-1]
        out[".".join(parts)] = (f, package)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph = {}
    for name, (f, package) in mods.items():
        targets = set()
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Import):
                wanted = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                    if node.level else node.module
                wanted = [base] + [f"{base}.{a.name}" for a in node.names]  # a submodule, or a name in base
            else:
                continue
            for target in wanted:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    targets.add(target)
        graph[name] = targets
    return graph


def layer(module: str) -> str:
    """The package right under gptrain (models, train, jobs, ...); "" for a top-level module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and (SRC / "gptrain" / parts[1]).is_dir() else ""


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():  # the reader itself: a known edge of each kind is seen
    graph = import_graph()
    assert "gptrain.weights.layout" in graph["gptrain.train.checkpoint"]  # module level
    assert "gptrain.models.load" in graph["gptrain.train.model_init"]  # inside a function
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_no_import_circle():
    assert cycles(import_graph()) == []  # local <-> reconcile was the last (jobs/folder.py ended it)


def test_layers_import_only_below():
    forbidden = {"models": {"train", "jobs", "cli", "ui"}, "train": {"jobs", "cli", "ui"},
                 "jobs": {"train", "cli", "ui"}, "weights": {"models", "train", "jobs", "cli", "ui"},
                 "cli": {"ui"}, "ui": {"cli"}}
    breaks = [f"{m} -> {t}" for m, targets in import_graph().items() for t in sorted(targets)
              if layer(t) in forbidden.get(layer(m), ()) and not (m == CONSOLE_STARTER and layer(t) == "ui")]
    assert breaks == []


# The faces' job commands and pages reach jobs only through jobs/api.py (and the job spec, to read
# what a job runs): nobody else's store, scheduler, folder or log reader.
JOB_FACES = {"gptrain.cli.jobs": {"gptrain.jobs.api", "gptrain.jobs.spec"},
             "gptrain.cli.checkpoints": {"gptrain.jobs.api"},
             "gptrain.ui.routes": {"gptrain.jobs.api"},
             "gptrain.ui.views": {"gptrain.jobs.api"}}


def test_the_faces_reach_jobs_only_through_the_jobs_api():
    graph = import_graph()
    for face, allowed in JOB_FACES.items():
        reached = {m for m in graph[face] if layer(m) == "jobs" and m != "gptrain.jobs"}
        assert reached <= allowed, (face, sorted(reached - allowed))
