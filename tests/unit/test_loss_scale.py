"""The fp16 loss scaler's rules (its distributed use: tests/integration/test_train_features.py)."""

import torch

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
    assert t.state_dict() == {"scale": 8.0, "good_steps": 1}
    gradscaler = {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5,
                  "growth_interval": 2000, "_growth_tracker": 5}  # torch.amp.GradScaler.state_dict()
    t.load_state_dict(gradscaler)
    assert t.state_dict() == {"scale": 65536.0, "good_steps": 5}
