"""The documented layout of a run's folder and a job's folder, spelled once (issue #35).

Every other test asks the library for these paths (gptrain.run_layout, gptrain.weights.layout,
gptrain.jobs.folder, gptrain.jobs.logs, or tests/helpers.py and tests/job_helpers.py on top of
them). This file alone spells the names a user, a script or a foreign tool sees on disk, so a
change to the layout fails here, deliberately, and nowhere else; and the last tests keep it so:
they fail on any test module that spells one of these paths by hand.
"""

import re
from pathlib import Path

from gptrain import run_layout
from gptrain.jobs import folder, logs
from gptrain.weights import layout

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().relative_to(ROOT).as_posix()


def test_a_run_folder_is_laid_out_as_documented(tmp_path):
    out = tmp_path / "run"
    assert run_layout.config_file(out) == out / "config.toml"
    assert run_layout.metrics_file(out) == out / "metrics.jsonl"
    assert run_layout.run_info_file(out) == out / "run.json"
    assert run_layout.checkpoints_dir(out) == out / "checkpoints" == layout.root_of(out)
    assert layout.step_name(10) == "step-000010" and layout.step_name(1234567) == "step-1234567"
    assert layout.root_of(out) / layout.step_name(10) == out / "checkpoints/step-000010"
    assert layout.STATE_FILE == "trainer_state.json" and layout.BEST == "best"
    assert layout.DAMAGED == "damaged.txt" and layout.DAMAGE_LOG == "damaged.jsonl"


def _checkpoint(path, step):
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(f'{{"step": {step}}}')
    (path / ".metadata").write_bytes(b"x")
    return path


def test_checkpoints_latest_names_the_one_a_run_resumes_from(tmp_path):
    """OUTPUT/checkpoints/latest holds the name of the newest complete checkpoint (no function
    names that file: the library reads it, and a resume follows it over a higher step)."""
    out = tmp_path / "run"
    older = _checkpoint(out / "checkpoints/step-000010", 10)
    _checkpoint(out / "checkpoints/step-000020", 20)
    (out / "checkpoints/latest").write_text("step-000010\n")
    assert layout.find_latest(out) == older
    (out / "checkpoints/best").write_text("step-000010\n")
    assert layout.best_checkpoint(out) == older


def test_a_job_folder_is_laid_out_as_documented(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTRAIN_HOME", str(tmp_path / "home"))
    jdir = folder.job_dir("named")
    assert jdir == tmp_path / "home/jobs/named"
    assert folder.logs_dir(jdir) == jdir / "logs"
    assert logs.rank_log(folder.logs_dir(jdir), 0) == jdir / "logs/rank-0.log"
    assert logs.rank_log(folder.logs_dir(jdir), 1) == jdir / "logs/rank-1.log"
    assert logs.agent_log(folder.logs_dir(jdir), 0) == jdir / "logs/agent-node0.log"
    assert logs.agent_log(folder.logs_dir(jdir), "%n") == jdir / "logs/agent-node%n.log"  # Slurm's
    assert folder.checkpoints_dir(jdir) == jdir / "checkpoints"
    assert folder.program_output_dir(jdir) == jdir / "output"
    assert folder.code_dir(jdir) == jdir / "code"
    # the built-in trainer writes its run folder into the job's folder; a program, into output/
    assert folder.metrics_files(jdir) == (jdir / "metrics.jsonl", jdir / "output/metrics.jsonl")
    assert folder.trainer_config(jdir) == jdir / "config.toml"
    assert folder.trainer_run_info(jdir) == jdir / "run.json"


# ---- the guard: no other test spells these paths by hand ------------------------------------

# A path of the layout composed by hand, or a name of it written out (what each should ask).
HAND_SPELLED = [
    (re.compile(r"rank-(\d+|\{[^}]*\})\.log"), "a rank's log: jobs.logs.rank_log"),
    (re.compile(r"agent-node"), "an agent's log: jobs.logs.agent_log"),
    (re.compile(r"""/\s*["']logs["']"""), "a job's logs/: jobs.folder.logs_dir"),
    (re.compile(r"""["']checkpoints["']\s*/|/\s*["']checkpoints["']"""),
     "checkpoints/: run_layout.checkpoints_dir, weights.layout.root_of, jobs.folder.checkpoints_dir"),
    (re.compile(r"checkpoints/step-"), "a checkpoint's path: weights.layout.root_of + step_name"),
    (re.compile(r"""/\s*["']step-\d{6}|f["']step-\{"""), "a checkpoint's name: weights.layout.step_name"),
    (re.compile(r"""metrics\.jsonl["']"""), "metrics.jsonl: run_layout.metrics_file"),
    (re.compile(r"""run\.json["']"""), "run.json: run_layout.run_info_file"),
    (re.compile(r"""/\s*["']config\.toml["']"""), "config.toml: run_layout.config_file"),
]

# Left as they are, on purpose. A file (every line of it), or "FILE: TEXT" (its lines holding TEXT).
ALLOWED = {
    HERE: "the contract: the one place that spells the layout",
    "tests/third_party": "nanoGPT's own code, vendored as its authors wrote it",
    "tests/integration/test_sft.py":
        "being rewritten by a concurrent change (#35); its metrics.jsonl to be asked of run_layout then",
    'tests/slurm/test_slurm.py: home / "config.toml"':
        "GPTRAIN_HOME's settings file (home.py), not a run's config.toml",
    'tests/unit/test_engine_options.py: isolated_home / "config.toml"':
        "GPTRAIN_HOME's settings file (home.py), not a run's config.toml",
    'tests/unit/test_object_store.py: isolated_home / "config.toml"':
        "GPTRAIN_HOME's settings file (home.py), not a run's config.toml",
    'tests/reliability/test_secret_forms.py: metrics.jsonl':
        "a user's own program's file in its $GPTRAIN_OUTPUT_DIR, and its name in fetch's zip",
    'tests/integration/test_script_outputs.py: with open(out / "metrics.jsonl", "a")':
        "a user's own program, written as a user writes it to its $GPTRAIN_OUTPUT_DIR",
    'tests/unit/test_weights.py: root / f"step-{step}"':
        "unpadded names on purpose: the order is by the number, whatever the padding",
}


def _allowed(path: str, line: str) -> bool:
    for key in ALLOWED:
        where, _, text = key.partition(": ")
        if (path == where or path.startswith(where + "/")) and (not text or text in line):
            return True
    return False


def hand_spelled(files: dict[str, str]) -> list[str]:
    """'FILE:LINE: TEXT (what to ask)' for each line of these test files ({path: source}) that
    spells a path of the layout by hand."""
    found = []
    for path, source in sorted(files.items()):
        for n, line in enumerate(source.splitlines(), 1):
            for pattern, ask in HAND_SPELLED:
                if pattern.search(line) and not _allowed(path, line):
                    found.append(f"{path}:{n}: {line.strip()} ({ask})")
                    break
    return found


def _test_sources() -> dict[str, str]:
    return {f.relative_to(ROOT).as_posix(): f.read_text() for f in (ROOT / "tests").rglob("*.py")}


def test_no_test_spells_the_layout_by_hand():
    assert hand_spelled(_test_sources()) == []


def test_the_guard_finds_a_path_spelled_by_hand():
    files = {"tests/reliability/test_planted.py": (
        "def test_x(out, name):\n"
        '    log = job_dir(name) / "logs" / "rank-0.log"\n'
        '    ckpt = out / "checkpoints" / f"step-{10:06d}"\n'
        '    rows = (out / "metrics.jsonl").read_text()\n'
        '    assert "saved checkpoint /x/checkpoints/step-000007" in log\n'
        '    said = (out / "run.json").read_text() + (out / "config.toml").read_text()\n'
        '    agent = logs / f"agent-node{node}.log"\n'
        '    fine = run_layout.metrics_file(out)\n'),
             "tests/slurm/test_slurm.py": '(home / "config.toml").write_text("")\n(out / "config.toml").read_text()\n',
             HERE: '(out / "metrics.jsonl").read_text()\n'}
    assert hand_spelled(files) == [
        'tests/reliability/test_planted.py:2: log = job_dir(name) / "logs" / "rank-0.log" '
        "(a rank's log: jobs.logs.rank_log)",
        'tests/reliability/test_planted.py:3: ckpt = out / "checkpoints" / f"step-{10:06d}" '
        "(checkpoints/: run_layout.checkpoints_dir, weights.layout.root_of, jobs.folder.checkpoints_dir)",
        'tests/reliability/test_planted.py:4: rows = (out / "metrics.jsonl").read_text() '
        "(metrics.jsonl: run_layout.metrics_file)",
        'tests/reliability/test_planted.py:5: assert "saved checkpoint /x/checkpoints/step-000007" in log '
        "(a checkpoint's path: weights.layout.root_of + step_name)",
        'tests/reliability/test_planted.py:6: said = (out / "run.json").read_text() + '
        '(out / "config.toml").read_text() (run.json: run_layout.run_info_file)',
        'tests/reliability/test_planted.py:7: agent = logs / f"agent-node{node}.log" '
        "(an agent's log: jobs.logs.agent_log)",
        'tests/slurm/test_slurm.py:2: (out / "config.toml").read_text() (config.toml: run_layout.config_file)',
    ]
