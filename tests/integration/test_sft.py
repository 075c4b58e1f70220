"""Instruction tuning for real: `gptrain data prepare` of TRL-style prompt-completion rows, a
small GPT-2 trained on them (loss on the completions only), and greedy generation from a prompt
then answers in the format the completions taught."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.helpers import train

pytestmark = pytest.mark.slow
WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree"]


def test_a_small_run_learns_the_answer_format(tmp_path, isolated_home):
    rows = [{"prompt": f"Q: say {WORDS[i % 8]}\n", "completion": f"ANSWER: {WORDS[i % 8]}"} for i in range(200)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    r = run_cli("data", "prepare", str(tmp_path / "sft.jsonl"), "--out", str(tmp_path / "data"),
                "--tokenizer", "gpt2", "--val-fraction", "0.1")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "out"
    r = train(f"--data.path={tmp_path / 'data'}", f"--train.output_dir={out}", "--model.preset=gpt2-tiny",
              "--model.block_size=32", "--train.lr=3e-3", "--train.max_steps=120", "--train.batch_size=16",
              "--checkpoint.every=0", "--train.eval_every=60", "--train.precision=fp32", "--report_to=none",
              "--metrics.log_every=20")
    evals = [json.loads(line)["eval/accuracy"] for line in (out / "metrics.jsonl").read_text().splitlines()
             if "eval/accuracy" in line]
    assert evals[-1] > 0.9, evals  # of the completion tokens (prompts and padding are no targets)
    for word in ("moon", "cat", "green"):
        g = run_cli("generate", str(out), "--prompt", f"Q: say {word}\n", "--max_new_tokens", "5", "--temperature", "0")
        assert g.returncode == 0, g.stderr
        answer = g.stdout.removeprefix(f"Q: say {word}\n")
        assert answer.startswith("ANSWER: ") and answer.split()[1] in WORDS, g.stdout  # the format, a word of it


def test_the_lora_sft_recipe_runs_as_a_2_process_job(tmp_path, slots, tiny_hf_llama):
    """configs/tinyllama-lora-sft.toml as its comment says to run it, on a tiny Llama and a chat
    file: a 2-process FSDP2 job that trains adapters only and generates by its name."""
    from tests.conftest import ROOT
    from tests.job_helpers import wait_for
    chat = [{"messages": [{"role": "user", "content": f"say {w}"}, {"role": "assistant", "content": f"ANSWER: {w}"}]}
            for w in WORDS * 4]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chat))
    r = run_cli("run", "sft", "--accels", "2", "--config", ROOT / "configs" / "tinyllama-lora-sft.toml", "--",
                f"--model.init_from={tiny_hf_llama}", f"--data.path={tmp_path / 'chat.jsonl'}", "--train.max_steps=4",
                "--checkpoint.every=2", "--model.block_size=64", "--train.batch_size=2", "--train.global_batch_size=4",
                "--train.eval_every=2", "--report_to=none", "--train.precision=fp32")
    assert r.returncode == 0, r.stderr
    job = wait_for("sft")
    log = run_cli("logs", "sft").stdout
    assert job["state"] == "succeeded", log
    assert "(LoRA r=16: " in log and "on 2 x cpu" in log, log
    ckpts = json.loads(run_cli("checkpoints", "sft", "--json").stdout)
    assert [c["step"] for c in ckpts] == [2, 4]
    state = json.loads((Path(ckpts[-1]["path"]) / "trainer_state.json").read_text())
    assert state["lora_base"]["init_from"] == str(tiny_hf_llama.resolve())
    g = run_cli("generate", "sft", "--prompt", "<|user|>\nsay cat\n<|assistant|>\n", "--max_new_tokens", "3")
    assert g.returncode == 0 and g.stdout.startswith("<|user|>\nsay cat\n<|assistant|>\n"), g.stderr
