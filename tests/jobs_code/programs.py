"""Training programs written the way their authors write them (nanoGPT, HF Trainer-style,
shell launchers, `-m` packages), small enough to run with 2 CPU processes in seconds."""

import os
import subprocess
import textwrap
from pathlib import Path

# nanoGPT's pattern: a configurator exec'd from the working directory, reading a config file
# named relatively on the command line (config/tiny.py) and --key=value overrides.
NANOGPT_TRAIN = '''
import os, sys, torch, torch.distributed as dist
out_dir = "out"
max_iters = 1
exec(open('configurator.py').read())
ddp = "RANK" in os.environ  # as nanoGPT decides: a job of one process runs without torchrun
if ddp:
    dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1 if ddp else 1)
if ddp:
    dist.all_reduce(t)
if not ddp or dist.get_rank() == 0:
    os.makedirs(out_dir, exist_ok=True)
    torch.save({"iter_num": max_iters, "best_val_loss": 1.5, "sum": t.item()}, os.path.join(out_dir, "ckpt.pt"))
    print("saved", os.path.join(out_dir, "ckpt.pt"), "iters", max_iters, "sum", t.item(), "cwd", os.getcwd())
if ddp:
    dist.destroy_process_group()
'''
NANOGPT_CONFIGURATOR = '''
import sys
for arg in sys.argv[1:]:
    if '=' not in arg:
        exec(open(arg).read())
    else:
        key, val = arg[2:].split('=', 1)
        globals()[key] = int(val) if val.isdigit() else val
'''

# An HF Trainer-style program: checkpoint-N directories with trainer_state.json under its
# --output_dir, resuming from GPTRAIN_RESUME_FROM (as `resume_from_checkpoint=` would).
HF_STYLE = '''
import json, os, sys, time, torch, torch.distributed as dist
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
out, steps = args["output_dir"], int(args["max_steps"])
dist.init_process_group("gloo")
rank = dist.get_rank()
attempt = os.environ["GPTRAIN_ATTEMPT"]
resume = os.environ.get("GPTRAIN_RESUME_FROM")
start = json.load(open(os.path.join(resume, "trainer_state.json")))["global_step"] if resume else 0
w = torch.load(os.path.join(resume, "model.pt"), weights_only=True) if resume else torch.zeros(1)
print(f"attempt {attempt} resume_from {resume} start {start}", flush=True)
open(os.path.join(out, f"pid-{rank}-{attempt}"), "w").write(str(os.getpid()))
for step in range(start + 1, steps + 1):
    g = torch.ones(1)
    dist.all_reduce(g)
    w += g
    if rank == 0:
        ck = os.path.join(out, f"checkpoint-{step}")
        os.makedirs(ck)  # (exists: an earlier checkpoint would be overwritten -> the job fails)
        torch.save(w, os.path.join(ck, "model.pt"))
        open(os.path.join(ck, "attempt"), "w").write(attempt)
        json.dump({"global_step": step, "log_history": [{"step": step, "loss": 1.0 / step}]},
                  open(os.path.join(ck, "trainer_state.json"), "w"))
    dist.barrier()
    if step == int(args.get("fail_at", 0)) and not resume and rank == 0:
        sys.exit("failing on purpose at step %d" % step)
    if step == int(args.get("hold_at", 0)) and attempt == "0":
        open(os.path.join(out, f"held-{rank}"), "w").close()
        while True:  # the first attempt waits here, its checkpoint written, for a test to kill a rank
            time.sleep(0.2)
    time.sleep(float(args.get("sleep", "0")))
print(f"done at step {steps} w {w.item()}", flush=True)
dist.destroy_process_group()
'''

MODULE_TRAIN = '''
import os, torch, torch.distributed as dist
from . import helper
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
# one write per line: under run.sh both ranks share the node's log (print writes in pieces)
os.write(1, f"module {__name__} world {int(t.item())} {helper.WORD} node {os.environ.get('GROUP_RANK')}\\n".encode())
dist.destroy_process_group()
'''

# A launcher script, run once per node: starts its own torchrun from the rendezvous variables.
RUN_SH = '''#!/bin/bash
set -eu
echo "node $NODE_RANK of $NNODES, $NPROC_PER_NODE per node, world $WORLD_SIZE, master $MASTER_ADDR:$MASTER_PORT, out $1"
exec "$PYTHON" -m torch.distributed.run --nnodes="$NNODES" --node-rank="$NODE_RANK" \\
  --nproc-per-node="$NPROC_PER_NODE" --master-addr="$MASTER_ADDR" --master-port="$MASTER_PORT" \\
  -m pkg.train
'''


def write(root: Path, files: dict) -> Path:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def project(root: Path) -> Path:
    """One directory holding every style of program."""
    return write(root, {
        "train.py": NANOGPT_TRAIN, "configurator.py": NANOGPT_CONFIGURATOR,
        "config/tiny.py": "max_iters = 7\n", "hf_train.py": HF_STYLE,
        "pkg/__init__.py": "", "pkg/helper.py": "WORD = 'relative-import-ok'\n",
        "pkg/train.py": MODULE_TRAIN, "run.sh": RUN_SH,
        ".gitignore": "data/\n*.bin\n", "data/huge.txt": "not code\n", "weights.bin": "x\n",
    })


def git_repository(root: Path) -> Path:
    """`root` made a git repository with one commit on branch `main` and a tag `v1`."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "code"], ["tag", "v1"]):
        subprocess.run(["git", "-C", str(root), *cmd], check=True, env=env, capture_output=True)
    return root


def head(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


NANOGPT = Path(__file__).resolve().parents[1] / "third_party" / "nanogpt"  # the real one, vendored

# nanoGPT's own config file for a tiny CPU run. The first run (no GPTRAIN_RESUME_FROM yet) stops at
# the checkpoint of iter HALT_AT, after writing it: killed (HALT_HOW=kill) or waiting to be stopped.
NANOGPT_TINY_CONFIG = '''
import os, signal, time, torch
dataset = 'shakespeare_char'
batch_size, block_size, gradient_accumulation_steps = 8, 32, 1
n_layer, n_head, n_embd, dropout = 1, 2, 32, 0.0
device, compile, dtype = 'cpu', False, 'float32'
max_iters, lr_decay_iters, warmup_iters, learning_rate, min_lr = 30, 30, 0, 1e-3, 1e-4
eval_interval, eval_iters, log_interval, always_save_checkpoint = 10, 2, 1, True
if os.environ.get("HALT_AT") and not os.environ.get("GPTRAIN_RESUME_FROM"):
    _save = torch.save
    def _save_then_halt(obj, f, *a, **k):
        _save(obj, f, *a, **k)
        if obj.get("iter_num") == int(os.environ["HALT_AT"]):
            print(f"halting at iter {obj['iter_num']}", flush=True)
            if os.environ.get("HALT_HOW") == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            while True:
                time.sleep(0.2)
    torch.save = _save_then_halt
'''


def nanogpt_project(root: Path) -> Path:
    """nanoGPT's train.py, model.py and configurator.py with config/train_tiny.py and the
    character-level data its prepare.py would write (train.bin, val.bin, meta.pkl)."""
    import pickle
    import shutil

    import numpy as np

    from tests.helpers import write_corpus

    data = root / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    for name in ("train.py", "model.py", "configurator.py"):
        shutil.copy(NANOGPT / name, root / name)
    write(root, {"config/train_tiny.py": NANOGPT_TINY_CONFIG})
    text = write_corpus(root / "input.txt", n_chars=20000).read_text()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    cut = int(len(ids) * 0.9)
    ids[:cut].tofile(data / "train.bin")
    ids[cut:].tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:  # our own file, written here, read by nanoGPT
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)
    return root


def tiny_wheel(root: Path) -> Path:
    """A pure-Python wheel written by hand (no build tools, no network)."""
    import zipfile

    path = root / "tinypkg-0.1-py3-none-any.whl"
    files = {"tinypkg/__init__.py": "VALUE = 42\n",
             "tinypkg-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 0.1\n",
             "tinypkg-0.1.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                            "Tag: py3-none-any\n"}
    files["tinypkg-0.1.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + "tinypkg-0.1.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path
