"""Hyperparameter sweeps: many trials of one job spec, sampled and stopped early by Optuna.

`gptrain sweep NAME --dataset D --param train.lr=loguniform:1e-4:1e-2 --trials 8 --parallel 2 --
FLAGS` keeps, in $GPTRAIN_HOME/sweeps/NAME/, its spec (sweep.json) and an Optuna study in SQLite
(study.db: Optuna's own storage, so its samplers and pruners are Optuna's, not ours). A detached
driver (jobs/programs/sweep_driver.py) asks the study for settings, runs each trial as a normal
job (`NAME-t00`, ...: its folder, checkpoints, logs and curves; every job command works on it),
at most `--parallel` at once through the same queue as every job; it reports each trial's eval
loss at every evaluation, and a trial the pruner (successive halving, as ASHA: `--early-stop
asha`, the default; `none`) says is among the weak at its rung is stopped there: `pruned`, with
the step it lost at. A trial that ends is told to the study with its last eval loss.

The driver keeps nothing the study and the jobs do not: `sweep resume` (after `sweep stop`, or a
crash of the driver itself) starts it again and it goes on with the trials and the search where
they were. `sweep inspect` reads the study: every trial's settings, state, best eval loss and
step, sorted by the objective, the best named; a sweep's name stands for its best trial as a
MODEL (`generate`, `export`, `eval`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

from gptrain.errors import UserError
from gptrain.home import check_name, home

KINDS = ("uniform", "loguniform", "int")
EARLY_STOP = ("asha", "none")
MAX_TRIALS = 10000


def sweep_dir(name: str) -> Path:
    return home() / "sweeps" / check_name(name, "sweep")


def trial_job(name: str, number: int) -> str:
    return f"{name}-t{number:02d}"


def parse_param(text: str) -> tuple[str, dict]:
    """KEY=SPACE: `a,b,c` (choices), `uniform:LO:HI`, `loguniform:LO:HI` (LO > 0), `int:LO:HI`."""
    key, eq, space = str(text).partition("=")
    if not eq or not key.startswith(("model.", "data.", "train.", "parallel.", "checkpoint.", "metrics.", "lora.")):
        raise UserError(f"--param {text!r}: give SECTION.KEY=SPACE, e.g. train.lr=loguniform:1e-4:1e-2")
    kind, _, bounds = space.partition(":")
    if kind in KINDS:
        parts = bounds.split(":")
        try:
            lo, hi = (int(p) for p in parts) if kind == "int" else (float(p) for p in parts)
        except ValueError:
            lo = hi = None
        if len(parts) != 2 or lo is None or not (math.isfinite(lo) and math.isfinite(hi)) or not lo < hi \
                or max(abs(lo), abs(hi)) >= 2 ** 63 \
                or (kind == "loguniform" and lo <= 0):
            raise UserError(f"--param {key}={space}: {kind} takes LO:HI with LO < HI"
                            + (" and LO > 0" if kind == "loguniform" else ""))
        return key, {"kind": kind, "low": lo, "high": hi}
    choices = [c for c in space.split(",") if c != ""]
    if len(choices) < 2 or len(set(choices)) != len(choices):
        raise UserError(f"--param {key}={space}: give choices a,b,c (two or more, each once), or uniform:LO:HI, "
                        "loguniform:LO:HI, int:LO:HI")
    return key, {"kind": "choice", "choices": choices}


def distributions(params: dict) -> dict:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for key, p in params.items():
        if p["kind"] == "choice":
            out[key] = CategoricalDistribution(p["choices"])
        elif p["kind"] == "int":
            out[key] = IntDistribution(p["low"], p["high"])
        else:
            out[key] = FloatDistribution(p["low"], p["high"], log=p["kind"] == "loguniform")
    return out


def study(name: str, spec: dict | None = None, make: bool = False):
    """The sweep's Optuna study, with its sampler and pruner; made only by `create` (`make`): a
    study.db gone is one line, not a new empty study every trial is missing from."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = spec or read(name)
    db = sweep_dir(name) / "study.db"
    if not make and not os.path.lexists(db):
        raise UserError(f"sweep {name}'s study {db} is missing: its trials' results are gone with it; remove the "
                        "sweep's folder to start it again")
    if db.is_symlink() or (db.exists() and not db.is_file()):
        raise UserError(f"sweep {name}'s {db} is not a plain file (a link is never followed): remove the "
                        "sweep's folder to start it again")
    try:
        pruner = optuna.pruners.SuccessiveHalvingPruner(reduction_factor=spec["reduction_factor"]) \
            if spec["early_stop"] == "asha" else optuna.pruners.NopPruner()
        return optuna.create_study(storage=f"sqlite:///{db}", study_name=name, direction="minimize",
                                   load_if_exists=True, pruner=pruner, sampler=optuna.samplers.TPESampler(
                                       seed=spec["seed"], n_startup_trials=spec["parallel"]))
    except Exception as e:  # sqlalchemy's and optuna's errors on a file that is not the study's
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise UserError(f"sweep {name}'s study {db} cannot be read ({type(e).__name__}: {why}): "
                        "remove the sweep's folder to start it again") from None


def is_sweep(name: str) -> bool:
    """Whether `name` is a sweep's (its sweep.json there, whatever it is: read() judges it)."""
    return os.path.lexists(sweep_dir(name) / "sweep.json")


SPEC_TYPES = {"params": dict, "trials": int, "parallel": int, "early_stop": str, "reduction_factor": int,
              "seed": int, "flags": list, "datasets": list}


def read(name: str) -> dict:
    """The sweep's spec (sweep.json, as create wrote it): NotFound when there is no sweep of that
    name, one line when the file is not what create writes (a link, a pipe, not JSON, a key
    missing or of another type): never followed out of the folder, never a traceback."""
    import stat

    from gptrain.errors import NotFound
    from gptrain.files import parse_user_text, read_user_text

    path = sweep_dir(name) / "sweep.json"
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        raise NotFound(f"no sweep named {name!r}; see `gptrain sweep list`") from None
    damaged = f"sweep {name}'s {path} is damaged"
    if not stat.S_ISREG(mode):
        raise UserError(f"{damaged}: it is not a plain file (gptrain writes one, never through a link); "
                        "remove the sweep's folder to start it again")
    try:
        spec = parse_user_text(json.loads, read_user_text(path, "sweep.json", cap=1 << 20), damaged)
    except ValueError as e:
        raise UserError(f"{damaged}: not JSON ({e})") from None
    wrong = [k for k, t in SPEC_TYPES.items() if not isinstance(spec, dict) or type(spec.get(k)) is not t]
    if wrong:
        raise UserError(f"{damaged}: {wrong[0]} is missing or not a {SPEC_TYPES[wrong[0]].__name__}")
    optional = {"scheduler": str, "nodes": (str, type(None)), "slurm": dict, "kubernetes": dict}
    wrong = [k for k, t in optional.items() if k in spec and not isinstance(spec[k], t)]
    if wrong:
        raise UserError(f"{damaged}: {wrong[0]} is not what a sweep writes there")
    if not all(isinstance(w, str) for w in (*spec["flags"], *spec["datasets"])):
        raise UserError(f"{damaged}: its flags and datasets are not all text")
    if not (1 <= spec["parallel"] <= spec["trials"] <= MAX_TRIALS and spec["early_stop"] in EARLY_STOP
            and 2 <= spec["reduction_factor"] <= 16 and 0 <= spec["seed"] < 2 ** 32):
        raise UserError(f"{damaged}: its trials, parallel, early_stop, reduction_factor or seed is out of range")
    for key, space in spec["params"].items():  # each as `--param` would have written it
        try:
            text = ",".join(space["choices"]) if space["kind"] == "choice" else \
                f"{space['kind']}:{space['low']!r}:{space['high']!r}"
            same = parse_param(f"{key}={text}") == (key, space)
        except (TypeError, KeyError, UserError):
            same = False
        if not same:
            raise UserError(f"{damaged}: its --param {str(key)[:60]!r} is not one a sweep takes")
    return spec


def create(name: str, params: list[str], trials: int, parallel: int, early_stop: str, flags: list[str],
           datasets: list[str] | None, accels: int | None, reduction_factor: int = 3, seed: int = 0,
           where: dict | None = None, check_trial=None) -> dict:
    """Check and record a sweep (nothing written when a part is wrong), then start its driver.
    `where`: the trials' scheduler, nodes and engine options ({"scheduler", "nodes", "slurm",
    "kubernetes"}, as a Request takes them); `check_trial(trial)` (jobs/api.py gives
    submission.check_trial) checks the first trial's job as `gptrain run` checks one and gives
    them back resolved (the default scheduler named)."""
    try:
        import optuna  # noqa: F401  (checked before anything is written)
    except ImportError:
        raise UserError("sweeps need Optuna: pip install 'gptrain[sweep]'") from None
    from gptrain.config_options import parse_train_args

    d = sweep_dir(name)
    if d.exists():
        raise UserError(f"sweep {name!r} already exists: `gptrain sweep inspect {name}`, or another name")
    if not params:
        raise UserError("a sweep needs at least one --param KEY=SPACE")
    space = dict(parse_param(p) for p in params)
    if len(space) < len(params):
        keys = [parse_param(p)[0] for p in params]
        raise UserError(f"--param {next(k for k in keys if keys.count(k) > 1)} is given twice: give each setting once")
    if not 1 <= trials <= MAX_TRIALS or not 1 <= parallel <= trials:
        raise UserError(f"--trials must be 1 to {MAX_TRIALS} and --parallel 1 to --trials, got {trials} and {parallel}")
    if early_stop not in EARLY_STOP:
        raise UserError(f"--early-stop {early_stop!r}: choose asha or none")
    if not 2 <= reduction_factor <= 16:
        raise UserError(f"--reduction-factor must be 2 to 16, got {reduction_factor}")
    if not 0 <= seed < 2 ** 32:
        raise UserError(f"--seed must be 0 to 2^32-1 (the sampler's), got {seed}")
    if len(trial_job(name, trials - 1)) > 64:
        raise UserError(f"sweep name {name!r} is too long for its trials' job names (NAME-tNN, 64 characters at most)")
    if not flags:
        raise UserError("a sweep needs the trials' command after --: the trainer flags each trial runs with")
    if _exists(name):  # (the sweep's name stands for its best trial as a MODEL: never a job's too)
        raise UserError(f"a job named {name} exists: a sweep's name is a MODEL name too, so pick another")
    for n in range(trials):  # the trials' names are free
        if _exists(trial_job(name, n)):
            raise UserError(f"a job named {trial_job(name, n)} exists: the sweep's trials need those names")
    example = [*flags, *(f"--{k}={_example(p)}" for k, p in space.items())]
    cfg = parse_train_args(example)  # every flag known
    if cfg.train.eval_strategy == "no" or not cfg.train.do_eval:
        raise UserError("a sweep ranks its trials by eval loss: let the trials evaluate (--train.eval_every N)")
    where = {"scheduler": None, "nodes": None, "slurm": {}, "kubernetes": {}, **(where or {})}
    if check_trial is not None:
        where = check_trial({"job": trial_job(name, 0), "flags": example, "datasets": datasets or [],
                             "accels": accels, **where})
    spec = {"name": name, "params": space, "trials": trials, "parallel": parallel, "early_stop": early_stop,
            "reduction_factor": reduction_factor, "seed": seed, "flags": list(flags), "datasets": datasets or [],
            "accels": accels, **where, "objective": "eval/loss"}
    d.mkdir(parents=True)
    try:
        (d / "sweep.json").write_text(json.dumps(spec, indent=2))
        study(name, spec, make=True)
    except BaseException:  # nothing recorded of a sweep that could not start
        import shutil

        shutil.rmtree(d, ignore_errors=True)
        raise
    start_driver(name)
    return spec


def trial_job_of(name: str, trial) -> str | None:
    """The job of an Optuna trial of sweep `name`, when it is the one the sweep names (NAME-tNN):
    a study.db edited to name another job ('victim') never has it stopped or reported."""
    job = trial.user_attrs.get("job")
    return job if job == trial_job(name, trial.number) else None


def _exists(job: str) -> bool:
    from gptrain.jobs import store

    try:
        store.get_job(job)
        return True
    except UserError:
        return False


def _example(p: dict):
    return p["choices"][0] if p["kind"] == "choice" else p["low"]


def driver_pid(name: str) -> int | None:
    """The pid of the sweep's driver when it runs, else None."""
    path = sweep_dir(name) / "driver.pid"
    try:
        pid = int(path.read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if b"sweep_driver" in cmdline and name.encode() in cmdline else None


def start_driver(name: str) -> None:
    if driver_pid(name):
        raise UserError(f"sweep {name}'s driver is already running")
    d = sweep_dir(name)
    with open(d / "driver.log", "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "gptrain.jobs.programs.sweep_driver", name], stdout=log,
                                stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, env=os.environ.copy())
    (d / "driver.pid").write_text(str(proc.pid))


def stop_driver(name: str) -> list[str]:
    """End the driver; the trials' jobs still active (jobs/api.stop_sweep stops them)."""
    from gptrain.jobs import store

    read(name)
    pid = driver_pid(name)
    if pid:
        os.kill(pid, signal.SIGTERM)
    return [t["job"] for t in trials(name) if t["job_state"] in store.ACTIVE]


def resume(name: str) -> None:
    read(name)
    start_driver(name)


def trials(name: str) -> list[dict]:
    """Every trial: number, job, params, state (running, complete, pruned, failed), shown (what
    both faces show: a running trial's job state, "asked" before its job exists), value (its
    last eval loss), best (lowest eval loss seen), step (where it stopped), job_state; sorted
    by value, the trials without one last."""
    from gptrain.jobs import store

    out = []
    for t in study(name).get_trials(deepcopy=False):
        job = trial_job_of(name, t)
        try:
            job_state = store.get_job(job)["state"] if job else None
        except UserError:
            job_state = None
        state = t.state.name.lower()
        out.append({"number": t.number, "job": job, "params": t.params, "state": state,
                    "shown": state if state != "running" else job_state or "asked", "value": t.value, "best": t.user_attrs.get("best"), "step": t.user_attrs.get("step"),
                    "job_state": job_state})
    return sorted(out, key=lambda t: (t["value"] is None, t["value"] if t["value"] is not None else 0, t["number"]))


def report(name: str) -> dict:
    """What `sweep inspect` shows: the spec, whether the driver runs, the trials (sorted by eval
    loss), the best complete one, and how many ended and were pruned."""
    spec, listed_trials = read(name), trials(name)
    best = next((t for t in listed_trials if t["state"] == "complete" and t["value"] is not None), None)
    return {"name": name, "spec": spec, "driver": "running" if driver_pid(name) else "not running",
            "best": best["job"] if best else None, "best_value": best["value"] if best else None,
            "ended": sum(t["state"] in ("complete", "pruned", "fail") for t in listed_trials),
            "pruned": sum(t["state"] == "pruned" for t in listed_trials), "trials": listed_trials}


def best_job(name: str) -> str | None:
    """The job of the sweep's best complete trial (lowest eval loss), or None."""
    return report(name)["best"]


def listed() -> list[str]:
    root = home() / "sweeps"
    return sorted(p.name for p in root.iterdir() if os.path.lexists(p / "sweep.json")) if root.is_dir() else []
