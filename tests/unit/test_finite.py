"""A non-finite step skipped on the device (train/finite.py) leaves the model and AdamW exactly
as a step skipped on the host would (no optimizer step at all), and a finite one exactly as a
plain step; what was skipped is read back once, with its first step."""

import copy

import torch

from gptrain.train import finite
from gptrain.train.loss_scale import LossScaler


def _model_and_optimizer(fused=True):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1, **({"fused": True} if fused else {}))
    return model, opt


def _grads(model, value=None):
    x = torch.randn(4, 8)
    loss = model(x).square().mean()
    loss.backward()
    if value is not None:
        for p in model.parameters():
            p.grad.fill_(value)


def _state(model, opt):
    return copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())


def _same(a, b):
    (ma, oa), (mb, ob) = a, b
    assert all(torch.equal(ma[k], mb[k]) for k in ma)
    for i, s in oa["state"].items():
        assert all(torch.equal(torch.as_tensor(s[k]), torch.as_tensor(ob["state"][i][k])) for k in s), i


def test_steps_match_the_host_decision():
    model, opt = _model_and_optimizer()
    ref_model, ref_opt = _model_and_optimizer()
    skips = finite.DeviceSkips("cpu")
    for step, value in enumerate([None, float("nan"), None, float("inf"), float("nan"), None], start=1):
        for m in (model, ref_model):
            torch.manual_seed(step)
            _grads(m, value)
        ok = torch.tensor(value is None)
        skips.step([opt], ok, step)
        if bool(ok):  # the reference: decided on the host, as with fp16 or sharded parameters
            ref_opt.step()
        ref_opt.zero_grad(set_to_none=True)
        _same(_state(model, opt), _state(ref_model, ref_opt))
        assert all(p.grad is None for p in model.parameters())
    assert skips.take() == (3, 2, False)
    assert skips.take() == (0, -1, False)  # read once


def test_only_fused_optimizers_without_a_loss_scale_decide_on_the_device():
    _, fused = _model_and_optimizer()
    _, foreach = _model_and_optimizer(fused=False)
    assert finite.on_device([fused], None)
    assert not finite.on_device([fused, foreach], None)
    assert not finite.on_device([fused], LossScaler())
