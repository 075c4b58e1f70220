"""bench/gap_probe.py is the one prepared call of a lent GPU's minutes (issue #46): its dry run on a
CPU writes every table, for every variant that runs without compiling, so that it cannot rot
between the rare sessions that have a device."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_writes_every_table(tmp_path):
    out = tmp_path / "out"
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "gap_probe.py"), "--device", "cpu", "--steps", "2",
                        "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    sys.path.insert(0, str(ROOT / "bench"))
    from gap_probe import COMPILED_ONLY, VARIANTS

    ran = [v for v in VARIANTS if v not in COMPILED_ONLY]
    summary = (out / "summary.txt").read_text()
    rows = {line.split()[0] for line in summary.splitlines() if line.strip()}
    assert set(ran) <= rows, summary
    assert "gptrain / nanogpt:" in summary and "kernel time by category" in summary
    for variant in ran:
        text = (out / f"{variant.replace('#', '-run')}.txt").read_text()
        for section in ("step ms over 2 timed steps", "per step (mean of 1 traced)", "the top kernels",
                        "GEMM rates by shape", "host syncs"):
            assert section in text, (variant, section)
        assert "aten::mm" in text  # the traced window saw the step's matrix products
