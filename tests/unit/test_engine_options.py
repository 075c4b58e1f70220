"""Each engine's options are declared once (jobs/engines/options.py): `gptrain run`'s flags, the
engines' checks, the submission's defaults from config.toml and the console's launch form all
read that declaration; an option added there is a flag, a checked key, a default and a form field
without another file changing (shown by adding one for the length of a test)."""

import dataclasses
import importlib
import re

import pytest

from gptrain.jobs.engines import options


def run_parser():
    from gptrain.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["run"]


def flags_of(parser) -> set[str]:
    return {s for a in parser._actions for s in a.option_strings}


def test_the_run_flags_the_checks_and_the_form_are_the_declaration():
    from gptrain.jobs import api
    from gptrain.jobs.engines import kube_manifest, slurm

    declared = {o.flag for engine in options.OPTIONS.values() for o in engine if o.flag}
    assert declared <= flags_of(run_parser())
    assert slurm.OPTIONS == options.keys("slurm") and kube_manifest.OPTIONS == options.keys("kubernetes")
    assert [o["key"] for o in api.FACTS["engine_options"]["slurm"]] == [o.key for o in options.SLURM]
    assert api.FACTS["engine_options"]["local"] == []


@pytest.fixture
def one_more(monkeypatch):
    """An option `qos` added to Slurm's declaration, and the modules that read it read it again."""
    from gptrain.jobs import api
    from gptrain.jobs.engines import slurm

    qos = options.Option("qos", "--qos", "Slurm quality of service", re.compile(r"[a-z]+"), "a QOS name",
                         user_default=True, sbatch=True)
    monkeypatch.setattr(options, "SLURM", (*options.SLURM, qos))
    monkeypatch.setitem(options.OPTIONS, "slurm", options.SLURM)
    for module in (slurm, api):
        importlib.reload(module)
    yield qos
    monkeypatch.undo()
    for module in (slurm, api):
        importlib.reload(module)


def test_an_option_declared_once_is_a_flag_a_checked_key_a_default_and_an_sbatch_line(one_more, isolated_home):
    from gptrain.errors import UserError
    from gptrain.jobs import api, submission
    from gptrain.jobs.engines import slurm

    assert "--qos" in flags_of(run_parser())
    assert "qos" in [o["key"] for o in api.FACTS["engine_options"]["slurm"]]
    with pytest.raises(UserError, match="--qos 'Bad!' is not a QOS name"):
        slurm.check_options({"qos": "Bad!"})
    (isolated_home / "config.toml").parent.mkdir(parents=True, exist_ok=True)
    (isolated_home / "config.toml").write_text('[slurm]\nqos = "high"\n')
    spec, _ = submission.build(submission.Request(name="j", entry=["--train.max_steps=1"], scheduler="slurm",
                                                  slurm={"partition": "debug"}))
    assert spec.slurm == {"qos": "high", "partition": "debug"}
    script = slurm.build_script(dataclasses.replace(spec, slurm={**spec.slurm, "accel_type": "cpu"}))
    assert "#SBATCH --qos=high" in script and "#SBATCH --partition=debug" in script
