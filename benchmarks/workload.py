"""What the rollout benchmarks share (``vs_trl.py``, ``decode.py``): the model (the built-in one, or a
random-initialised one of a published shape, optionally with an EOS rate), the prompts, and the
device's measured rates.

**The random model** (``random:SHAPE``): a seeded Qwen2 of a published shape with the built-in
model's tokenizer, because no weights reach a machine without a network and the speed of a step
does not depend on the weights' values. Its EOS token never comes (probability about 1 / vocabulary
per token: the tokenizer's pad token is its EOS token, so the initialiser zeroes that embedding row,
which is also the tied LM head's row), so every response runs to the length limit.

**The EOS rate** (``eos_every=N``): the LM head's EOS row (the tied embedding row; a bias, if the
head had one, stays as it is) gets a multiple of the mean direction of the model's final hidden
states, chosen so that EOS has probability 1/N on typical states: responses then end after about N
tokens, with geometric lengths (long-tailed, as a real policy's are). How the multiple is chosen, by
measurement: rlvr's engine samples N tokens (64 to 512) after each of the benchmark's first
``CALIBRATION_PROMPTS`` prompts; with the final (normed) hidden states h that chose them, their
logits z and the unit mean direction u of the h, the EOS logit becomes z_eos + a·(h·u), and ``a`` is
solved by bisection so that the mean over the states of sigmoid(z_eos + a·(h·u) − logsumexp of the
other logits), the softmax's EOS probability, is 1/N. On the random Qwen2 shapes h·u is nearly the
same on every state (tiny: mean 23, standard deviation 1.2, for states of norm about 30), so this is
close to a constant shift of the EOS logit. Scaling the row, the obvious alternative, does nothing
to a zero row, and on a random one gives a logit of either sign per state. A tied head's change also
moves EOS's input embedding, which the prompts contain, so the solve runs twice (the second time on
the same samples' states with the first change in place); the probability reached is then measured
on the states of the next ``CALIBRATION_PROMPTS`` prompts' samples. ``eos_calibration.json`` in the
model directory (copied into each benchmark's result file) holds the multiples, that probability
and the mean length it implies for independent draws, which the benchmarks set beside the lengths
they measure. The weights are saved in the model directory before any benchmark loads them, so
every side of a comparison loads the same weights.

Imports here stay inside the functions: ``vs_trl.py``'s TRL child imports this module in TRL's venv.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

MODEL = "smollm2-135m-instruct"
"""The built-in model (``--model builtin``); its tokenizer is every random model's."""
PREFIX = "<think>"
"""The assistant prefix rlvr's quickstart opens the answer with; part of every benchmark prompt."""
DATA = {
    "task": "files",
    "preset": "custom",
    "template": "r1",
    "assistant_prefix": PREFIX,
    "cache": False,
    "num_workers": 1,
}
"""rlvr's ``data`` settings of the benchmark prompts, less the file's path."""
RANDOM_SHAPES = {
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "tiny": None,  # 2 layers of a Qwen2 shape: a smoke test of the plumbing, not a measurement
}
EOS_FILE = "eos_calibration.json"
CALIBRATION_PROMPTS = 8
"""Prompts whose samples the EOS row is fitted on; as many more check the fit."""
CALIBRATION_TOKENS = (64, 512)
"""Tokens sampled after each calibration prompt: ``eos_every``, within these bounds (the states of a
response's whole typical length, at a bounded cost)."""
LOGIT_CHUNK = 256
"""States whose [n, V] logits are computed at once while calibrating (bounds the memory)."""


def two_digit_additions(n: int, seed: int = 0) -> list[dict]:
    """``n`` distinct ``{"question": "What is a + b?", "answer": str(a + b)}`` with 10 <= a, b <= 99."""
    rng, rows, seen = random.Random(seed), [], set()
    while len(rows) < n:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        question = f"What is {a} + {b}?"
        if question not in seen:
            seen.add(question)
            rows.append({"question": question, "answer": str(a + b)})
    return rows


def rendered_prompts(tokenizer, n: int, workdir: Path) -> list[dict]:
    """The first ``n`` two-digit additions rendered by rlvr's own data preparation with :data:`DATA`
    (``vs_trl.py``'s prompts): rows with ``prompt`` (text) and ``prompt_tokens``."""
    from rlvr.config import DataConfig
    from rlvr.data import prepare

    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"prompts-{n}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in two_digit_additions(n)))
    return prepare(DataConfig(**DATA, path=str(path)), tokenizer).rows


def model_dir(spec: str, workdir: Path, *, eos_every: int | None = None, device: str = "cpu") -> Path:
    """The local directory of ``--model``: ``builtin`` (:data:`MODEL`), ``random:SHAPE`` (built, and
    calibrated for ``eos_every``, under ``workdir`` on first use), or a model directory or name."""
    from rlvr.models import resolve_model_path

    if spec.startswith("random:"):
        name = spec.removeprefix("random:")
        out = workdir / f"model-{name}" if eos_every is None else workdir / f"model-{name}-eos{eos_every}"
        return random_model(name, out, eos_every=eos_every, device=device)
    if eos_every is not None:
        sys.exit(f"--eos-every applies to a random model (--model random:SHAPE), not to --model {spec}")
    return resolve_model_path(MODEL if spec == "builtin" else spec)


def random_model(name: str, out: Path, *, eos_every: int | None = None, device: str = "cpu") -> Path:
    """A random-initialised (seed 0) float32 Qwen2 model of a published shape (``rlvr.estimate.KNOWN_MODELS``)
    saved in ``out`` with the built-in model's tokenizer; with ``eos_every``, its EOS row calibrated by
    :func:`calibrate_eos` on ``device`` (see the module docstring). Built once: an ``out`` that holds
    the model (and the calibration) is returned as it is."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlvr.estimate import KNOWN_MODELS
    from rlvr.models import load_tokenizer, resolve_model_path

    if name not in RANDOM_SHAPES:
        sys.exit(f"--model random:{name}: unknown shape; use one of {', '.join('random:' + k for k in RANDOM_SHAPES)}")
    if not (out / "config.json").is_file():
        tokenizer = load_tokenizer(resolve_model_path(MODEL))
        s = KNOWN_MODELS[RANDOM_SHAPES[name] or "Qwen/Qwen2.5-0.5B"]
        layers = 2 if name == "tiny" else s.num_hidden_layers
        config = Qwen2Config(
            vocab_size=s.vocab_size,
            hidden_size=s.hidden_size,
            intermediate_size=s.intermediate_size,
            num_hidden_layers=layers,
            num_attention_heads=s.num_attention_heads,
            num_key_value_heads=s.num_key_value_heads,
            tie_word_embeddings=s.tie_word_embeddings,
            max_position_embeddings=4096,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    if eos_every is not None and not (out / EOS_FILE).is_file():
        calibrate_eos(out, eos_every, device=device)
    return out


def eos_calibration(path: Path) -> dict | None:
    """The EOS calibration saved with a model directory (:func:`calibrate_eos`), or None."""
    f = Path(path) / EOS_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def eos_shift(base, proj, other, target: float) -> float:
    """The ``a`` >= 0 with mean(sigmoid(base + a·proj − other)) = ``target``: the multiple of the hidden
    states' mean direction to add to the EOS row (see the module docstring).

    Args:
        base: [n] the EOS logit on each state now.
        proj: [n] each state's component along the direction (h·u).
        other: [n] logsumexp of every other logit on each state.
        target: the EOS probability wanted, 1/N.

    Math: sigmoid(z_eos − lse(others)) is the softmax's EOS probability; its mean over the states is
    increasing in ``a`` where proj > 0, so bisection (60 halvings, float64) finds the root.

    Raises:
        ValueError: no ``a`` reaches ``target`` (the states point away from their mean direction).
    """
    import torch

    base, proj, other = (torch.as_tensor(t, dtype=torch.float64) for t in (base, proj, other))

    def mean_p(a: float) -> float:
        return torch.sigmoid(base + a * proj - other).mean().item()

    if mean_p(0.0) >= target:
        return 0.0
    lo, hi = 0.0, 1.0
    while mean_p(hi) < target:
        lo, hi = hi, 2 * hi
        if hi > 1e6:
            raise ValueError(f"no multiple of the mean direction gives EOS probability {target:.3g}")
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_p(mid) < target else (lo, mid)
    return (lo + hi) / 2


def calibrate_eos(path: Path, eos_every: int, *, device: str = "cpu", rounds: int = 2) -> dict:
    """Make EOS come about every ``eos_every`` tokens in the model saved at ``path`` (module docstring):
    sample once, solve and apply the EOS row's change ``rounds`` times on the states of half the rows,
    measure the EOS probability on the other half's, save the weights and ``eos_calibration.json``
    there. Returns what the JSON holds."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlvr.models import load_tokenizer

    t0 = time.perf_counter()
    tokenizer = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(device).eval()
    rows = rendered_prompts(tokenizer, 2 * CALIBRATION_PROMPTS, path / "calibration")
    tokens = min(max(eos_every, CALIBRATION_TOKENS[0]), CALIBRATION_TOKENS[1])
    ids, mask, start, response_mask = _sample(model, tokenizer, [r["prompt"] for r in rows], tokens)
    fit, check = slice(0, CALIBRATION_PROMPTS), slice(CALIBRATION_PROMPTS, None)
    eos = tokenizer.eos_token_id
    head = model.get_output_embeddings()
    target = 1.0 / eos_every

    @torch.no_grad()
    def states(part: slice):
        h = _states(model, ids[part], mask[part], start, response_mask[part])  # [n, d]
        z_eos, other = [], []
        for chunk in h.split(LOGIT_CHUNK):
            logits = head(chunk).float()  # [c, V]
            lse, z = logits.logsumexp(dim=1).double(), logits[:, eos].double()
            z_eos.append(z)
            other.append(lse + torch.log1p(-torch.exp(z - lse)))  # logsumexp of every logit but EOS's
        return h.double(), torch.cat(z_eos), torch.cat(other)

    shifts = []
    for _ in range(rounds):  # again after the first: a tied head's change moves the prompts' states too
        h, z_eos, other = states(fit)
        mean = h.mean(dim=0)
        u = mean / mean.norm()  # [d] the states' mean direction
        proj = h @ u  # [n]
        a = eos_shift(z_eos, proj, other, target)
        with torch.no_grad():
            head.weight[eos] += (a * u).to(head.weight.dtype)
        shifts.append({"multiple": a, "proj_mean": proj.mean().item(), "proj_std": proj.std().item()})
    _, z_eos, other = states(check)
    p = torch.sigmoid(z_eos - other).mean().item()
    result = {
        "eos_every": eos_every,
        "eos_token_id": eos,
        "target_probability": target,
        "eos_probability": p,
        "mean_len_if_independent": 1 / p,
        "rounds": shifts,
        "eos_row_norm": head.weight[eos].norm().item(),
        "tokens_sampled": tokens,
        "fit_states": int(response_mask[fit].sum()),
        "check_states": z_eos.shape[0],
        "device": device,
        "seconds": time.perf_counter() - t0,
        "how": "EOS row += a * (unit mean of the final hidden states); a solved so that the mean softmax EOS "
        "probability over sampled states is 1/eos_every; eos_probability measured on other prompts' states "
        "(benchmarks/workload.py)",
    }
    model.to("cpu").save_pretrained(path)
    (path / EOS_FILE).write_text(json.dumps(result, indent=2) + "\n")
    return result


def expected_len_mean(eos_probability: float, max_new_tokens: int) -> float:
    """Mean response length if every token were EOS with probability p, independently, cut at the
    limit: E[min(L, M)] for geometric L = (1 − (1 − p)^M) / p (tokens, EOS counted)."""
    p = eos_probability
    return (1 - (1 - p) ** max_new_tokens) / p if p > 0 else float(max_new_tokens)


def _sample(model, tokenizer, prompts: list[str], tokens: int):
    """Sample up to ``tokens`` tokens after each prompt with rlvr's engine (temperature 1, seeded; the
    dynamic decode, which compiles nothing): the ids [rows, prompt + T], their attention mask, the padded
    prompt length and the response mask [rows, T]."""
    from rlvr.rollout import HFRolloutEngine

    engine = HFRolloutEngine(model, tokenizer, max_new_tokens=tokens, batch_seqs=len(prompts), static_decode=False)
    batch = engine.generate(prompts, 1, seeds=list(range(len(prompts))))
    return batch.input_ids, batch.attention_mask, batch.prompt_len, batch.response_mask


def _states(model, ids, mask, start: int, response_mask):
    """The final normed hidden states [n, d] that chose the sampled tokens (the prompt's last position
    included) under the model's current weights."""
    import torch

    positions = (mask.cumsum(1) - 1).clamp(min=0)  # left padding: each row's positions start at 0
    with torch.no_grad():
        hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
        T = response_mask.shape[1]
        return hidden[:, start - 1 : start - 1 + T][response_mask.bool()]  # [n, d]: one per sampled token


def device_rates(device: str, dtype: str) -> dict:
    """What ``device`` sustains, measured here: matmul FLOP/s of 4096 x 4096 products (1024 on a CPU, the
    faster of MKL's and oneDNN's packed product, as ``roofline.py`` measures) in ``dtype``, and the
    bandwidth of reading (a sum) and of copying (read + write bytes) a 1 GiB tensor (256 MiB on a CPU),
    best of 5 each; for the rollout's roofline floor. ``bytes_per_s`` is the faster of the two: a
    floor takes the best rate the device shows, and a decode step mostly reads its weights (copy
    bandwidth alone, as before 2026-11-27, put a CPU's floor above a measured rollout)."""
    import torch

    dt = getattr(torch, dtype)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def best(fn) -> float:
        fn()
        sync()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return min(times)

    n = 4096 if device.startswith("cuda") else 1024
    a, b = torch.randn(n, n, device=device, dtype=dt), torch.randn(n, n, device=device, dtype=dt)
    flops = 2 * n**3 / best(lambda: a @ b)
    if not device.startswith("cuda"):  # rlvr's rollout multiplies by oneDNN-packed weights: the faster of the two
        from rlvr.cpu.packed import dtype_unpackable, pack_weight, packed_linear

        if dtype_unpackable(dt) is None:
            packed = pack_weight(b.t(), n)
            flops = max(flops, 2 * n**3 / best(lambda: packed_linear(a, packed)))
    x = torch.empty(2**28 if device.startswith("cuda") else 2**26, device=device, dtype=torch.float32)
    y = torch.empty_like(x)
    copy = 2 * x.numel() * 4 / best(lambda: y.copy_(x))
    read = x.numel() * 4 / best(lambda: x.sum())
    return {
        "matmul_flops_per_s": flops,
        "bytes_per_s": max(read, copy),
        "read_bytes_per_s": read,
        "copy_bytes_per_s": copy,
        "matmul_dtype": dtype,
    }


def machine(device: str) -> dict:
    """The device, the CPU's dispatch level, threads and load: the facts every result file carries."""
    import os
    import platform

    import torch

    return {
        "device": device,
        "gpu": torch.cuda.get_device_name(device) if device.startswith("cuda") else None,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "load_avg_1m_at_end": os.getloadavg()[0],
    }


def slug(text: str) -> str:
    """``NVIDIA H100 80GB HBM3`` -> ``nvidia-h100-80gb-hbm3``: a device name for a file name."""
    return "-".join(filter(None, "".join(c if c.isalnum() else " " for c in text.lower()).split()))
