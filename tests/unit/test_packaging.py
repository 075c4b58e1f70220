"""What `pip install .` (a wheel, not the editable install the tests run from) ships: every
folder of modules is a package setuptools finds, and the console's static files go along."""

from pathlib import Path

from setuptools import find_packages

SRC = Path(__file__).resolve().parents[2] / "src"


def test_every_module_folder_is_a_package():
    found = set(find_packages(where=str(SRC)))
    folders = {".".join(p.parent.relative_to(SRC).parts) for p in SRC.rglob("*.py")}
    assert folders <= found, f"not packaged (no __init__.py): {sorted(folders - found)}"


def test_static_files_are_package_data():
    import tomllib

    data = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    shipped = {p for pattern in data["gptrain"] for p in (SRC / "gptrain").glob(pattern) if p.is_file()}
    needed = {p for d in ("assets", "ui/static") for p in (SRC / "gptrain" / d).rglob("*") if p.is_file()}
    assert needed <= shipped, sorted(str(p) for p in needed - shipped)
