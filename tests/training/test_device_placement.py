"""Tensors are made on the batch's device (the contributing guide's rule), checked where it can be on a CPU:
statically over the code that handles batches, and with the ``meta`` device standing in for a GPU, which
raises the same "not on the expected device" error a CPU tensor meeting a CUDA one raises."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import torch

from rlvr.config import load_config
from rlvr.training.sampling import _sample_and_score

REPO = Path(__file__).resolve().parents[2]
FACTORIES = {"tensor", "zeros", "ones", "arange", "full", "empty", "randn", "rand", "randint", "linspace", "eye"}
CHECKED = ["rlvr/training", "rlvr/algos", "rlvr/rollout", "rlvr/evaluation", "rlvr/distributed"]


def _unplaced(path: Path) -> list[str]:
    """``torch.<factory>(...)`` calls with no ``device=`` and no ``# cpu: <why>`` on their lines or the line above."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for node in ast.walk(ast.parse("\n".join(lines))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in FACTORIES
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "torch"
            and not any(k.arg == "device" for k in node.keywords)
        ):
            span = lines[max(0, node.lineno - 2) : node.end_lineno]
            if not any("# cpu:" in line for line in span):
                out.append(f"{path.relative_to(REPO)}:{node.lineno}: torch.{node.func.attr}(...) without device=")
    return out


def test_tensors_are_made_on_the_batchs_device_or_say_why_not():
    problems = [p for d in CHECKED for f in sorted((REPO / d).rglob("*.py")) for p in _unplaced(f)]
    assert not problems, (
        "pass device= (the batch's), or say why the CPU is right with '# cpu: <why>':\n  " + "\n  ".join(problems)
    )


def test_the_rule_finds_a_tensor_made_without_a_device(tmp_path):
    f = REPO / "rlvr" / "training" / "_probe_for_test.py"
    try:
        f.write_text(
            "import torch\n\nx = torch.zeros(3)\ny = torch.zeros(3, device='cpu')\nz = torch.ones(2)  # cpu: why\n"
        )
        assert _unplaced(f) == ["rlvr/training/_probe_for_test.py:3: torch.zeros(...) without device="]
    finally:
        f.unlink()


class _Engine:
    """An engine whose batch lives on another device (``meta``) than the CPU."""

    def generate(self, prompts, G, seeds=None):
        n = len(prompts) * G
        return SimpleNamespace(
            texts=["<answer>7</answer>"] * n,
            truncated=torch.zeros(n, dtype=torch.bool),
            response_lengths=torch.full((n,), 8, device="meta"),
            response_extent=torch.full((n,), 8, device="meta"),
        )


class _Scorer:
    def score(self, said, answers, fields, truncated=None):
        return SimpleNamespace(
            total=[1.0] * len(said), per_rule={"accuracy": [1.0] * len(said), "format": [1.0] * len(said)}, errors={}
        )


def test_dapo_rewards_are_made_on_the_batchs_device():
    """DAPO's overlong penalty crashed the first CUDA step: the rewards were made on the CPU and met the
    batch's lengths on the GPU (`Expected all tensors to be on the same device`)."""
    cfg = load_config("dapo", ["rollout.samples_per_prompt=2", "rollout.max_new_tokens=8", "algo.overlong_buffer=4"])
    assert cfg.algo.overlong_buffer > 0
    rows = [{"prompt": "what is 3 + 4 ?", "answer": "7"}]
    timing = {"rollout": 0.0, "reward": 0.0}
    scored = _sample_and_score(_Engine(), _Scorer(), rows, cfg, "", timing, [1, 2])
    assert scored.rewards.device.type == "meta"
