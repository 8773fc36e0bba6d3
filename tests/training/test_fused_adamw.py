"""The trainer's AdamW runs torch's fused kernel (one kernel for all parameters, for speed): the same
update as the plain loop, to float rounding."""

from __future__ import annotations

import torch

from rlvr.training.loop import adamw


def _train(make, steps: int = 5) -> list[torch.Tensor]:
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(shape)) for shape in [(64, 32), (32,), (7, 3, 5)]]
    opt = make(params)
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g) * 10 ** (step % 3 - 1)
        opt.step()
    return [p.detach() for p in params]


def test_fused_adamw_takes_the_plain_loops_steps():
    kw = dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    fused = _train(lambda ps: adamw(ps, **kw))
    plain = _train(lambda ps: torch.optim.AdamW(ps, foreach=False, **kw))
    start = _train(lambda ps: torch.optim.AdamW(ps, foreach=False, **kw), steps=0)
    for f, p, s in zip(fused, plain, start):
        torch.testing.assert_close(f, p, rtol=1e-6, atol=1e-6)
        assert not torch.equal(p, s)  # the weights moved: the comparison is not vacuous


def test_the_trainer_optimizer_is_fused_on_cpu():
    opt = adamw([torch.nn.Parameter(torch.zeros(3))], lr=1e-3, betas=(0.9, 0.99), weight_decay=0.0)
    assert opt.defaults["fused"] is True
