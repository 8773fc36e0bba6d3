"""The lr schedule (transformers' schedules where one matches rlvr's): hand values
for every schedule and warmup / min_lr_ratio setting, equality with the schedule rlvr had before,
and a resume through the scheduler's state_dict."""

from __future__ import annotations

import io
import math

import pytest
import torch

from rlvr.training.loop import lr_scheduler


def _optimizer(lr: float = 1.0) -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _lrs(sched, n: int) -> list[float]:
    """The lr of the next ``n`` optimizer steps (what train/lr logs), stepping as the trainer does."""
    out = []
    for _ in range(n):
        out.append(sched.get_last_lr()[0])
        sched.optimizer.step()
        sched.step()
    return out


def _schedule(schedule, warmup, total, min_lr_ratio=0.1, lr=1.0):
    return lr_scheduler(
        _optimizer(lr), schedule=schedule, warmup_steps=warmup, total_steps=total, min_lr_ratio=min_lr_ratio
    )


# cos(pi/4) = 0.70710678; cosine to 0.1 at progress p: 0.1 + 0.9 * 0.5 * (1 + cos(pi p))
#   p = 1/4: 0.1 + 0.45 * 1.70710678 = 0.86819805;  p = 1/2: 0.1 + 0.45 = 0.55
#   p = 3/4: 0.1 + 0.45 * 0.29289322 = 0.23180195;  p = 1:   0.1 + 0 = 0.1
HAND = {
    # (schedule, warmup, total, min_lr_ratio): lr of steps 0, 1, 2, ...
    ("constant", 0, 4, 0.1): [1.0] * 6,
    # warmup (s + 1)/W: 1/3, 2/3, then the peak from step W - 1 = 2 on
    ("constant", 3, 5, 0.1): [1 / 3, 2 / 3, 1.0, 1.0, 1.0, 1.0, 1.0],
    ("constant", 1, 4, 0.1): [1.0] * 6,
    # cosine over N = 4 steps from step 0, p = s/4; held at 0.1 past the horizon
    ("cosine", 0, 4, 0.1): [1.0, 0.86819805, 0.55, 0.23180195, 0.1, 0.1, 0.1],
    # to 0: 0.5 * (1 + cos(pi p)) = 0.85355339, 0.5, 0.14644661, 0
    ("cosine", 0, 4, 0.0): [1.0, 0.85355339, 0.5, 0.14644661, 0.0, 0.0],
    ("cosine", 0, 4, 1.0): [1.0] * 6,
    # warmup 1/2, 1 (steps 0-1), then the cosine starts at the peak on step W = 2, p = (s - 2)/4
    ("cosine", 2, 6, 0.1): [0.5, 1.0, 1.0, 0.86819805, 0.55, 0.23180195, 0.1, 0.1],
    # warmup longer than the run: 1/5 ... 1 over steps 0-4, then p = (s - 5)/max(1, 3 - 5) = s - 5
    ("cosine", 5, 3, 0.1): [0.2, 0.4, 0.6, 0.8, 1.0, 1.0, 0.1, 0.1],
}


@pytest.mark.parametrize("key", list(HAND), ids=lambda k: "-".join(map(str, k)))
def test_lr_sequence_hand_values(key):
    schedule, warmup, total, min_lr_ratio = key
    want = HAND[key]
    got = _lrs(_schedule(schedule, warmup, total, min_lr_ratio, lr=2e-3), len(want))
    assert got == pytest.approx([2e-3 * w for w in want], rel=0, abs=2e-3 * 1e-8)


def _old_lr_lambda(*, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float):
    """The schedule rlvr had before transformers' (naive reference): the values must not change."""

    def f(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


GRID = [
    (schedule, warmup, total, min_lr_ratio)
    for schedule in ("constant", "cosine")
    for warmup in (0, 1, 2, 3, 7, 40)
    for total in (1, 2, 5, 12, 37)
    for min_lr_ratio in (0.0, 0.1, 0.05, 1 / 3, 0.9, 1.0)
]


def test_lr_values_equal_the_old_schedule_bit_for_bit():
    for schedule, warmup, total, min_lr_ratio in GRID:
        old = _old_lr_lambda(warmup_steps=warmup, total_steps=total, schedule=schedule, min_lr_ratio=min_lr_ratio)
        lr = 1e-5
        want = [lr * old(s) for s in range(total + 3)]  # + 3: past the horizon (a resume with fewer iterations)
        got = _lrs(_schedule(schedule, warmup, total, min_lr_ratio, lr=lr), total + 3)
        assert got == want, (schedule, warmup, total, min_lr_ratio)


@pytest.mark.parametrize("key", [("constant", 3, 8, 0.1), ("cosine", 0, 8, 0.1), ("cosine", 3, 8, 0.2)])
def test_resume_through_state_dict_continues_the_sequence(key):
    schedule, warmup, total, min_lr_ratio = key
    straight = _lrs(_schedule(schedule, warmup, total, min_lr_ratio), total + 1)
    first = _schedule(schedule, warmup, total, min_lr_ratio)
    head = _lrs(first, 4)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)  # as the checkpoint stores it
    buf.seek(0)
    resumed = _schedule(schedule, warmup, total, min_lr_ratio)
    resumed.load_state_dict(torch.load(buf, weights_only=False))
    assert head + _lrs(resumed, total + 1 - 4) == straight


def test_a_checkpoint_of_the_old_schedule_resumes_on_the_new_one():
    """Checkpoints written before the change hold a LambdaLR state with a plain function (not saved)."""
    opt = _optimizer()
    old = torch.optim.lr_scheduler.LambdaLR(
        opt, _old_lr_lambda(warmup_steps=2, total_steps=8, schedule="cosine", min_lr_ratio=0.1)
    )
    head = _lrs(old, 3)
    resumed = _schedule("cosine", 2, 8, 0.1)
    resumed.load_state_dict(old.state_dict())
    assert head + _lrs(resumed, 6) == _lrs(_schedule("cosine", 2, 8, 0.1), 9)
