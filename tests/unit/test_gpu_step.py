"""What a GPU step costs besides its kernels, checked on a CPU (issue #46): the loss's backward
writes nothing the size of the logits beyond what the loss needs, a step reads from the device
at most once (when it logs) and never when it does not, and the batches it is handed are
contiguous (a pinned copy of a view goes to the GPU through a pageable temporary)."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from gptrain.models.base import cross_entropy
from tests.helpers import TINY, metrics_rows

READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "cpu", "numpy")


def _tiny_model(fused_loss=False, vocab=65):
    from gptrain.models.registry import build
    from gptrain.models.shapes import GPTConfig

    torch.manual_seed(0)
    model = build(GPTConfig(vocab_size=vocab, n_layer=1, n_head=2, n_embd=16, block_size=8))
    model.fused_loss = fused_loss
    return model


def _graph_nodes(loss):
    seen, todo = set(), [loss.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        todo += [nxt for nxt, _ in fn.next_functions]
    return {type(fn).__name__ for fn in seen}


def test_the_loss_graph_holds_no_slice_of_the_padded_logits():
    model = _tiny_model()
    assert model.config.padded_vocab_size > model.config.vocab_size  # 65 -> 128: padded columns
    x = torch.randint(0, 65, (2, 8))
    _, loss = model(x, x)
    nodes = _graph_nodes(loss)
    assert not {n for n in nodes if n.startswith(("Slice", "AsStrided", "Narrow"))}, nodes


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_masked_loss_equals_the_sliced_reference_in_value_and_gradient(dtype):
    torch.manual_seed(1)
    V = 50
    logits = torch.randn(3, 7, 64, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, V, (3, 7))
    targets[0, :2] = -100  # ignored positions
    loss = cross_entropy(logits, targets, V)
    (grad,) = torch.autograd.grad(loss, logits)
    ref_logits = logits.detach().clone().requires_grad_()
    ref = F.cross_entropy(ref_logits[..., :V].float().reshape(-1, V), targets.reshape(-1), ignore_index=-100)
    (ref_grad,) = torch.autograd.grad(ref, ref_logits)
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(grad, ref_grad)
    assert not grad[..., V:].any()  # the padded columns' rows of lm_head learn nothing


def test_the_model_loss_and_gradients_equal_the_sliced_reference():
    model = _tiny_model()
    x = torch.randint(0, 65, (2, 8))
    _, loss = model(x, x)
    loss.backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = model(x)  # the real columns only
    ref = F.cross_entropy(logits.reshape(-1, 65), x.reshape(-1))
    ref.backward()
    torch.testing.assert_close(loss, ref)
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, msg=n)


@pytest.mark.parametrize("fused_loss", [True, False])
def test_a_step_reads_the_device_once_when_it_logs_and_never_otherwise(data, tmp_path, monkeypatch, fused_loss):
    """Every read of a tensor's value on the host (each one waits for the device on a GPU),
    counted from one step's start to the next: the step, its log line and the next step's read
    ahead. One process: DDP and FSDP add a collective for the stop flag each step (a read of it),
    and FSDP's sharded optimizer decides on the host whether a step was finite (train/finite.py)."""
    from gptrain.config_options import parse_train_args
    from gptrain.train import trainer

    reads, starts, handed = [], [], []
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *a, _name=name, _original=original, **k):
            reads.append(_name)
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    step = trainer.Trainer.train_step

    def marked(self, batches):
        starts.append(len(reads))
        handed.extend(t for batch in batches for t in batch)
        return step(self, batches)

    monkeypatch.setattr(trainer.Trainer, "train_step", marked)
    out = tmp_path / "run"
    cfg = parse_train_args([f"--data.path={data}", f"--train.output_dir={out}", "--train.max_steps=7", *TINY,
                            "--metrics.log_every=3", "--train.batch_size=2", "--train.do_eval=false",
                            f"--train.fused_loss={str(fused_loss).lower()}"])
    assert trainer.train(cfg)["status"] == "completed"
    monkeypatch.undo()
    per_step = [b - a for a, b in zip(starts, starts[1:])]  # steps 1..6 (7 ends with the save)
    logged = {r["step"] for r in metrics_rows(out) if "train/loss" in r}
    assert logged == {1, 3, 6, 7}
    assert per_step == [1 if s in logged else 0 for s in range(1, 7)], per_step
    assert handed and all(t.is_contiguous() for t in handed)
    rows = [r for r in metrics_rows(out) if "train/step_s" in r]  # perf_counter, to the microsecond
    assert len(rows) == 4 and all(r["train/step_s"] > 0 for r in rows)
    shutil.rmtree(out)


def test_the_compiled_head_region_equals_eager():
    """distributed/parallelize.py compiles ln_f, lm_head and the loss as one region."""
    from gptrain.distributed.parallelize import apply_compile

    eager, compiled = _tiny_model(), _tiny_model()
    for block in compiled.transformer.h.values():  # the head region alone (the blocks are tested elsewhere)
        block.compile = lambda: None
    apply_compile(compiled)
    assert compiled.head_loss is not eager.head_loss and hasattr(compiled.head_loss, "_torchdynamo_orig_callable")
    x = torch.randint(0, 65, (2, 8))
    for model in (eager, compiled):
        _, loss = model(x, x)
        loss.backward()
        model.loss = loss.detach()
    torch.testing.assert_close(compiled.loss, eager.loss)
    for (n, a), (_, b) in zip(eager.named_parameters(), compiled.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, msg=n)
