"""`gptrain train --data.mix`: a real tiny run on two datasets, its evaluation and its resume."""

import json
import shutil

import pytest

from gptrain import run_layout
from gptrain.weights.layout import read_state
from tests.helpers import rewind_to, step_dir
from tests.helpers import TINY, losses, train, write_corpus

N, K = 6, 3


@pytest.fixture(scope="module")
def two_datasets(tmp_path_factory):
    """Two byte-level datasets of different text (one tokenizer, as a mix needs)."""
    from gptrain.data.prepare import prepare

    tmp = tmp_path_factory.mktemp("mix")
    out = []
    for name, seed in (("web", 0), ("code", 1)):
        prepare([str(write_corpus(tmp / f"{name}.txt", 20000, seed))], str(tmp / name), tokenizer="byte",
                val_fraction=0.1, quiet=True)
        out.append(tmp / name)
    return out


def test_a_mix_trains_evaluates_each_source_and_resumes_exactly(two_datasets, tmp_path):
    web, code = two_datasets
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    args = [f"--data.mix={web}:0.7,{code}:0.3", "--train.batch_size=4", f"--train.max_steps={N}",
            "--train.eval_every=100", "--data.max_eval_samples=8", *TINY, f"--checkpoint.every={K}"]
    r = train(*args, f"--train.output_dir={straight}")
    assert f"completed at step {N}" in r.stdout and f"eval step {N}" in r.stdout
    rows = [json.loads(line) for line in run_layout.metrics_file(straight).read_text().splitlines()]
    ev = next(row for row in rows if "eval/loss" in row)
    assert ev["eval/loss"] == pytest.approx(0.7 * ev["eval/web/loss"] + 0.3 * ev["eval/code/loss"])
    # each source's loss on the console too, not only in `inspect`
    assert f"| by source: web {ev['eval/web/loss']:.4f}, code {ev['eval/code/loss']:.4f}" in r.stdout, r.stdout
    mix = read_state(step_dir(straight, N))["loader"]["mix"]
    assert [s["name"] for s in mix] == [str(web), str(code)]
    taken = [s["epoch"] * s["n_blocks"] + s["offset"] for s in mix]
    assert sum(taken) == N * 4 and abs(taken[0] - 0.7 * N * 4) < 1  # 24 blocks: 17 web, 7 code

    shutil.copytree(straight, resumed)
    rewind_to(resumed, K)
    r = train(*args, f"--train.output_dir={resumed}")
    assert f"at step {K}" in r.stdout
    assert losses(resumed) == losses(straight)  # every source continued exactly
    assert read_state(step_dir(resumed, N))["loader"] == {"mix": mix}
