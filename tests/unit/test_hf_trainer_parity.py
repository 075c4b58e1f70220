"""The tutorial's HF Trainer command, through gptrain and through transformers' own Trainer, on the
same tiny GPT-2 (saved by transformers, fp32, no dropout: its masks are each framework's own draws)
and the same rows: the same loss every step, within 1e-3 over 20 steps (#49).

gptrain's rows are its blocks (data/loader.py: block i is tokens[i*T : i*T + T + 1]); with
--max_train_samples equal to the batch, every step of either trainer takes all of them (in an
order of its own, which a mean loss does not see). The Trainer is given those rows with labels
equal to the inputs (its model shifts them), as run_clm's grouped texts are, the first one left
unscored (unscored_first says why)."""

import torch

from gptrain.data.formats import open_split
from gptrain.run_layout import metrics_file
from tests.helpers import train

T, B, STEPS, LR = 32, 4, 20, 1e-3


def unscored_first(block):
    """The labels of a block: its tokens, the first marked -100. It is never a target (the model
    shifts the labels by one), but the Trainer divides the summed loss by the labels not -100
    (num_items_in_batch): with it counted, HF's loss reads T / (T + 1) of the mean (10.497 for
    10.825 here), and so would the gradient."""
    labels = block.clone()
    labels[0] = -100
    return labels


def test_the_tutorial_command_trains_as_transformers_trainer_does(data, tmp_path):
    import json

    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    base = tmp_path / "tiny-gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=64, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                               embd_pdrop=0.0, attn_pdrop=0.0)).save_pretrained(base)
    out = tmp_path / "gptrain"
    r = train("--do_train", f"--tokenized_dataset_load_dir={data}", f"--model_name_or_path={base}",
              f"--output_dir={out}", "--per_device_train_batch_size", str(B), "--learning_rate", str(LR),
              "--max_steps", str(STEPS), "--logging_steps", "1", "--block_size", str(T), "--max_train_samples",
              str(B), "--eval_strategy", "no", "--report_to", "none", "--save_steps", "1000")
    assert "train.dialect=hf" in r.stdout or "the HF Trainer's defaults" in r.stdout, r.stdout[-2000:]
    rows = [json.loads(line) for line in metrics_file(out).read_text().splitlines()]
    ours = {row["step"]: row["train/loss"] for row in rows if "train/loss" in row}
    our_lr = {row["step"]: row["train/lr"] for row in rows if "train/lr" in row}

    tokens = open_split(data, "train")
    blocks = [torch.as_tensor(tokens[i * T: i * T + T + 1].astype("int64")) for i in range(B)]
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), per_device_train_batch_size=B, learning_rate=LR,
                             max_steps=STEPS, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
                             disable_tqdm=True)
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(base), args=args,
                      train_dataset=[{"input_ids": b, "labels": unscored_first(b)} for b in blocks])
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h]
    theirs = {h["step"]: h["loss"] for h in logged}
    their_lr = {h["step"]: h["learning_rate"] for h in logged}

    assert sorted(ours) == sorted(theirs) == list(range(1, STEPS + 1)), (sorted(ours), sorted(theirs))
    gaps = [abs(ours[s] - theirs[s]) for s in range(1, STEPS + 1)]
    moved = abs(theirs[1] - theirs[STEPS])
    print(f"losses {theirs[1]:.4f} -> {theirs[STEPS]:.4f} (HF), largest gap {max(gaps):.1e}")
    assert max(gaps) < 1e-3 < moved, (gaps, moved)  # the same curve, and a curve that moved
    for s in range(1, STEPS + 1):  # the rate each step ran at (HF 5 logs the step's own)
        assert abs(our_lr[s] - their_lr[s]) <= 1e-6 * LR, (s, our_lr, their_lr)
