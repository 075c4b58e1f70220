"""A sweep's own files taken as hostile (#47 round 5 left them unprobed): sweep.json and
study.db edited, truncated, replaced by a link, a pipe or another file are one line naming the
file, never a traceback, never followed out of the sweep's folder."""

import json
import os

import pytest

from gptrain.errors import NotFound, UserError

pytest.importorskip("optuna")

GOOD = {"name": "s", "params": {"train.lr": {"kind": "loguniform", "low": 1e-4, "high": 1e-2},
                                "train.warmup_steps": {"kind": "int", "low": 0, "high": 4},
                                "model.n_layer": {"kind": "choice", "choices": ["1", "2"]}},
        "trials": 8, "parallel": 2, "early_stop": "asha", "reduction_factor": 2, "seed": 0, "flags": ["--x=1"],
        "datasets": [], "accels": None, "objective": "eval/loss"}


@pytest.fixture
def spec_file(isolated_home):
    from gptrain.jobs import sweeps

    d = sweeps.sweep_dir("s")
    d.mkdir(parents=True)
    (d / "sweep.json").write_text(json.dumps(GOOD))
    return d / "sweep.json"


@pytest.mark.parametrize("text, says", [
    ("", "not JSON"), ("{", "not JSON"), ("[1]", "params is missing"), ("[" * 100_000, "nests deeper"),
    (json.dumps({**GOOD, "trials": "8"}), "trials is missing or not a int"),
    (json.dumps({**GOOD, "trials": 10 ** 18}), "out of range"),
    (json.dumps({**GOOD, "flags": [1]}), "not all text"),
    (json.dumps({**GOOD, "params": {"train.lr": {"kind": "exec", "low": 0}}}), "--param 'train.lr' is not one"),
    (json.dumps({**GOOD, "params": {"train.lr": {"kind": "uniform", "low": 2.0, "high": 1.0}}}), "is not one"),
    (json.dumps({**GOOD, "params": {"os.system": {"kind": "choice", "choices": ["a", "b"]}}}), "is not one"),
])
def test_a_damaged_sweep_json_is_one_line(spec_file, text, says):
    from gptrain.jobs import sweeps

    assert sweeps.read("s")["trials"] == 8
    spec_file.write_text(text)
    with pytest.raises(UserError, match="sweep s's .*sweep.json is damaged") as e:
        sweeps.read("s")
    assert says in str(e.value)


def test_links_pipes_and_a_study_that_is_not_one_are_refused(spec_file, tmp_path):
    from gptrain.jobs import sweeps

    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(GOOD))
    spec_file.unlink()
    spec_file.symlink_to(outside)
    with pytest.raises(UserError, match="not a plain file"):
        sweeps.read("s")
    spec_file.unlink()
    os.mkfifo(spec_file)  # (read would wait forever for a writer)
    with pytest.raises(UserError, match="not a plain file"):
        sweeps.read("s")
    assert sweeps.listed() == ["s"] and sweeps.is_sweep("s")  # (listed, and named: not taken for a Hub id)
    spec_file.unlink()
    spec_file.write_text(json.dumps(GOOD))
    db = spec_file.parent / "study.db"
    db.write_bytes(b"not a database" * 100)
    with pytest.raises(UserError, match="study .*study.db cannot be read"):
        sweeps.trials("s")
    db.unlink()
    db.symlink_to(tmp_path / "study-elsewhere.db")
    with pytest.raises(UserError, match="not a plain file"):
        sweeps.trials("s")
    assert not (tmp_path / "study-elsewhere.db").exists()
    with pytest.raises(NotFound, match="no sweep named 'nope'"):
        sweeps.read("nope")


def test_a_missing_study_a_forged_trial_job_and_doubled_params_are_refused(spec_file):
    """#47 round 6: study.db removed made every read create an empty study (its trials gone, then
    failed by resume); a study.db naming another job ('victim') as a trial's had `sweep stop`
    stop it; --param given twice for one key kept the last silently; int:0:10^30 was accepted."""
    import optuna

    from gptrain.jobs import sweeps

    with pytest.raises(UserError, match="study .*study.db is missing"):
        sweeps.trials("s")
    assert not (spec_file.parent / "study.db").exists()
    study = sweeps.study("s", sweeps.read("s"), make=True)
    for number, job in enumerate(("victim", "s-t01")):
        trial = study.ask()
        trial.set_user_attr("job", job)
    assert [t["job"] for t in sorted(sweeps.trials("s"), key=lambda t: t["number"])] == [None, "s-t01"]
    for params, says in ((["train.lr=uniform:0.1:0.2", "train.lr=loguniform:1e-4:1e-2"], "--param train.lr is given twice"),
                         ([f"train.warmup_steps=int:0:{10 ** 30}"], "int takes LO:HI")):
        with pytest.raises(UserError, match=says):
            sweeps.create("s2", params, 2, 1, "asha", ["--train.eval_every=2"], None, None)
    assert not sweeps.sweep_dir("s2").exists() and optuna
