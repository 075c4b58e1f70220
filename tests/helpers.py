"""Shared helpers for the tests that train: a tiny char dataset and launchers."""

import contextlib
import json
import os
import random
import re
import shutil
import subprocess
from pathlib import Path

WORDS = ("the king and queen of england rode out at dawn with their men while the river "
         "ran high and cold under a grey sky; all the people came to see").split()


def write_corpus(path: Path, n_chars: int = 60000, seed: int = 0) -> Path:
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12))).capitalize() + ".\n"
        lines.append(line)
        size += len(line)
    path.write_text("".join(lines))
    return path


def streaming_dataset(out: Path, shard_tokens: int = 16800) -> int:
    """A char dataset of 4.4M tokens at `out`, ~260 train shards of 16,800 tokens (33.6 KB):
    what the multi-host streaming tests and bench/host_streaming.py fetch from a URL. Each of 4
    hosts reads ~65 shards an epoch and fetches about one more (the shard at its span's end is
    shared with the next host's span) and meta.json (~110 bytes a shard, read by every host at
    every start); a run resumed on other hosts fetches again the shards it stopped in. At this
    size that is 2-7% over the bytes trained on; with real shards (16 MiB) and data, far less.
    Returns its train tokens (`shard_tokens`: other shards, for bench/host_streaming.py)."""
    from gptrain.data.formats import read_meta

    char_shards(out, 96, 48000, shard_tokens)
    return sum(f["tokens"] for f in read_meta(out)["splits"]["train"]["files"])


def char_shards(out: Path, corpora: int, chars: int, shard_tokens: int, val_fraction: float = 0.05) -> Path:
    """A char dataset at `out` prepared from `corpora` synthetic corpora of `chars` characters
    (write_corpus, seeds 0..corpora-1) in train shards of `shard_tokens` tokens."""
    import tempfile

    from gptrain.data.prepare import prepare

    with tempfile.TemporaryDirectory() as texts:
        paths = [str(write_corpus(Path(texts) / f"corpus-{i}.txt", chars, seed=i)) for i in range(corpora)]
        prepare(paths, str(out), tokenizer="char", val_fraction=val_fraction, shard_tokens=shard_tokens, quiet=True)
    return out


def save_as_hf_blocks(prepared: Path, out: Path, block: int = 64) -> Path:
    """A prepared dataset's tokens as the hosted tutorials ship them: a HF DatasetDict written by
    save_to_disk, with input_ids (and labels) grouped into blocks, train and validation."""
    import datasets

    from gptrain.data.formats import open_split

    parts = {}
    for split, name in (("train", "train"), ("val", "validation")):
        ids = open_split(prepared, split).tolist()
        blocks = [ids[i:i + block] for i in range(0, len(ids) - block + 1, block)]
        parts[name] = datasets.Dataset.from_dict({"input_ids": blocks, "labels": blocks})
    datasets.DatasetDict(parts).save_to_disk(out)
    return out


def make_dataset(tmp: Path, tokenizer: str = "char") -> Path:
    from gptrain.data.prepare import prepare

    out = tmp / f"data-{tokenizer}"
    if not out.exists():
        prepare([str(write_corpus(tmp / "corpus.txt"))], str(out), tokenizer=tokenizer,
                val_fraction=0.1, quiet=True)
    return out


# A tiny run. Its MFU basis is given, so no run of the suite times this CPU's matmuls again
# (tests/unit/test_cpu.py and test_train_cli's tutorial run test that measurement).
TINY = ["--model.n_layer=2", "--model.n_head=2", "--model.n_embd=32", "--model.block_size=32",
        "--train.lr=1e-3", "--train.warmup_steps=2", "--metrics.log_every=1", "--report_to=none",
        "--checkpoint.every=0", "--train.precision=fp32", "--metrics.peak_flops=1e11"]


def env(**extra) -> dict:
    e = dict(os.environ)
    e.update({"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}, **extra)
    return e


def train(*args, nproc: int = 1, timeout: int = 600, check: bool = True, cwd=None):
    """`gptrain train ARGS` in a process of its own (in `cwd`), or `nproc` ranks as torchrun starts
    them (both forked from a server that imported torch once: tests/cli_process.py)."""
    from tests import cli_process

    if nproc == 1:
        r = cli_process.run(["train", *args], env(), cwd=cwd, timeout=timeout)
    else:
        r = cli_process.run_ranks(["train", *args], env(), nproc, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"training failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}")
    return r


def step_dir(output_dir, step: int) -> Path:
    """The folder of the checkpoint a run's folder (or a job's) holds for `step`, as the library
    names it (weights/layout.py's root_of and step_name)."""
    from gptrain.weights import layout

    return layout.root_of(output_dir) / layout.step_name(step)


def metrics_rows(output_dir) -> list[dict]:
    """Every row of a run's metrics.jsonl (run_layout.py names it), in order."""
    from gptrain import run_layout

    return [json.loads(line) for line in run_layout.metrics_file(output_dir).read_text().splitlines()]


def losses(out: Path) -> dict[int, float]:
    rows = metrics_rows(out)
    return {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}


def model_tensors(ckpt_dir: Path) -> dict:
    from gptrain.models.load import load_for_inference

    model, _ = load_for_inference(ckpt_dir)
    return model.state_dict()


@contextlib.contextmanager
def http_server(directory: Path):
    """Serve a directory over HTTP on localhost (tests/byte_counting.py's server); yields the base URL."""
    from tests.byte_counting import ByteCountingServer

    server = ByteCountingServer(directory)
    try:
        yield server.url
    finally:
        server.close()


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A small tmpfs mounted at `path` for the length of the block (to fill a disk for real);
    the test is skipped, with the reason, where mounting is not permitted (not root)."""
    import pytest

    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"needs a small tmpfs to fill, and mounting one is not permitted here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def steps_lost(rank0_log: str) -> list[int]:
    """Per attempt of a rank's log (`--- gptrain: attempt` opens each) that stopped before its end:
    the last step it trained minus the step its last checkpoint holds (what a preemption lost)."""
    lost = []
    for attempt in rank0_log.split("--- gptrain: attempt")[1:]:
        if "stopped at step" in attempt:
            trained = max(int(s) for s in re.findall(r"step\s+(\d+)/", attempt))
            saved = int(re.findall(r"saved checkpoint \S*step-(\d+)", attempt)[-1])
            lost.append(trained - saved)
    return lost


def nothing_registered() -> None:
    """No dataset in the store (of this test's GPTRAIN_HOME)."""
    from gptrain.data.store import datasets_dir, list_all

    assert list_all() == []
    assert not datasets_dir().exists() or list(datasets_dir().iterdir()) == []


def edit_meta(d, edit) -> None:
    """`edit(meta)` applied to a prepared dataset's meta.json."""
    meta = json.loads((d / "meta.json").read_text())
    edit(meta)
    (d / "meta.json").write_text(json.dumps(meta))


def rewind_to(out, step):
    """Make the run look as if it stopped right after the checkpoint at `step`."""
    from gptrain import run_layout
    from gptrain.weights import layout

    root = layout.root_of(out)
    for p in root.glob("step-*"):
        if int(p.name.split("-")[1]) > step:
            shutil.rmtree(p)
    (root / "latest").write_text(layout.step_name(step) + "\n")
    metrics = run_layout.metrics_file(out)
    lines = metrics.read_text().splitlines()
    metrics.write_text("".join(l + "\n" for l in lines if json.loads(l)["step"] <= step))


def nanogpt_ckpt(path, iter_num=250, val=1.5, vocab=50304, n_layer=2, n_embd=32, block=64, seed=0):
    """A checkpoint as nanoGPT's train.py writes it (Linear weights, compiled-model prefix)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    C = n_embd
    sd = {"transformer.wte.weight": torch.randn(vocab, C, generator=g) * 0.02,
          "transformer.wpe.weight": torch.randn(block, C, generator=g) * 0.02,
          "transformer.ln_f.weight": torch.ones(C), "transformer.ln_f.bias": torch.zeros(C)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        for name, shape in (("attn.c_attn", (3 * C, C)), ("attn.c_proj", (C, C)),
                            ("mlp.c_fc", (4 * C, C)), ("mlp.c_proj", (C, 4 * C))):
            sd[p + name + ".weight"] = torch.randn(*shape, generator=g) * 0.02
            sd[p + name + ".bias"] = torch.zeros(shape[0])
        for ln in ("ln_1", "ln_2"):
            sd[p + ln + ".weight"], sd[p + ln + ".bias"] = torch.ones(C), torch.zeros(C)
    sd["lm_head.weight"] = sd["transformer.wte.weight"]
    sd = {"_orig_mod." + k: v for k, v in sd.items()}
    args = dict(n_layer=n_layer, n_head=4, n_embd=C, block_size=block, bias=True, vocab_size=vocab, dropout=0.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": sd, "optimizer": {"state": {}, "param_groups": []}, "model_args": args,
                "iter_num": iter_num, "best_val_loss": torch.tensor(val), "config": {"dataset": "x"}}, path)
    return path


def trainer_checkpoint(path, step, state=True):
    """A folder as a HF Trainer writes checkpoint-N (its weights are a placeholder)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"x")
    if state:  # a Trainer writes trainer_state.json last
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))


def shakespeare_char(folder, text):
    """What nanoGPT's data/shakespeare_char/prepare.py writes (its code, on `text`)."""
    import pickle

    import numpy as np

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "input.txt").write_text(text)
    (folder / "prepare.py").write_text("# nanoGPT's prepare script\n")
    data = (folder / "input.txt").read_text()
    chars = sorted(list(set(data)))
    stoi = {ch: i for i, ch in enumerate(chars)}
    itos = {i: ch for i, ch in enumerate(chars)}
    n = len(data)
    train_ids = np.array([stoi[c] for c in data[:int(n * 0.9)]], dtype=np.uint16)
    val_ids = np.array([stoi[c] for c in data[int(n * 0.9):]], dtype=np.uint16)
    train_ids.tofile(os.path.join(folder, "train.bin"))
    val_ids.tofile(os.path.join(folder, "val.bin"))
    with open(os.path.join(folder, "meta.pkl"), "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": itos, "stoi": stoi}, f)
    return folder
