"""The faces (cli/, ui/) use of the library only what its API modules export: each `*/api.py`
declares `__all__`, no entry of it is a module (an API that hands out `store` hands out everything),
and every name a face takes from an API module, imported or read as an attribute, is in it. And in
tests/, no test module is loaded by another through `pytest_plugins` or `importlib.import_module`
(tests/unit/test_import_graph.py reads import statements). Each check is shown failing on a
violation planted in a copy of the real sources."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "src" / "gptrain"


def sources() -> dict[str, ast.AST]:
    """'gptrain.jobs.api' -> its parsed source, for every module of the package."""
    out = {}
    for f in PKG.rglob("*.py"):
        parts = list(f.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = ast.parse(f.read_text(), str(f))
    return out


def exports(trees) -> dict[str, tuple[list[str] | None, set[str]]]:
    """API module -> (its __all__ or None, the names it binds to a module by importing one)."""
    out = {}
    for name, tree in trees.items():
        if not name.endswith(".api"):
            continue
        declared, modules = None, set()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                declared = [e.value for e in node.value.elts]
            if isinstance(node, ast.ImportFrom) and node.module:
                modules |= {a.asname or a.name for a in node.names if f"{node.module}.{a.name}" in trees}
            if isinstance(node, ast.Import):
                modules |= {a.asname or a.name.split(".")[0] for a in node.names}
        out[name] = (declared, modules)
    return out


def used_by_faces(trees) -> list[tuple[str, str, str]]:
    """(face module, API module, name) for each name a face takes from an API module."""
    used = []
    for face, tree in trees.items():
        if face.split(".")[1:2] not in (["cli"], ["ui"]):
            continue
        bound = {}  # a local name -> the API module it is
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    if node.module.endswith(".api"):
                        used.append((face, node.module, a.name))
                    elif f"{node.module}.{a.name}".endswith(".api"):
                        bound[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                bound.update({a.asname: a.name for a in node.names if a.asname and a.name.endswith(".api")})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
                used.append((face, bound[node.value.id], node.attr))
    return used


def api_breaks(trees) -> list[str]:
    found = []
    table = exports(trees)
    for api, (declared, modules) in sorted(table.items()):
        if declared is None:
            found.append(f"{api} has no __all__")
        found += [f"{api} exports the module {n}" for n in declared or () if n in modules]
    for face, api, name in sorted(set(used_by_faces(trees))):
        declared = (table.get(api) or (None, set()))[0] or []
        if name not in declared:
            found.append(f"{face} uses {api}.{name}, which its __all__ does not export")
    return found


def loads_of_test_modules(files: dict[str, ast.AST]) -> list[str]:
    """'FILE loads MODULE' for a test module named in `pytest_plugins` or given to
    `importlib.import_module` / `__import__` as a constant."""
    found = []
    for name, tree in sorted(files.items()):
        for node in ast.walk(tree):
            named = []
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytest_plugins" for t in node.targets):
                named = [e.value for e in ast.walk(node.value) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
                    "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
                named = [node.args[0].value]
            found += [f"{name} loads {m}" for m in named if isinstance(m, str)
                      and re.search(r"(^|\.)test_\w+$", m)]
    return found


def test_the_faces_use_only_what_the_api_modules_export():
    assert api_breaks(sources()) == []


def test_no_test_module_is_loaded_by_plugins_or_importlib():
    files = {f.relative_to(ROOT).as_posix(): ast.parse(f.read_text()) for f in (ROOT / "tests").rglob("*.py")}
    assert loads_of_test_modules(files) == []


def test_a_planted_re_export_and_a_face_past_all_are_found():
    trees = sources()
    face = trees["gptrain.cli.jobs"]
    face.body.insert(0, ast.parse("from gptrain.jobs.api import store").body[0])
    face.body.insert(0, ast.parse("from gptrain.data import api as dapi\nx = dapi.store_of").body[1])
    face.body.insert(0, ast.parse("from gptrain.data import api as dapi").body[0])
    api = trees["gptrain.models.api"]
    for node in api.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__all__":
            node.value.elts.append(ast.Constant("UserError"))
    api.body.insert(0, ast.parse("from gptrain.weights import checksums").body[0])
    for node in api.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "__all__":
            node.value.elts.append(ast.Constant("checksums"))
    del trees["gptrain.train.api"].body[[i for i, n in enumerate(trees["gptrain.train.api"].body)
                                         if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", None) == "__all__"][0]]
    found = api_breaks(trees)
    assert found[:2] == ["gptrain.models.api exports the module checksums", "gptrain.train.api has no __all__"]
    assert "gptrain.cli.jobs uses gptrain.data.api.store_of, which its __all__ does not export" in found
    assert "gptrain.cli.jobs uses gptrain.jobs.api.store, which its __all__ does not export" in found
    # without its __all__, every name a face takes from train.api is past it
    assert "gptrain.cli.train uses gptrain.train.api.train, which its __all__ does not export" in found
    assert all("train.api" in f or "store" in f or "checksums" in f for f in found), found


def test_a_test_module_loaded_by_plugins_or_importlib_is_found():
    files = {
        "tests/conftest_planted.py": ast.parse('pytest_plugins = ["tests.unit.test_found", "tests.fixtures"]\n'),
        "tests/unit/test_planted.py": ast.parse('import importlib\nm = importlib.import_module("tests.unit.test_lora")\n'),
        "tests/fine.py": ast.parse('import importlib\nm = importlib.import_module("tests.helpers")\n'),
    }
    assert loads_of_test_modules(files) == ["tests/conftest_planted.py loads tests.unit.test_found",
                                            "tests/unit/test_planted.py loads tests.unit.test_lora"]
