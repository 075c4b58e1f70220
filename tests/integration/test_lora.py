"""LoRA fine-tuning for real (`gptrain train --lora_r ...`) from local Hugging Face GPT-2 and
Llama directories saved by transformers itself: the loss falls, the base weights stay
byte-identical, the merged HF export computes what gptrain's adapted model computes
(transformers' own logits), a stopped run resumes bitwise, and DDP and FSDP2 on 2 processes
match 1 process. CPU, fp32."""

import json

import pytest
import torch

from gptrain import run_layout
from tests.helpers import rewind_to, step_dir
from tests.helpers import losses, train

pytestmark = pytest.mark.slow
N, K = 8, 4


@pytest.fixture(params=["gpt2", "llama"])
def base(request, tiny_hf_gpt2, tiny_hf_llama):
    return tiny_hf_gpt2 if request.param == "gpt2" else tiny_hf_llama


def args(data, base, out, steps=N, *extra):
    return [f"--model.init_from={base}", f"--data.path={data}", f"--train.output_dir={out}",
            "--train.batch_size=4", f"--train.max_steps={steps}", "--train.do_eval=false",
            "--train.precision=fp32", "--train.lr=1e-2", "--report_to=none", "--metrics.log_every=1",
            f"--checkpoint.every={K}", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules",
            "all-linear", *extra]


def test_lora_learns_keeps_the_base_and_exports_what_it_computes(data, base, tmp_path):
    from transformers import AutoModelForCausalLM

    from gptrain.models.hf import load_hf
    from gptrain.models.load import load_model

    out = tmp_path / "out"
    r = train(*args(data, base, out, 30))
    assert "(LoRA r=4: " in r.stdout and "trained, the rest frozen)" in r.stdout, r.stdout
    curve = list(losses(out).values())
    assert sum(curve[-5:]) / 5 < sum(curve[:5]) / 5 - 0.01, curve
    model, _ = load_model(str(out))
    source, _ = load_hf(str(base))
    own = dict(source.named_parameters())
    frozen = {n: p for n, p in model.named_parameters() if ".lora_" not in n}
    assert frozen.keys() == own.keys()
    for name, p in frozen.items():
        assert torch.equal(p, own[name]), name  # not one bit of the base moved
    assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if n.endswith("lora_B"))

    full = tmp_path / "full"  # a full fine-tune's checkpoint of the same model, for its size
    train(f"--model.init_from={base}", f"--data.path={data}", f"--train.output_dir={full}", "--train.max_steps=1",
          "--train.batch_size=4", "--train.do_eval=false", "--report_to=none", "--train.precision=fp32")
    size = {run: sum(f.stat().st_size for f in run_layout.checkpoints_dir(run).glob("step-*/*")) / len(
        list(run_layout.checkpoints_dir(run).glob("step-*"))) for run in (out, full)}
    assert size[out] < 0.05 * size[full], size  # adapters (and their optimizer state) only
    state = json.loads((step_dir(out, 30) / "trainer_state.json").read_text())
    assert state["lora_base"]["init_from"] == str(base.resolve()) and len(state["lora_base"]["sha256"]) == 64

    hf_out = tmp_path / "merged"
    from tests.conftest import run_cli

    r = run_cli("export", str(out), "--out", str(hf_out))
    assert r.returncode == 0, r.stderr
    theirs = AutoModelForCausalLM.from_pretrained(hf_out).eval()
    x = torch.randint(0, 60, (2, 24))
    with torch.no_grad():
        ours = model(x)
        diff = (ours - theirs(x).logits).abs().max().item()
    assert diff < 1e-4, diff

    from peft import PeftModel  # the adapters alone, loaded by peft on the HF base

    r = run_cli("export", str(out), "--format", "peft", "--out", str(tmp_path / "adapter"))
    assert r.returncode == 0 and f"on the {'Llama' if 'llama' in str(base) else 'GPT-2'} base {base.resolve()}" in r.stdout, r
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base).eval(), tmp_path / "adapter").eval()
    with torch.no_grad():
        diff = (ours - adapted(x).logits).abs().max().item()
        plain = (ours - AutoModelForCausalLM.from_pretrained(base).eval()(x).logits).abs().max().item()
    assert diff < 1e-4 < plain, (diff, plain)  # the adapters matter, and peft applies them as gptrain
    r = run_cli("export", str(full), "--format", "peft", "--out", str(tmp_path / "none"))
    assert r.returncode == 2 and "has none" in r.stderr and not (tmp_path / "none").exists(), r.stderr


def test_adapters_need_their_own_base(data, tiny_hf_gpt2, tmp_path):
    """An adapter-only checkpoint loads only on the base it was trained on: a missing or changed
    base is one line, from generate and from a resume."""
    from tests.conftest import run_cli, save_tiny_hf_gpt2

    base = save_tiny_hf_gpt2(tmp_path / "base")
    out = tmp_path / "out"
    train(*args(data, base, out, 4))
    r = run_cli("generate", str(out), "--prompt", "a", "--max_new_tokens", "3")
    assert r.returncode == 0, r.stderr
    base.rename(tmp_path / "moved")
    r = run_cli("generate", str(out), "--prompt", "a", "--max_new_tokens", "3")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
    assert f"holds only adapters; its base model {base} cannot be loaded" in r.stderr, r.stderr
    save_tiny_hf_gpt2(base, n_layer=2)
    import safetensors.torch as st

    weights = st.load_file(base / "model.safetensors")
    weights["transformer.ln_f.weight"] += 1
    st.save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    r = run_cli("generate", str(out), "--prompt", "a", "--max_new_tokens", "3")
    assert r.returncode == 2 and "is not the one it was trained on" in r.stderr, r.stderr
    r = train(*args(data, base, out, 8), check=False)  # resume over the changed base
    assert r.returncode == 2 and "holds LoRA adapters for the base" in r.stderr, r.stderr
    for ckpt in run_layout.checkpoints_dir(out).glob("step-*"):  # an edited state naming its own checkpoint
        state_file = ckpt / "trainer_state.json"
        state = json.loads(state_file.read_text())
        state["lora_base"]["init_from"] = str(ckpt)
        state_file.write_text(json.dumps(state))
    r = run_cli("generate", str(out), "--prompt", "a", "--max_new_tokens", "3")
    assert r.returncode == 2 and "fails verification" in r.stderr, r.stderr  # its checksums see the edit
    for ckpt in run_layout.checkpoints_dir(out).glob("step-*"):  # as a checkpoint from before checksums
        (ckpt / "checksums.json").unlink()
        state = json.loads((ckpt / "trainer_state.json").read_text())
        state.pop("checksums")  # (the mark of a checkpoint sealed with one: #47 row 4)
        (ckpt / "trainer_state.json").write_text(json.dumps(state))
    r = run_cli("generate", str(out), "--prompt", "a", "--max_new_tokens", "3")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "leads back to itself" in r.stderr, r.stderr


def test_a_stopped_lora_run_resumes_bitwise(data, tiny_hf_llama, tmp_path):
    from tests.helpers import model_tensors

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    extra = ["--lora_dropout=0.1"]  # the dropout's RNG resumes too
    train(*args(data, tiny_hf_llama, straight, N, *extra))
    train(*args(data, tiny_hf_llama, resumed, N, *extra))
    rewind_to(resumed, K)
    r = train(*args(data, tiny_hf_llama, resumed, N, *extra))
    assert f"at step {K}" in r.stdout, r.stdout
    assert losses(resumed) == losses(straight)
    a = model_tensors(step_dir(straight, N))
    b = model_tensors(step_dir(resumed, N))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


DDP, FSDP2 = ["--parallel.dp_replicate=2", "--parallel.dp_shard=1"], ["--parallel.dp_shard=2", "--gradient_checkpointing"]


@pytest.mark.parametrize("layout,precision", [(DDP, "fp32"), (FSDP2, "fp32"), (FSDP2, "bf16")],
                         ids=["ddp", "fsdp2", "fsdp2-bf16"])  # (DDP syncs the fp32 adapters alone)
def test_two_processes_match_one(data, tiny_hf_gpt2, tmp_path, layout, precision):
    """In bf16 the frozen base is held in bf16 (lora.hold_base_in) beside fp32 adapters: FSDP2
    shards the mixed dtypes and matches one process (to bf16's rounding)."""
    one, two = tmp_path / "one", tmp_path / "two"
    run = ("--train.global_batch_size=8", f"--train.precision={precision}")  # (the last one wins)
    train(*args(data, tiny_hf_gpt2, one, N, *run))
    train(*args(data, tiny_hf_gpt2, two, N, *run, *layout), nproc=2)
    a, b = losses(one), losses(two)
    assert a.keys() == b.keys()
    tolerance = 1e-4 if precision == "fp32" else 2e-2
    for step in a:
        assert abs(a[step] - b[step]) <= tolerance * abs(a[step]), (step, a[step], b[step])


@pytest.mark.parametrize("layout", [[], ["--parallel.dp_shard=2", "--gradient_checkpointing"]], ids=["one", "fsdp2"])
def test_qlora_trains_over_an_nf4_base_and_exports(data, tiny_hf_llama, tmp_path, layout):
    from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import NF4Tensor
    from transformers import AutoModelForCausalLM

    from gptrain.models.load import load_model
    from tests.conftest import run_cli

    out, one = tmp_path / "q", tmp_path / "one"
    r = train(*args(data, tiny_hf_llama, out, 20, "--load_in_4bit", "--train.global_batch_size=8", *layout),
              nproc=2 if layout else 1)
    assert "trained, the rest frozen in NF4)" in r.stdout, r.stdout[-2000:]
    curve = list(losses(out).values())
    assert sum(curve[-5:]) / 5 < sum(curve[:5]) / 5 - 0.01, curve
    if layout:  # the same run on one process: the same losses
        train(*args(data, tiny_hf_llama, one, 20, "--load_in_4bit", "--train.global_batch_size=8"))
        ref = losses(one)
        assert all(abs(ref[s] - v) <= 1e-4 * abs(v) for s, v in losses(out).items()), (ref, losses(out))
        return
    model, _ = load_model(str(out))  # its base loaded and quantized again, as it trained
    assert isinstance(model.transformer.h["0"].mlp.up_proj.weight, NF4Tensor)
    r = run_cli("export", str(out), "--out", str(tmp_path / "merged"))
    assert r.returncode == 0 and "LoRA adapters merged" in r.stdout, r.stderr
    x = torch.randint(0, 60, (2, 24))
    with torch.no_grad():
        diff = (model(x) - AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()(x).logits).abs().max()
    assert diff < 1e-4, diff


def test_peft_export_of_adapters_on_a_base_of_their_own_is_one_line(data, tmp_path):
    """A LoRA run from scratch (no init_from): its random base exists only in its checkpoint,
    so a PEFT adapter folder would name no base (it wrote "base_model_name_or_path": "")."""
    from tests.conftest import run_cli
    from tests.helpers import TINY

    out = tmp_path / "scratch"
    train(f"--data.path={data}", f"--train.output_dir={out}", "--train.batch_size=2", "--train.max_steps=1",
          "--train.do_eval=false", *TINY, "--lora_r", "2")
    r = run_cli("export", str(out), "--format", "peft", "--out", str(tmp_path / "adapter"))
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "--format hf" in r.stderr, r.stderr
    assert not (tmp_path / "adapter").exists()
    assert run_cli("export", str(out), "--out", str(tmp_path / "merged")).returncode == 0
