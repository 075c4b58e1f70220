"""Dataset mixtures (data/mixture.py) and the loaders' global position across world sizes: a run
resumed on another number of data-parallel ranks, with the same global batch, sees the blocks an
uninterrupted run sees (a dataset, and a mix)."""

import numpy as np
import pytest

from gptrain.config_options import parse_train_args
from gptrain.data.loader import BlockLoader
from gptrain.data.mixture import MixtureLoader, parse_mix
from gptrain.errors import UserError
from tests.conftest import run_cli
from tests.helpers import write_corpus

T = 8
SECOND = 20000  # the second source's tokens start here: a block's first token names its source


def _tokens(n_blocks, start=0):
    return np.arange(start, start + n_blocks * T + 1, dtype=np.uint32)


def _mix(rank=0, world=1, batch=4, weights=(0.7, 0.3), seed=3, sizes=(50, 23)):
    sources = [BlockLoader(_tokens(n, i * SECOND), T, batch, seed=seed + i) for i, n in enumerate(sizes)]
    return MixtureLoader(sources, [f"s{i}" for i in range(len(sizes))], list(weights), batch, rank, world)


def _single(rank=0, world=1, batch=4):
    return BlockLoader(_tokens(37), T, batch, rank=rank, world=world, seed=3)


@pytest.mark.parametrize("weights", [(0.7, 0.3), (0.5, 0.3, 0.2), (0.05, 0.6, 0.1, 0.25)])
def test_the_drawn_ratio_holds_over_10k_blocks_and_at_every_prefix(weights):
    k = len(weights)
    loader = _mix(weights=list(weights), sizes=(50, 23, 11, 7)[:k])
    which, _ = loader.take(10_000)
    counts = np.cumsum(np.eye(k, dtype=np.int64)[which], axis=0)
    assert np.allclose(counts[-1] / 10_000, weights, atol=0.01)  # within 1% over 10k blocks
    expected = np.arange(1, 10_001)[:, None] * np.array(weights)
    assert np.abs(counts - expected).max() < 2  # and every global batch near the ratio


def test_the_interleave_stays_near_the_ratio_for_random_weights():
    """The deficit rule's drift, measured: the bound the module doc states (1.2 blocks)."""
    rng = np.random.default_rng(1)
    worst = 0.0
    for _ in range(100):
        k = int(rng.integers(2, 11))
        w = rng.random(k) ** 4 + 1e-4
        loader = _mix(weights=list(w / w.sum()), sizes=[5] * k)
        which, _ = loader.take(1000)
        counts = np.cumsum(np.eye(k, dtype=np.int64)[which], axis=0)
        worst = max(worst, np.abs(counts - np.arange(1, 1001)[:, None] * loader.weights).max())
    assert worst < 1.2


def test_each_source_keeps_its_own_seeded_stream():
    loader = _mix()
    which, blocks = loader.take(1000)
    for i, n in enumerate((50, 23)):
        alone = BlockLoader(_tokens(n, i * SECOND), T, 1, seed=3 + i)
        assert blocks[which == i].tolist() == alone.take(int((which == i).sum())).tolist()
    x, y = _mix().next_batch()  # rows are the sources' own blocks, targets shifted by one
    assert x.shape == (4, T) and (y == x + 1).all() and set((x[:, 0] >= SECOND).tolist()) == {False, True}


def test_weights_in_the_mix_string_are_normalized_and_paths_split_at_the_last_colon():
    assert parse_mix("web:7, c:d/code:3") == [("web", 0.7), ("c:d/code", 0.3)]
    assert parse_mix("only:2") == [("only", 1.0)]
    assert parse_mix("a:1e308,b:1e308") == [("a", 0.5), ("b", 0.5)]  # their sum is inf: both were 0


def test_a_weight_too_small_to_draw_is_refused():
    with pytest.raises(UserError, match="too small next to the others"):
        parse_mix("a:1e308,b:1e-300")


def test_mixture_resume_continues_every_source_exactly():
    straight = _mix()
    expected = [straight.next_batch()[0].tolist() for _ in range(40)]
    first = _mix()
    got = [first.next_batch()[0].tolist() for _ in range(17)]
    resumed = _mix()
    resumed.load_state_dict(first.state_dict())
    got += [resumed.next_batch()[0].tolist() for _ in range(23)]
    assert got == expected


def test_states_of_another_kind_are_refused_as_another_dataset():
    single, mix = _single(), _mix()
    for loader, state in ((single, mix.state_dict()), (mix, single.state_dict()),
                          (mix, _mix(sizes=(50, 24)).state_dict())):
        with pytest.raises(ValueError):
            loader.load_state_dict(state)
    old = {"epoch": 2, "offset": 5, "seed": 3, "n_blocks": 37, "block_size": T}  # as saved before mixtures
    single.load_state_dict(old)
    assert single.state_dict() == old and single.position == 2 * 37 + 5


@pytest.fixture
def prepared(tmp_path):
    from gptrain.data.prepare import prepare

    def make(name, tokenizer="byte", seed=0):
        out = tmp_path / name
        prepare([str(write_corpus(tmp_path / f"{name}.txt", 4000, seed))], str(out), tokenizer=tokenizer,
                val_fraction=0.1, quiet=True)
        return out
    return make


def test_a_toml_table_and_the_string_are_the_same_mix(prepared, tmp_path):
    a, b = prepared("a"), prepared("b", seed=1)
    toml = tmp_path / "c.toml"
    toml.write_text(f'[data.mix]\n"{a}" = 0.7\n"{b}" = 0.3\n')
    assert parse_train_args([str(toml)]).data.mix == f"{a}:0.7,{b}:0.3"
    assert parse_train_args([f"--data.mix={a}:0.7,{b}:0.3"]).data.mix == f"{a}:0.7,{b}:0.3"


@pytest.mark.parametrize("mix, message", [
    ("web:0", "must be a number > 0"), ("web:-1", "must be a number > 0"), ("web:nan", "must be a number > 0"),
    ("web:abc", "'abc' of web is not a number"), ("web", "'web' is not NAME:WEIGHT"),
    (":0.5", "is not NAME:WEIGHT"), ("web:1,,code:1", "'' is not NAME:WEIGHT"),
    ("web:1,web:2", "names web twice"), ("nosuch:1", "no dataset named 'nosuch'"),
])
def test_bad_mixes_are_one_line(mix, message):
    with pytest.raises(UserError, match=message) as e:
        parse_train_args([f"--data.mix={mix}"])
    assert "\n" not in str(e.value)


def test_a_mix_with_data_path_or_two_tokenizers_is_refused(prepared):
    a, b, c = prepared("a"), prepared("b", seed=1), prepared("c", tokenizer="char")
    with pytest.raises(UserError, match="either --data.path or --data.mix"):
        parse_train_args([f"--data.path={a}", f"--data.mix={a}:1,{b}:1"])
    with pytest.raises(UserError, match=f"{c} has another tokenizer than {a}"):
        parse_train_args([f"--data.mix={a}:1,{c}:1"])
    assert parse_train_args([f"--data.mix={a}:1,{b}:1"]).data.mix
    with pytest.raises(UserError, match="names one dataset twice"):  # spelled two ways
        parse_train_args([f"--data.mix={a}:1,{a}/:1"])


def test_bad_mix_exits_2_with_one_line_at_train_and_at_submit(prepared, isolated_home, tmp_path):
    a, c = prepared("a"), prepared("c", tokenizer="char")
    out = tmp_path / "out"
    r = run_cli("train", f"--data.mix={a}:1,{c}:1", f"--train.output_dir={out}")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "another tokenizer" in r.stderr, r.stderr
    assert not out.exists()
    r = run_cli("run", "j", "--", "--data.mix=nosuch:0.5,other:0.5")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "no dataset named" in r.stderr, r.stderr
    assert not (isolated_home / "jobs" / "j").exists()


def test_a_job_with_a_mix_gets_no_data_path_and_absolute_names(prepared, isolated_home, tmp_path, monkeypatch):
    from pathlib import Path

    from gptrain.data.store import push
    from gptrain.jobs import launch
    from gptrain.jobs.spec import JobSpec

    push("web", str(prepared("a"))), push("code", str(prepared("b", seed=1)))
    spec = JobSpec(name="m", datasets=["web", "code"], args=["--data.mix=web:1,code:3"]).validate()
    cmd = launch.entry_command(spec, Path("/j"))
    assert "--data.mix=web:1,code:3" in cmd and not any(a.startswith("--data.path") for a in cmd)
    assert "--data.path=web" in launch.entry_command(JobSpec(name="p", datasets=["web"]).validate(), Path("/j"))
    monkeypatch.chdir(tmp_path)  # relative paths are made absolute where the job is submitted
    spec = JobSpec(name="m", args=["--data.mix=./a:1,./b:3"]).validate()
    here = tmp_path.resolve()
    assert spec.args == [f"--data.mix={here / 'a'}:1,{here / 'b'}:3"]
    yaml = tmp_path / "job.yaml"  # a job file's inline config takes the table form too
    yaml.write_text("name: y\nconfig:\n  data: {mix: {web: 0.7, code: 0.3}}\n")
    from gptrain.jobs.programs.job_file import from_yaml

    assert 'mix = "web:0.7,code:0.3"' in from_yaml(str(yaml))["config"]


def _stream(make, world, batch, accum, steps, state=None):
    """Steps of `world` ranks of `batch` rows, `accum` micro-steps each: per step the sorted
    first tokens of every row all ranks saw; and the (global, same on every rank) state after."""
    loaders = [make(rank=r, world=world, batch=batch) for r in range(world)]
    for loader in loaders:
        if state is not None:
            loader.load_state_dict(state)
    seen = []
    for _ in range(steps):
        rows = []
        for _ in range(accum):
            for loader in loaders:
                rows += loader.next_batch()[0][:, 0].tolist()
        seen.append(sorted(rows))
    states = [loader.state_dict() for loader in loaders]
    assert all(s == states[0] for s in states)
    return seen, states[0]


@pytest.mark.parametrize("make", [_single, _mix], ids=["single", "mix"])
@pytest.mark.parametrize("first, then", [((2, 4, 1), (1, 4, 2)), ((1, 8, 1), (2, 2, 2))],
                         ids=["2-ranks-then-1", "1-rank-then-2"])
def test_resumed_on_another_world_size_the_same_blocks_follow(make, first, then):
    """With the same global batch (ranks x rows x micro-steps), a run resumed on another number of
    ranks sees, step by step, the blocks an uninterrupted run sees: none repeated, none skipped."""
    straight, end = _stream(make, *first, steps=30)
    head, state = _stream(make, *first, steps=11)
    tail, resumed_end = _stream(make, *then, steps=19, state=state)
    assert head + tail == straight and resumed_end == end
