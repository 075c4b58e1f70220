"""Data flows one way (ARCHITECTURE.md): models/ and train/ never import jobs/; names are
resolved at the CLI edge (jobs/api.model_source) and paths passed down."""

import re

from tests.conftest import ROOT


def test_models_and_train_do_not_import_jobs():
    offenders = []
    for package in ("models", "train"):
        for path in sorted((ROOT / "src" / "gptrain" / package).glob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if re.search(r"\b(from|import)\s+gptrain\.(jobs|refs)\b|from gptrain import (jobs|refs)", line):
                    offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders
