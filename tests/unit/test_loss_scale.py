"""The fp16 loss scaler's rules (its distributed use: tests/integration/test_train_features.py)."""

import pytest
import torch

from gptrain.config_options import parse_train_args
from gptrain.errors import UserError
from gptrain.train.loss_scale import LossScaler


def test_backs_off_on_overflow_and_grows_after_a_good_run():
    s = LossScaler(scale=1024.0, interval=3)
    s.update(finite=False)
    assert s.scale == 512.0 and s.good_steps == 0
    for _ in range(2):
        s.update(finite=True)
    assert s.scale == 512.0
    s.update(finite=True)
    assert s.scale == 1024.0 and s.good_steps == 0
    s.update(finite=True)
    s.update(finite=False)  # an overflow resets the run
    assert s.scale == 512.0 and s.good_steps == 0


def test_scaled_backward_then_unscale_gives_the_plain_gradients():
    model = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    model(x).square().mean().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    s = LossScaler(scale=2.0**10)
    s.scale_loss(model(x).square().mean()).backward()
    s.unscale_([model])
    for p, g in zip(model.parameters(), expected):
        torch.testing.assert_close(p.grad, g)


def test_state_round_trips_and_reads_gradscaler_state():
    s = LossScaler(scale=8.0)
    s.update(finite=True)
    t = LossScaler()
    t.load_state_dict(s.state_dict())
    assert t.state_dict() == {"scale": 8.0, "good_steps": 1, "overflows_left": 1}
    gradscaler = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 2000, "_growth_tracker": 5}  # torch.amp.GradScaler.state_dict()
    t.load_state_dict(gradscaler)
    assert t.state_dict() == {"scale": 65536.0, "good_steps": 5, "overflows_left": 1}


def test_hysteresis_and_floor_as_deepspeed():
    s = LossScaler(scale=8.0, interval=2, hysteresis=2, min_scale=2.0)
    s.update(finite=False)  # the first overflow is tolerated (the step is still skipped)
    assert s.scale == 8.0
    s.update(finite=False)
    assert s.scale == 4.0
    s.update(finite=False)  # no more tolerance until the scale grows again
    assert s.scale == 2.0
    s.update(finite=False)
    assert s.scale == 2.0  # the floor
    s.update(finite=True)
    s.update(finite=True)
    assert s.scale == 4.0 and s.overflows_left == 2
    s.update(finite=False)
    assert s.scale == 4.0


def test_from_config_static_and_dynamic():
    static = LossScaler.from_config(parse_train_args(["--train.loss_scale=128"]).train)
    for finite in (False, True, True):
        static.update(finite)
    assert static.scale == 128.0
    dynamic = LossScaler.from_config(parse_train_args([
        "--train.loss_scale_initial=1024", "--train.loss_scale_window=1000",
        "--train.loss_scale_hysteresis=2", "--train.loss_scale_min=4"]).train)
    assert (dynamic.scale, dynamic.interval, dynamic.hysteresis, dynamic.min_scale) == (1024.0, 1000, 2, 4.0)


@pytest.mark.parametrize("flag", ["--train.loss_scale=-1", "--train.loss_scale_window=0",
                                  "--train.loss_scale_hysteresis=0", "--train.loss_scale_min=0",
                                  "--train.loss_scale_initial=0"])
def test_from_config_rejects_nonsense(flag):
    with pytest.raises(UserError, match=flag[2:].split("=")[0]):
        LossScaler.from_config(parse_train_args([flag]).train)
