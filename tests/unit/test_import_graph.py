"""The shape of src/gptrain, read from the source with ast (every import, function-level ones
included, and the module names held in `importlib` tables): each module in a layer, imports only
downward, no circle between modules or between packages, the faces reaching the library only
through its API modules, and docs/architecture.md naming every module; and in tests/, no module
importing a test module (what tests share lives in helpers and conftest files). Each check is a
function over a graph, and each is shown failing on a violation planted in a copy of the real graph."""

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
DOCS = ROOT / "docs" / "architecture.md"

# The layers, lowest first (docs/architecture.md shows the same table). A package is one entry;
# a top-level module is a package of its own.
LAYERS = [
    {"locations"},
    {"errors", "gptrain"},
    {"atomic", "files", "stop", "config_aliases"},
    {"home", "tokenizers", "deepspeed_config", "run_layout", "hf_flags", "lr_schedules"},
    {"weights", "db"},
    {"data"},
    {"models"},
    {"distributed"},
    {"config_check", "config", "nanogpt_config"},
    {"config_options"},
    {"train"},
    {"jobs"},
    {"cli", "ui"},
    {"__main__"},
]
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}
FACES = {"cli", "ui"}
FACE_MAY_USE = {"gptrain.errors", "gptrain.home", "gptrain.config", "gptrain"}  # and every `*.api`
CONSOLE_STARTER = ("gptrain.cli.ui", "gptrain.ui.app")  # the one face-to-face import: it starts the console


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


def edges_of(tree: ast.AST, package: list[str], known) -> set[str]:
    """The modules a parsed module imports: import statements anywhere and, in a module that
    calls importlib.import_module or __import__, the string constants that name a module (its
    tables: "gptrain.jobs.engines.local", "gptrain.models.gpt2:GPT"). A module named to be run as a
    program (`-m gptrain.jobs.rank_log`) is not an import."""
    dynamic = any(isinstance(n, (ast.Attribute, ast.Name)) and getattr(n, "attr", getattr(n, "id", None))
                  in ("import_module", "__import__") for n in ast.walk(tree))
    typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and
                   "TYPE_CHECKING" in ast.unparse(block.test) for n in ast.walk(block)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:  # `if TYPE_CHECKING:` imports are types for readers, not imports
            continue
        if isinstance(node, ast.Import):
            wanted = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module
            subs = [f"{base}.{a.name}" for a in node.names]
            wanted = [s for s in subs if s in known] or [base]  # a submodule, else a name in base
            if len(wanted) < len(subs):
                wanted.append(base)
        elif dynamic and isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.fullmatch(r"gptrain(\.\w+)+(:\w+)?", node.value):
            wanted = [node.value.split(":")[0]]
        else:
            continue
        for target in wanted:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target:
                found.add(target)
    return found


def calls_import_module(tree: ast.AST) -> bool:
    return any(isinstance(n, (ast.Attribute, ast.Name)) and getattr(n, "attr", getattr(n, "id", None))
               in ("import_module", "__import__") for n in ast.walk(tree))


def named_modules(tree: ast.AST, known) -> set[str]:
    """The modules a module's string constants name ("gptrain.jobs.engines.local", "module:Class")."""
    return {n.value.split(":")[0] for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and re.fullmatch(r"gptrain(\.\w+)+(:\w+)?", n.value)
            and n.value.split(":")[0] in known}


def import_graph() -> dict[str, set[str]]:
    """Every module's imports. A module that calls importlib imports, besides the modules its
    own strings name, those named in a table it imports from another module (the engines'
    descriptors, jobs/engines/table.py, loaded by jobs/schedulers.py). Read once per run (every
    check reads it; each gets its own copy, which a planted violation may change)."""
    return {name: set(edges) for name, edges in _read_graph().items()}


@functools.cache
def _read_graph() -> dict[str, set[str]]:
    mods = modules()
    trees = {name: ast.parse(f.read_text(), str(f)) for name, (f, _) in mods.items()}
    graph = {name: edges_of(trees[name], package, mods) - {name} for name, (_, package) in mods.items()}
    for name, tree in trees.items():
        if calls_import_module(tree):
            graph[name] |= {t for imported in list(graph[name]) for t in named_modules(trees[imported], mods)}
            graph[name].discard(name)
    return graph


def unit(module: str) -> str:
    """The package a module belongs to for layering: the one right under gptrain, or the
    top-level module itself ("gptrain" for the package's own __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gptrain"


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, targets in graph.items():
        out.setdefault(unit(m), set()).update(unit(t) for t in targets if unit(t) != unit(m))
    return out


def unplaced(graph) -> list[str]:
    return sorted({unit(m) for m in graph} - set(RANK))


def layer_breaks(graph) -> list[str]:
    """Imports of a module in the same or a higher layer than its own (its own package aside)."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if unit(t) != unit(m) and RANK.get(unit(t), 99) >= RANK.get(unit(m), -1)
                  and (m, t) != CONSOLE_STARTER)


def face_breaks(graph) -> list[str]:
    """What cli/ and ui/ import of gptrain besides API modules, errors, home, config, their own."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() if unit(m) in FACES for t in targets
                  if unit(t) != unit(m) and t not in FACE_MAY_USE and not t.endswith(".api")
                  and (m, t) != CONSOLE_STARTER)


ENGINES_PKG, ENGINE_LOADER = "gptrain.jobs.engines", "gptrain.jobs.schedulers"
# the engines' descriptors, data only: what each engine is (table) and what a job may ask of it (options)
ENGINE_DESCRIPTORS = ("gptrain.jobs.engines.table", "gptrain.jobs.engines.options")


def engine_breaks(graph) -> list[str]:
    """Imports of an engine's module from outside jobs/engines/: the job core and the faces know
    the engines only by their descriptors (jobs/engines/table.py, options.py) and reach one through
    jobs/schedulers.scheduler(name), the one loader."""
    return sorted(f"{m} -> {t}" for m, targets in graph.items() for t in targets
                  if t.startswith(ENGINES_PKG + ".") and t not in ENGINE_DESCRIPTORS
                  and not m.startswith(ENGINES_PKG + ".") and m != ENGINE_LOADER)


def undocumented(mods, doc: str) -> list[str]:
    """Modules docs/architecture.md does not name: `file.py` on a line of its package's section
    (`### pkg/`, or `### top level` for a top-level module)."""
    sections, current = {}, None
    for line in doc.splitlines():
        if line.startswith("### "):
            current = "top" if "top level" in line else line[4:].split("/")[0].strip()
            sections.setdefault(current, "")
        elif current is not None:
            sections[current] += line + "\n"
    missing = []
    for name in mods:
        parts = name.split(".")
        f, _ = mods[name]
        if f.name == "__init__.py" and (len(parts) == 1 or len(f.read_text().splitlines()) < 10):
            continue  # a package's own small face: its docstring says what it is
        section = "top" if len(parts) == 2 and f.parent.name == "gptrain" else parts[1]
        if f"`{f.name}`" not in sections.get(section, ""):
            missing.append(name)
    return sorted(missing)


def capability_breaks(doc: str, readme: str) -> list[str]:
    """What the capabilities table of docs/architecture.md names that is not there: a module under
    src/gptrain, a page, or a README section ("## NAME"); and too few rows (12 at least)."""
    section = doc.split("## Capabilities", 1)[-1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| capability")]
    heads = {line[3:].split(" (")[0].strip() for line in readme.splitlines() if line.startswith("## ")}
    found = [] if len(rows) >= 12 else [f"{len(rows)} capabilities (12 at least)"]
    for capability, where, owners, page in rows:
        if where not in heads:
            found.append(f"{capability}: no README section {where!r}")
        for owner in re.findall(r"`([^`]+)`", owners):
            if not (SRC / "gptrain" / owner).is_file():
                found.append(f"{capability}: no module {owner}")
        for doc_page in re.findall(r"`([^`]+)`", page):
            if not (ROOT / doc_page).is_file():
                found.append(f"{capability}: no page {doc_page}")
    return found


def imports_of_test_modules(files: dict[str, ast.AST]) -> list[str]:
    """'FILE imports MODULE' for each module under tests/ (test modules, conftest files, helpers)
    that imports a test module (`test_*`, by absolute or relative import): a test module is
    collected for its tests, and what tests share belongs in a helper or a conftest."""
    found = []
    for name, tree in sorted(files.items()):
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                targets = [base] + [f"{base}.{a.name}".strip(".") for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            for t in targets:
                if t.rsplit(".", 1)[-1].startswith("test_"):
                    found.append(f"{name} imports {t}")
                    break
    return found


def parsed_tests() -> dict[str, ast.AST]:
    """Every file of tests/, parsed once per run (a copy of the table: a check may plant a file)."""
    return dict(_parsed_tests())


@functools.cache
def _parsed_tests() -> dict[str, ast.AST]:
    tests = ROOT / "tests"
    return {f.relative_to(ROOT).as_posix(): ast.parse(f.read_text()) for f in tests.rglob("*.py")}


# ---- the project as it is ----------------------------------------------------------------------

def test_every_module_has_a_layer():
    assert unplaced(import_graph()) == []


def test_no_import_circle_between_modules():
    assert cycles(import_graph()) == []


def test_no_import_circle_between_packages():
    assert cycles(package_graph(import_graph())) == []


def test_layers_import_only_below():
    assert layer_breaks(import_graph()) == []


def test_the_faces_reach_the_library_only_through_its_api_modules():
    assert face_breaks(import_graph()) == []


def test_the_job_core_reaches_an_engine_only_through_its_descriptor():
    assert engine_breaks(import_graph()) == []


def test_architecture_md_names_every_module():
    assert undocumented(modules(), DOCS.read_text()) == []


def test_each_readme_capability_is_one_hop_from_architecture_md():
    assert capability_breaks(DOCS.read_text(), (ROOT / "README.md").read_text()) == []


def test_no_test_module_imports_another():
    assert imports_of_test_modules(parsed_tests()) == []


# ---- each check fails on a planted violation ----------------------------------------------------

def test_the_reader_sees_every_kind_of_import():
    graph = import_graph()
    assert "gptrain.weights.layout" in graph["gptrain.train.checkpoint"]  # module level
    assert "gptrain.models.load" in graph["gptrain.train.model_init"]  # inside a function
    assert "gptrain.jobs.engines.local" in graph["gptrain.jobs.schedulers"]  # an importlib table, held in
    assert "gptrain.jobs.engines.local" not in graph["gptrain.jobs.spec"]  # jobs/engines/table.py
    assert "gptrain.models.gpt2" in graph["gptrain.models.registry"]  # "module:Class"
    assert "gptrain.cli.data" in graph["gptrain.cli"]  # the command groups' table
    mods = modules()
    planted = ast.parse("import importlib\nTABLE = {'x': 'gptrain.ui.app'}\nimportlib.import_module(TABLE['x'])\n"
                        "from gptrain.jobs import api, store\nfrom . import render\n")
    assert edges_of(planted, ["gptrain", "cli"], mods) >= {"gptrain.ui.app", "gptrain.jobs.api",
                                                           "gptrain.jobs.store", "gptrain.cli.render"}


def _planted(**extra):
    graph = {m: set(t) for m, t in import_graph().items()}
    for m, t in extra.items():
        graph.setdefault(m.replace("__", "."), set()).add(t)
    return graph


def test_a_planted_module_circle_is_found():
    graph = _planted(gptrain__weights__names="gptrain.weights.scan")  # scan imports names already
    assert any({"gptrain.weights.names", "gptrain.weights.scan"} <= c for c in cycles(graph))


def test_a_planted_package_circle_is_found():
    # jobs/copy_out -> refs -> jobs.found: two modules, no module circle, but a package one
    graph = _planted(gptrain__weights__hf="gptrain.db")
    graph.setdefault("gptrain.db", set()).add("gptrain.weights.names")
    assert cycles(graph) == []
    assert any({"weights", "db"} <= c for c in cycles(package_graph(graph)))


def test_a_planted_upward_import_is_found():
    assert "gptrain.models.base -> gptrain.train.optim" in layer_breaks(_planted(gptrain__models__base="gptrain.train.optim"))
    # a top-level module is layered too: config -> jobs
    assert "gptrain.config -> gptrain.jobs.store" in layer_breaks(_planted(gptrain__config="gptrain.jobs.store"))
    # two faces side by side: cli -> ui (other than the starter) is a break
    assert "gptrain.cli.jobs -> gptrain.ui.views" in layer_breaks(_planted(gptrain__cli__jobs="gptrain.ui.views"))


def test_a_module_without_a_layer_is_found():
    graph = _planted()
    graph["gptrain.newthing"] = {"gptrain.errors"}
    assert unplaced(graph) == ["newthing"]


def test_a_face_reaching_past_an_api_module_is_found():
    graph = _planted(gptrain__cli__model="gptrain.train.evaluate", gptrain__ui__views="gptrain.data.store",
                     gptrain__cli__sources="gptrain.jobs.store")
    assert face_breaks(graph) == ["gptrain.cli.model -> gptrain.train.evaluate",
                                  "gptrain.cli.sources -> gptrain.jobs.store",
                                  "gptrain.ui.views -> gptrain.data.store"]
    assert face_breaks(_planted(gptrain__cli__model="gptrain.models.api")) == []


def test_an_engine_reached_past_its_descriptor_is_found():
    graph = _planted(gptrain__jobs__submission="gptrain.jobs.engines.local",
                     gptrain__cli__run="gptrain.jobs.engines.slurm")
    assert engine_breaks(graph) == ["gptrain.cli.run -> gptrain.jobs.engines.slurm",
                                    "gptrain.jobs.submission -> gptrain.jobs.engines.local"]
    assert engine_breaks(_planted(gptrain__jobs__spec="gptrain.jobs.engines.table")) == []


def test_a_module_the_docs_do_not_name_is_found():
    mods = dict(modules())
    mods["gptrain.jobs.newthing"] = (SRC / "gptrain" / "jobs" / "newthing.py", ["gptrain", "jobs"])
    mods["gptrain.newtop"] = (SRC / "gptrain" / "newtop.py", ["gptrain"])
    assert undocumented(mods, DOCS.read_text()) == ["gptrain.jobs.newthing", "gptrain.newtop"]
    doc = DOCS.read_text().replace("- `submission.py`", "- `submitting.py`")
    assert "gptrain.jobs.submission" in undocumented(modules(), doc)


def test_a_test_module_imported_by_another_is_found():
    files = parsed_tests()
    files["tests/reliability/test_planted.py"] = ast.parse("from tests.integration.test_jobs import ok\n")
    files["tests/unit/planted_helpers.py"] = ast.parse("def f():\n    from .test_mixture import T\n")
    files["tests/planted_conftest.py"] = ast.parse("import tests.unit.test_found as found\n")
    files["tests/fine.py"] = ast.parse("from tests.job_helpers import ok\nfrom tests import helpers\n")
    assert imports_of_test_modules(files) == [
        "tests/planted_conftest.py imports tests.unit.test_found",
        "tests/reliability/test_planted.py imports tests.integration.test_jobs",
        "tests/unit/planted_helpers.py imports test_mixture"]


def test_a_capability_pointing_nowhere_is_found():
    doc, readme = DOCS.read_text(), (ROOT / "README.md").read_text()
    doc = doc.replace("`jobs/engines/slurm.py`", "`jobs/slurm_engine.py`").replace("`docs/ray.md`", "`docs/rays.md`")
    assert capability_breaks(doc, readme.replace("## Web console", "## Console")) == [
        "jobs on Slurm: no module jobs/slurm_engine.py", "jobs on Ray: no page docs/rays.md",
        "the web console: no README section 'Web console'"]
    few = "\n".join(line for line in doc.splitlines() if not any(w in line for w in ("jobs on", "| interactive", "| hyperp")))
    assert capability_breaks(few, readme)[0] == "10 capabilities (12 at least)"
