"""A sweep's driver (jobs/sweeps.py): `python -m gptrain.jobs.programs.sweep_driver NAME`,
started detached by `gptrain sweep` and `sweep resume`.

Each round it (1) reads every running trial's new eval losses from its job's metrics.jsonl and
reports them to its Optuna trial, stopping the job when the pruner says the trial lost at that
rung (the trial `pruned`, the step recorded); (2) tells the study how each trial whose job ended
did (its last eval loss; a failed job: failed; stopped by someone else: failed, said so);
(3) asks the study for new trials while fewer than `parallel` run and fewer than `trials` were
asked, and submits each as a job. It keeps nothing of its own: started again, it finds the
running trials in the study (their jobs in each trial's `job` attribute) and goes on. SIGTERM
ends it; `sweep stop` then stops the trials' jobs.
"""

from __future__ import annotations

import json
import signal
import sys
import time

from gptrain.errors import UserError

POLL_S = 1.0


_metrics: dict = {}  # job -> its MetricsFile, read on from where the last round stopped


def eval_losses(job: str) -> list[tuple[int, float]]:
    """(step, eval loss) of every evaluation the job's trainer recorded so far, read through the
    one reader of metrics.jsonl (jobs/metrics_file.py: only the rows appended since last time)."""
    from gptrain.jobs import api

    try:
        path = api.metrics_path(job)
    except UserError:
        return []
    mf = _metrics.get(job)
    if mf is None or mf.path != path:
        mf = _metrics[job] = api.MetricsFile(path)
    mf.refresh()
    cols = mf.cols["eval"]
    return [(int(step), loss) for step, loss in zip(cols["step"], cols["loss"])]


def submit(spec: dict, number: int, params: dict) -> str:
    from gptrain.jobs import api
    from gptrain.jobs.submission import sweep_trial
    from gptrain.jobs.sweeps import trial_job

    name = trial_job(spec["name"], number)
    flags = [*spec["flags"], *(f"--{k}={v}" for k, v in params.items())]
    api.submit(sweep_trial({"scheduler": "local", **spec, "job": name, "flags": flags}))  # (local: sweeps of before)
    return name


def step_round(spec: dict, study, stopping: list) -> bool:
    """One round; False once every trial was asked and none runs."""
    import optuna
    from optuna.trial import TrialState

    from gptrain.jobs import api, store
    from gptrain.jobs.schedulers import refresh_job
    from gptrain.jobs.sweeps import distributions, trial_job_of

    running = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
    for frozen in running:
        job = trial_job_of(spec["name"], frozen)
        trial = optuna.trial.Trial(study, frozen._trial_id)
        if job is None:  # asked, then the driver died before submitting: asked again later
            study.tell(frozen.number, state=TrialState.FAIL)
            continue
        seen = frozen.user_attrs.get("reported", 0)
        losses = eval_losses(job)
        state = refresh_job(job)["state"]  # (a Slurm or Kubernetes job's state is its engine's: asked)
        best = frozen.user_attrs.get("best", float("inf"))
        for step, loss in losses[seen:]:
            best = min(loss, best)
            trial.set_user_attr("best", best)
            trial.set_user_attr("step", step)
            trial.report(loss, step)
            if state in store.ACTIVE and trial.should_prune():
                state = api.stop(job, wait=True)
                if state == "succeeded":  # it ended before the stop reached it: a trial that ran to the end
                    continue
                trial.set_user_attr("pruned_at", step)
                study.tell(frozen.number, state=TrialState.PRUNED)
                print(f"trial {frozen.number} ({job}) pruned at step {step}: eval loss {loss:.4f}", flush=True)
                break
        else:
            trial.set_user_attr("reported", len(losses))
            state = refresh_job(job)["state"]
            if state == "succeeded":  # its last evaluation, written since the read above
                losses = eval_losses(job)
                if losses:
                    trial.set_user_attr("best", min(best, *(v for _, v in losses)))
                    trial.set_user_attr("step", losses[-1][0])
            if state == "succeeded" and losses:
                study.tell(frozen.number, losses[-1][1])
                print(f"trial {frozen.number} ({job}) complete: eval loss {losses[-1][1]:.4f}", flush=True)
            elif state not in store.ACTIVE:
                trial.set_user_attr("ended", f"its job {state}" + ("" if losses else " with no evaluation"))
                study.tell(frozen.number, state=TrialState.FAIL)
                print(f"trial {frozen.number} ({job}) failed: its job {state}", flush=True)
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    asked = len(study.get_trials(deepcopy=False))
    while not stopping and len(running) < spec["parallel"] and asked < spec["trials"]:
        trial = study.ask(distributions(spec["params"]))
        try:
            job = submit(spec, trial.number, trial.params)
        except UserError as e:
            trial.set_user_attr("ended", str(e))
            study.tell(trial.number, state=TrialState.FAIL)
            print(f"trial {trial.number} could not be submitted: {e}", flush=True)
            asked += 1
            continue
        trial.set_user_attr("job", job)
        print(f"trial {trial.number} ({job}): {json.dumps(trial.params)}", flush=True)
        running, asked = running + [trial], asked + 1
    return bool(running) or asked < spec["trials"]


def main(argv: list[str] | None = None) -> int:
    from gptrain.jobs.sweeps import read, study

    name = (argv or sys.argv[1:])[0]
    spec = read(name)
    s = study(name, spec)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print(f"sweep {name}: {spec['trials']} trials, {spec['parallel']} at once, early stop {spec['early_stop']}",
          flush=True)
    while not stopping:
        if not step_round(spec, s, stopping):
            print(f"sweep {name}: done", flush=True)
            return 0
        time.sleep(POLL_S)
    print(f"sweep {name}: stopped (`gptrain sweep resume {name}` goes on)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
