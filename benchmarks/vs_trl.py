"""rlvr against TRL's GRPOTrainer on the same GRPO work, one after the other, each in its own process.

    .venv/bin/python benchmarks/vs_trl.py                       # 4 steps, 2 prompts x G=8, 128 new tokens, fp32
    .venv/bin/python benchmarks/vs_trl.py --precision bf16      # both in bf16 mixed precision
    .venv/bin/python benchmarks/vs_trl.py --steps 2 --prompts-per-step 1 --group-size 2 \\
        --max-new-tokens 8   # smoke test
    .venv/bin/python benchmarks/vs_trl.py --only trl            # one side only (no ratio)

    .venv/bin/python benchmarks/vs_trl.py --device cuda --model random:qwen2.5-0.5b --precision bf16 \\
        --prompts-per-step 8 --group-size 8 --max-new-tokens 256 --steps 5   # on a GPU
    .venv/bin/python benchmarks/vs_trl.py --only rlvr --model random:tiny --steps 2 --prompts-per-step 1 \\
        --group-size 2 --max-new-tokens 8 --micro-batch-seqs 2   # the plumbing, on a CPU, in a minute
    .venv/bin/python benchmarks/vs_trl.py --device cuda --model random:qwen2.5-0.5b --precision bf16 \\
        --prompts-per-step 8 --group-size 8 --max-new-tokens 1024 --eos-every 300   # long-tailed lengths

**On a GPU, or without the built-in weights**: ``--device cuda`` trains both sides there (TRL without
``use_cpu``); ``--model random:SHAPE`` builds a random-initialised model of a published shape
(``qwen2.5-0.5b``, ``qwen2.5-1.5b``, ``qwen2.5-7b``; ``tiny`` = 2 layers, for smoke tests) with the
built-in tokenizer, because no weights reach a machine without a network, and scores both sides
with ``spread_reward.py`` (the share of distinct characters), which varies by completion, so every
group has a spread and the update does the work a real run does. The result file then also holds
each side's ``torch.cuda.max_memory_allocated``, the device's measured matmul rate and
bandwidth (the faster of reading and copying), and the rollout's roofline floor on them beside each
side's generation time; it is named ``vs_trl-<date>-<gpu>.json``.

**Variable lengths** (``--eos-every N``, random models only): a random model never samples EOS, so
every response runs to ``--max-new-tokens`` and neither side's handling of finished rows is
exercised. With ``--eos-every N`` the random model's EOS row is calibrated once, by measurement on
its own hidden states, so that EOS has probability about 1/N per token (lengths about geometric,
mean about N, long-tailed; ``workload.py`` says how), and saved in the model's directory
(``WORKDIR/model-SHAPE-eosN``) before either side loads it: both sample from the same weights. The
result file holds the calibration (``eos_calibration``: the EOS probability measured on other
prompts' states and the mean length independent draws would give at this length limit) and each
side's measured mean and longest response (``response_len_mean``, ``response_len_max``).

Run it with the project's interpreter (torch, transformers and rlvr importable). The first run
creates ``benchmarks/.venv-trl`` (gitignored): a venv whose ``_rlvr_parent.pth`` adds this
interpreter's site-packages, with ``trl==TRL_VERSION`` pip-installed into it under a constraints
file that pins every package already installed here (torch 2.13.0, transformers, accelerate,
datasets, ...) to its installed version. pip then installs trl alone; the project's venv is not
touched (TRL 1.16 needs Python >= 3.11). TRL runs in a subprocess of that venv, rlvr (``rlvr
train``) in a subprocess of this one, so each has its own peak RSS (``os.wait4``'s
``ru_maxrss`` of the child). Both children run with the environment rlvr's command line gives
itself, glibc's malloc on transparent huge pages where that applies (``rlvr.cpu.runtime_env``), so the
two use the same allocator.

**The work is the same**: the built-in SmolLM2-135M-Instruct in float32 (or bf16 mixed precision
for both); 64 distinct two-digit additions ("What is 37 + 58?", rlvr's arithmetic wording),
rendered once by rlvr's own data preparation (r1 template: system prompt and instruction, through
the chat template, assistant turn opened with rlvr's quickstart prefix ``<think>``), and TRL gets
those exact prompt strings (checked: TRL's tokenisation of each prompt gives rlvr's token count)
in the order rlvr's prompt stream visits them (``shuffle_dataset=False``), so step s trains on the
same P prompts in both. G samples per prompt, at most ``--max-new-tokens`` new tokens, sampling
at temperature 1 with top-p 1 and top-k off, stopping only at EOS; rewards rlvr's ``accuracy``
(1.0) + ``format`` (0.5) rules, which TRL calls through rlvr's own ``Scorer`` on prefix +
completion; group-normalised advantages; token-mean loss (TRL ``loss_type="dapo"``); no KL and no
reference model (TRL ``beta=0``); one optimizer step per rollout (TRL ``num_iterations=1``, no
old-log-prob pass); micro-batches of ``--micro-batch-seqs`` sequences (TRL
``per_device_train_batch_size``, ``gradient_accumulation_steps`` = P*G / that); AdamW at lr 1e-6,
betas (0.9, 0.99), weight decay 0, constant schedule, grad-norm clip 1.0; no gradient
checkpointing in either (``--trl-gradient-checkpointing`` turns on TRL's own default); no
evaluation, checkpoints between steps or sample logging in either.

**Checked after the runs** (the ``equal_work`` part of the JSON): both took the same number of
optimizer steps; the prompt tokens per step agree (TRL: growth of its ``num_tokens`` minus its
completion tokens); the generated tokens per step (rlvr ``rollout/response_len_mean`` x P*G, TRL
``completions/mean_length`` x P*G, both counting the EOS token) agree within sampling noise. Both
sample from the same distribution but draw different tokens, so the lengths differ run to run:
``s_per_gen_token`` (step time / generated tokens) compares runs that sampled different lengths.

**Not the same, by design of each library** (listed in the JSON under ``differences``): rlvr
runs each group's shared prompt through the update once (``train.shared_prompt_forward``), TRL
once per sequence; both optimizers are torch's fused AdamW kernel; rlvr multiplies by
oneDNN-prepacked copies of the linear weights (``model.packed_weights``: sampling, and the update
where torch dispatches AVX-512), TRL by PyTorch's own ``F.linear`` (same products, summed in
another order); rlvr's rollout decodes with its lean forward (``rollout.lean_decode``: each group's
prompt attended once), TRL with the model's own; rlvr samples each sequence from its own seeded
generator; in bf16 rlvr samples
from a bf16 copy of the weights while TRL generates under accelerate's bf16 autocast.

**Reported for each**: seconds per step (median over the steps after the first, a warm-up), the
generation and update seconds, generated tokens per step, generated tokens per second of generation,
trained (loss) tokens per second of update (step minus generation minus reward time), seconds per
generated token, the mean and longest response (over every step), peak RSS, optimizer steps; plus
the CPU's PyTorch dispatch level, threads, and the torch/transformers/trl versions. rlvr's per-step
numbers come from its run's ``metrics.jsonl`` (``time/step_s``, ``time/rollout_s``,
``time/reward_s``); TRL's from a ``TrainerCallback`` (wall time from ``on_step_begin`` to
``on_step_end``), a timer around ``model.generate`` and the reward callables, and TRL's logged
``completions/mean_length``.

Writes ``benchmarks/results/vs_trl-<date>.json`` (``--out`` to change) with a top-level ``ratio``
(rlvr s/step / TRL s/step; < 1 means rlvr is faster) and a Markdown table (also in a ``.md`` next
to it), and prints the ratio last. Nothing else should run on the machine: the times are the point.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from workload import (
    DATA,
    MODEL,
    PREFIX,
    RANDOM_SHAPES,
    device_rates,
    eos_calibration,
    expected_len_mean,
    model_dir,
    two_digit_additions,
)

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).parent / "results"
TRL_ENV = Path(__file__).parent / ".venv-trl"
TRL_VERSION = "1.16.0"
"""The TRL release measured; it requires transformers>=4.56.2, so it runs on the pinned 5.23."""
RULES, WEIGHTS = ["accuracy", "format"], [1.0, 0.5]
SPREAD_RULES, SPREAD_WEIGHTS = [f"{Path(__file__).with_name('spread_reward.py')}:spread"], [1.0]
"""The reward of a random-initialised model (``--model random:...``): it never earns accuracy or format."""
LR, BETAS, WEIGHT_DECAY, MAX_GRAD_NORM, CLIP = 1e-6, (0.9, 0.99), 0.0, 1.0, 0.2
SEED = 0


# -- the prompts and rlvr's config ----------------------------------------------------------


def rlvr_config(args, data_path: Path, run_dir: Path) -> dict:
    """Every setting of the rlvr run, written out (no preset underneath)."""
    bf16 = args.precision == "bf16"
    B = args.prompts_per_step * args.group_size
    return {
        "model": {
            "path": args.model_path,
            "device": args.device,
            "dtype": "float32",
            "autocast_bf16": bf16,
            "gradient_checkpointing": False,
        },
        "data": {**DATA, "path": str(data_path)},
        "rollout": {
            "samples_per_prompt": args.group_size,
            "max_new_tokens": args.max_new_tokens,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": 0,
            "dtype": "bfloat16" if bf16 else "float32",
            "stop": [],
            "batch_seqs": max(64, B),
        },
        "reward": {
            "rules": args.rules,
            "weights": args.weights,
            "accuracy_rule": "accuracy" if "accuracy" in args.rules else args.rules[0],
            "workers": 0,
        },
        "algo": {
            "adv_method": "grpo",
            "kl_coef": 0.0,
            "num_iterations": 1,
            "loss_agg": "token_mean",
            "clip_low": CLIP,
            "clip_high": CLIP,
        },
        "train": {
            "steps": args.steps,
            "prompts_per_step": args.prompts_per_step,
            "micro_batch_seqs": args.micro_batch_seqs,
            "lr": LR,
            "lr_schedule": "constant",
            "warmup_steps": 0,
            "weight_decay": WEIGHT_DECAY,
            "adam_betas": list(BETAS),
            "max_grad_norm": MAX_GRAD_NORM,
            "shared_prompt_forward": True,
            "zero_adv_forward_only": False,  # equal work: TRL's backward runs through every sequence
            "save_every": 0,
            "save_every_min": 0.0,
        },
        "log": {"samples_every": 0, "tensorboard": False, "progress": False, "report": False},
        "eval": {"at_start": False, "at_end": False},
        "run_dir": str(run_dir),
        "seed": SEED,
        "overwrite": True,
    }


def trl_prompts(config_path: Path, steps: int) -> tuple[list[dict], list[int]]:
    """The rows rlvr trains on in steps 1..``steps``, in its order, with rlvr's rendered prompt and
    token count (rlvr's own preparation of the run's config), and every row's token count."""
    from rlvr.config import load_config
    from rlvr.data import PromptStream, prepare
    from rlvr.models import load_tokenizer, resolve_model_path

    cfg = load_config(config_path)
    rows = prepare(cfg.data, load_tokenizer(resolve_model_path(cfg.model.path))).rows
    stream = PromptStream(len(rows), cfg.train.prompts_per_step, cfg.seed)
    order = [i for step in range(steps) for i in stream.batch(step)]
    keep = ("prompt", "prompt_tokens", "answer")
    return [{k: rows[i][k] for k in keep} for i in order], [r["prompt_tokens"] for r in rows]


# -- the benchmark environment for TRL ------------------------------------------------------


def trl_python(env_dir: Path = TRL_ENV) -> Path:
    """The interpreter of the TRL venv, created on first use (see the module docstring)."""
    import sysconfig
    from importlib import metadata

    from packaging.version import Version

    python = env_dir / "bin" / "python"
    probe = [str(python), "-c", f"import trl, sys; sys.exit(trl.__version__ != {TRL_VERSION!r})"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(f"creating {env_dir} with trl=={TRL_VERSION} on top of {sys.prefix}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(env_dir)], check=True)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    parent = sysconfig.get_paths()["purelib"]
    # an `import` line in a .pth runs at start-up; addsitedir also runs the parent's own .pth files
    Path(site, "_rlvr_parent.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    pins = {}
    for dist in metadata.distributions():
        name, origin = dist.metadata["Name"], json.loads(dist.read_text("direct_url.json") or "{}")
        if name and not origin.get("dir_info", {}).get("editable"):  # rlvr itself is an editable install
            pins[name.lower()] = Version(dist.version).public  # torch 2.13.0+cpu -> torch==2.13.0
    constraints = env_dir / "constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in sorted(pins.items())))
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            str(constraints),
            f"trl=={TRL_VERSION}",
        ],
        check=True,
    )
    check = [
        str(python),
        "-c",
        "import torch, transformers, trl; print(torch.__version__, transformers.__version__, trl.__version__)",
    ]
    print("trl venv:", subprocess.run(check, check=True, capture_output=True, text=True).stdout.strip(), flush=True)
    return python


# -- the two children -----------------------------------------------------------------------


def run_child(cmd: list[str], *, log: Path, env: dict) -> dict:
    """Run ``cmd`` to the end with its output in ``log``; its exit code, wall time and peak RSS.

    ``os.wait4`` returns this child's own resource usage: ``ru_maxrss`` (KiB on Linux) is the
    largest resident set of the child or any descendant it waited for, not a sum."""
    t0 = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"exit_code": proc.returncode, "wall_s": time.perf_counter() - t0, "peak_rss_mib": usage.ru_maxrss / 1024}


def rlvr_steps(run_dir: Path, B: int) -> list[dict]:
    """Per-step rows of the rlvr run in the common format (see :func:`summarise`)."""
    from rlvr import metric_names as M
    from rlvr.run_dir import RunDir

    rows = []
    for m in RunDir(run_dir).read_metrics():
        rows.append(
            {
                "step_s": m[M.TIME_STEP_S],
                "generate_s": m[M.TIME_ROLLOUT_S],
                "reward_s": m[M.TIME_REWARD_S],
                "gen_tokens": m[M.RESPONSE_LEN_MEAN] * B,
                "len_max": m[M.RESPONSE_LEN_MAX],
                "trained_tokens": m[M.RESPONSE_LEN_MEAN] * B,
                "optimizer_steps": 1 - m.get(M.SKIPPED_UPDATES, 0),
                "reward_mean": m[M.REWARD_MEAN],
                "accuracy": m[M.ACCURACY],
                "truncated_frac": m[M.TRUNCATED_FRAC],
                "cuda_max_allocated_mib": m.get(M.CUDA_MAX_ALLOCATED_MIB),
            }
        )
    return rows


def trl_child(spec_file: Path, out_file: Path) -> None:
    """Runs in the TRL venv: GRPOTrainer on the spec's prompts; writes per-step rows and its settings."""
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.models import resolve_model_path
    from rlvr.rewards import Scorer

    spec = json.loads(spec_file.read_text())
    path = str(resolve_model_path(spec["model"]))
    rules, weights = spec["rules"], spec["weights"]
    device = spec["settings"]["device"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    prompts = [r["prompt"] for r in spec["rows"]]
    counts = [len(ids) for ids in tokenizer(text=prompts)["input_ids"]]  # as GRPOTrainer tokenises text prompts
    if counts != [r["prompt_tokens"] for r in spec["rows"]]:
        raise SystemExit("TRL's prompt token counts differ from rlvr's; the prompts would not be the same work")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    clock = {"generate_s": 0.0, "reward_s": 0.0}
    generate = model.generate

    def timed_generate(*a, **kw):
        t0 = time.perf_counter()
        try:
            return generate(*a, **kw)
        finally:
            clock["generate_s"] += time.perf_counter() - t0

    model.generate = timed_generate  # GRPOTrainer calls the unwrapped model's generate
    scorer = Scorer(rules, weights, workers=0)

    def reward_rule(name: str):
        def rule(prompts, completions, answer, **_):
            t0 = time.perf_counter()
            said = [spec["prefix"] + c for c in completions]  # what rlvr's rules read: prefix + completion
            scores = scorer.rule_scores(name, said, answer)[0]
            clock["reward_s"] += time.perf_counter() - t0
            return scores

        rule.__name__ = name
        return rule

    class StepClock(TrainerCallback):
        def __init__(self):
            self.rows: list[dict] = []

        def on_step_begin(self, args, state, control, **kw):
            clock.update(generate_s=0.0, reward_s=0.0)
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.rows.append({"step_s": time.perf_counter() - self.t0, **clock})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "completions/mean_length" in logs and self.rows:
                self.rows[-1]["logs"] = dict(logs)

    s = spec["settings"]
    B, mb = s["prompts_per_step"] * s["group_size"], s["micro_batch_seqs"]
    config = GRPOConfig(
        output_dir=spec["output_dir"],
        use_cpu=device == "cpu",
        seed=SEED,
        max_steps=s["steps"],
        per_device_train_batch_size=mb,
        gradient_accumulation_steps=B // mb,
        num_generations=s["group_size"],
        max_completion_length=s["max_new_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        learning_rate=LR,
        adam_beta1=BETAS[0],
        adam_beta2=BETAS[1],
        weight_decay=WEIGHT_DECAY,
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=MAX_GRAD_NORM,
        beta=0.0,
        num_iterations=1,
        epsilon=CLIP,
        loss_type="dapo",
        scale_rewards="group",
        reward_weights=weights,
        bf16=s["precision"] == "bf16",
        gradient_checkpointing=s["trl_gradient_checkpointing"],
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        log_completions=False,
        dataloader_num_workers=0,
    )
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in spec["rows"]])
    step_clock = StepClock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward_rule(n) for n in rules],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[step_clock],
    )
    trainer.train()
    rows = []
    seen_tokens = 0
    for r in step_clock.rows:
        logs = r.pop("logs", {})
        gen = logs.get("completions/mean_length", float("nan")) * B
        rows.append(
            {
                **r,
                "gen_tokens": gen,
                "len_max": logs.get("completions/max_length"),
                "trained_tokens": gen,
                "prompt_tokens": logs.get("num_tokens", 0) - seen_tokens - gen,
                "reward_mean": logs.get("reward"),
                "truncated_frac": logs.get("completions/clipped_ratio"),
            }
        )
        seen_tokens = logs.get("num_tokens", seen_tokens)
    settings = {
        k: getattr(config, k)
        for k in (
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "generation_batch_size",
            "steps_per_generation",
            "num_generations",
            "max_completion_length",
            "temperature",
            "top_p",
            "top_k",
            "learning_rate",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
            "weight_decay",
            "lr_scheduler_type",
            "max_grad_norm",
            "beta",
            "num_iterations",
            "epsilon",
            "loss_type",
            "scale_rewards",
            "reward_weights",
            "bf16",
            "gradient_checkpointing",
            "disable_dropout",
            "shuffle_dataset",
            "mask_truncated_completions",
        )
    }
    settings["optim"] = str(config.optim.value if hasattr(config.optim, "value") else config.optim)
    out_file.write_text(
        json.dumps(
            {
                "rows": rows,
                "optimizer_steps": trainer.state.global_step,
                "settings": settings,
                "versions": {
                    "torch": torch.__version__,
                    "transformers": transformers.__version__,
                    "trl": trl.__version__,
                },
                "threads": torch.get_num_threads(),
                "cuda_max_allocated_mib": (
                    torch.cuda.max_memory_allocated() / 2**20 if device.startswith("cuda") else None
                ),
            },
            indent=2,
            default=str,
        )
    )


# -- summary ----------------------------------------------------------------------------------


def summarise(rows: list[dict], child: dict, optimizer_steps: int, B: int) -> dict:
    """Per-library numbers over the steps after the first (the warm-up); all steps if there is one. The
    response lengths (tokens, EOS counted) are over every step: they describe the sampling, not the clock."""
    measured = rows[1:] or rows
    maxes = [r["len_max"] for r in rows if r.get("len_max") is not None]
    step_s = [r["step_s"] for r in measured]
    gen_s = sum(r["generate_s"] for r in measured)
    update_s = sum(r["step_s"] - r["generate_s"] - r["reward_s"] for r in measured)
    gen = sum(r["gen_tokens"] for r in measured)
    trained = sum(r["trained_tokens"] for r in measured)
    return {
        "optimizer_steps": optimizer_steps,
        "s_per_step": statistics.median(step_s),
        "generate_s_per_step": statistics.median(r["generate_s"] for r in measured),
        "update_s_per_step": statistics.median(r["step_s"] - r["generate_s"] - r["reward_s"] for r in measured),
        "gen_tokens_per_step": gen / len(measured),
        "gen_tokens_per_s": gen / gen_s if gen_s > 0 else None,
        "trained_tokens_per_s": trained / update_s if update_s > 0 else None,
        "s_per_gen_token": sum(step_s) / gen if gen else None,
        "response_len_mean": sum(r["gen_tokens"] for r in rows) / (B * len(rows)),
        "response_len_max": max(maxes) if maxes else None,
        "response_len_max_median": statistics.median(maxes) if maxes else None,
        "peak_rss_mib": child["peak_rss_mib"],
        "wall_s": child["wall_s"],
        "steps": rows,
    }


COLUMNS = [
    ("s/step (median, after warm-up)", "s_per_step", "{:.2f}"),
    ("generation s/step", "generate_s_per_step", "{:.2f}"),
    ("update s/step", "update_s_per_step", "{:.2f}"),
    ("generated tokens/step", "gen_tokens_per_step", "{:.0f}"),
    ("generated tokens/s (generation)", "gen_tokens_per_s", "{:.1f}"),
    ("trained tokens/s (update)", "trained_tokens_per_s", "{:.1f}"),
    ("s per generated token", "s_per_gen_token", "{:.4f}"),
    ("response length, mean (tokens, all steps)", "response_len_mean", "{:.1f}"),
    ("response length, max (tokens, all steps)", "response_len_max", "{:.0f}"),
    ("peak RSS (MiB)", "peak_rss_mib", "{:.0f}"),
    ("GPU memory (MiB, torch.cuda.max_memory_allocated)", "cuda_max_allocated_mib", "{:.0f}"),
    ("rollout at its roofline floor (floor / generation time)", "rollout_fraction_of_floor", "{:.1%}"),
    ("optimizer steps", "optimizer_steps", "{}"),
]


def table(results: dict) -> str:
    names = [n for n in ("rlvr", "trl") if n in results]
    fmt = lambda spec, v: "n/a" if v is None else spec.format(v)  # noqa: E731
    lines = ["| | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    lines += [
        f"| {label} | " + " | ".join(fmt(spec, results[n].get(key)) for n in names) + " |"
        for label, key, spec in COLUMNS
    ]
    return "\n".join(lines)


def equal_work(results: dict, rlvr_prompt_tokens: list[float]) -> dict:
    """The checks of the docstring, as numbers: steps, prompt tokens and generated tokens per step."""
    r, t = results["rlvr"], results["trl"]
    trl_prompt = [row["prompt_tokens"] for row in t["steps"]]
    gen_r, gen_t = r["gen_tokens_per_step"], t["gen_tokens_per_step"]
    return {
        "optimizer_steps": [r["optimizer_steps"], t["optimizer_steps"]],
        "same_optimizer_steps": r["optimizer_steps"] == t["optimizer_steps"],
        "prompt_tokens_per_step": {"rlvr": rlvr_prompt_tokens, "trl": trl_prompt},
        "same_prompt_tokens": [round(x) for x in rlvr_prompt_tokens] == [round(x) for x in trl_prompt],
        "gen_tokens_per_step": {
            "rlvr": [row["gen_tokens"] for row in r["steps"]],
            "trl": [row["gen_tokens"] for row in t["steps"]],
        },
        "gen_tokens_rel_diff": (gen_r - gen_t) / gen_t if gen_t else None,
    }


DIFFERENCES = [
    "rlvr's update runs each group's shared prompt once (train.shared_prompt_forward) and cuts each micro-batch at its "
    "longest response; TRL runs the prompt once per sequence and pads to the batch's longest completion "
    "(same gradients, fewer FLOPs for rlvr: an implementation choice, not less work done)",
    "optimizer: both torch's fused AdamW kernel (TRL's default `adamw_torch_fused`, rlvr's on a device that has it); "
    "same math and hyperparameters",
    "products: rlvr multiplies by oneDNN-prepacked copies of the linear weights on a CPU (model.packed_weights: "
    "sampling, and the update where torch dispatches AVX-512; one or two more copies of those weights in memory), "
    "TRL by F.linear (MKL); the same products summed in another order",
    "decoding: rlvr's rollout decodes with its lean forward on a CPU in fp32 (rollout.lean_decode: fused q/k/v and "
    "post-ops, each group's prompt keys/values kept and attended once); TRL with the model's own forward; the "
    "same logits up to float rounding",
    "sampling: rlvr draws each sequence from its own seeded generator (two-level inverse CDF over softmax(z/T), "
    "sums in float64); "
    "TRL uses generate's torch.multinomial; same distribution, other draws",
    "TRL's loss pass also computes per-token entropy via transformers' fused LM-head log-probs; rlvr logs entropy too",
    "bf16 (--precision bf16): rlvr samples from a bf16 copy of the weights and trains under bf16 autocast; TRL "
    "(bf16=True) generates and trains under accelerate's bf16 autocast over the fp32 weights",
    "rewards: rlvr scores in its Scorer (reward.workers=0, in process); "
    "TRL calls the same Scorer per rule, once per rule",
]


def rollout_floors(args, results: dict, prompt_tokens: float) -> dict:
    """The rollout's roofline floor on this device (``roofline_model.rollout_floor`` with rates measured
    here) beside each side's measured generation time: ``rollout_fraction_of_floor`` = floor / time per
    step (1.0 = the hardware's limit), its decode steps the median step's longest response (the batch
    decodes until its longest row ends). Returns the rates."""
    sys.path.insert(0, str(Path(__file__).parent))
    from roofline_model import Rates, rollout_floor

    from rlvr.estimate import model_shape

    bf16 = args.precision == "bf16"
    rates = device_rates(args.device, "bfloat16" if bf16 and args.device != "cpu" else "float32")
    shape = model_shape(args.model_path)[0]
    B = args.prompts_per_step * args.group_size
    for side in results.values():
        gen_tokens = side.get("gen_tokens_per_step")
        gen_s = side.get("generate_s_per_step")
        if not gen_tokens or not gen_s:
            continue
        fl = rollout_floor(
            shape,
            Rates(rates["matmul_flops_per_s"], rates["bytes_per_s"]),
            sequences=B,
            prompt_tokens=prompt_tokens,
            response_tokens=gen_tokens / B,
            decode_steps=side.get("response_len_max_median") or args.max_new_tokens,  # the batch's longest
            dtype_bytes=2 if bf16 else 4,
        )
        side["rollout_floor_s"] = fl.seconds
        side["rollout_fraction_of_floor"] = fl.seconds / gen_s
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8, help="G, samples per prompt")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--micro-batch-seqs", type=int, default=8, help="sequences per forward/backward (clipped to P*G)")
    ap.add_argument("--prompts", type=int, default=64, help="distinct two-digit addition prompts in the data set")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    ap.add_argument(
        "--trl-gradient-checkpointing", action="store_true", help="TRL's own default (on); off = equal work"
    )
    ap.add_argument("--only", choices=["rlvr", "trl"], help="run one side only (no ratio)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N: both sides train there")
    ap.add_argument(
        "--model",
        default=MODEL,
        help="the built-in model (default), a local model directory, or random:SHAPE (random-initialised, "
        f"seed 0, a published shape: {', '.join(RANDOM_SHAPES)}) with the built-in tokenizer and a reward that "
        "varies by completion (spread_reward.py)",
    )
    ap.add_argument(
        "--eos-every",
        type=int,
        metavar="N",
        help="with --model random:SHAPE: variable lengths, EOS about every N tokens (the random model's EOS row "
        "calibrated once, saved in its directory, loaded by both sides: benchmarks/workload.py); without it "
        "a random model's responses all run to --max-new-tokens",
    )
    ap.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "rlvr-vs-trl",
        help="run directories, logs and the data file (kept: `benchmarks/roofline.py --run WORKDIR/rlvr`)",
    )
    ap.add_argument("--out", type=Path, help="result JSON (default benchmarks/results/vs_trl-<date>.json)")
    ap.add_argument("--child-trl", nargs=2, type=Path, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_trl:
        trl_child(*args.child_trl)
        return

    import torch
    import transformers
    import yaml

    from rlvr.cpu import process_env

    if args.device != "cpu" and not torch.cuda.is_available():
        sys.exit(f"--device {args.device}: no CUDA device is visible here; use --device cpu")
    B = args.prompts_per_step * args.group_size
    args.micro_batch_seqs = min(args.micro_batch_seqs, B)
    if B % args.micro_batch_seqs:
        sys.exit(f"--micro-batch-seqs {args.micro_batch_seqs} must divide prompts-per-step x group-size = {B}")
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    data_path, config_path, run_dir = work / "prompts.jsonl", work / "rlvr.yaml", work / "rlvr"
    data_path.write_text("".join(json.dumps(r) + "\n" for r in two_digit_additions(args.prompts)))
    random_shape = args.model.startswith("random:")
    if args.eos_every is not None and args.eos_every < 1:
        sys.exit(f"--eos-every {args.eos_every}: expected a number of tokens >= 1")
    if random_shape:  # built (and its EOS calibrated) here, before either side loads it
        args.model_path = str(model_dir(args.model, work, eos_every=args.eos_every, device=args.device).resolve())
    elif args.eos_every is not None:
        sys.exit(f"--eos-every applies to a random model (--model random:SHAPE), not to --model {args.model}")
    else:
        args.model_path = args.model
    args.rules, args.weights = (SPREAD_RULES, SPREAD_WEIGHTS) if random_shape else (RULES, WEIGHTS)
    config = rlvr_config(args, data_path, run_dir)
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    rows, all_counts = trl_prompts(config_path, args.steps)
    steps_prompt_tokens = [
        float(
            sum(r["prompt_tokens"] for r in rows[s * args.prompts_per_step : (s + 1) * args.prompts_per_step])
            * args.group_size
        )
        for s in range(args.steps)
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # rlvr's command line re-executes itself with glibc's malloc on huge pages and, on an AMD CPU with
    # AVX-512, MKL's AVX-512 kernels (rlvr.cpu.runtime_env); TRL's child gets the same environment, so
    # both run with the same allocator and the same matrix products
    env = process_env(env) or env
    date = datetime.date.today().isoformat()
    skip = ("child_trl", "workdir", "out", "only", "model_path", "rules", "weights")
    settings = {k: v for k, v in vars(args).items() if k not in skip}
    results: dict = {}
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }

    if args.only in (None, "rlvr"):
        print(f"rlvr: {args.steps} steps, log {work / 'rlvr.log'}", flush=True)
        cmd = [sys.executable, "-m", "rlvr.cli", "train", "--config", str(config_path)]
        child = run_child(cmd, log=work / "rlvr.log", env=env)
        if child["exit_code"]:
            sys.exit(f"rlvr train failed (exit {child['exit_code']}); see {work / 'rlvr.log'}")
        steps = rlvr_steps(run_dir, B)
        results["rlvr"] = {**summarise(steps, child, sum(r["optimizer_steps"] for r in steps), B), "config": config}

    if args.only in (None, "trl"):
        python = trl_python()
        spec = {
            "rows": rows,
            "prefix": PREFIX,
            "output_dir": str(work / "trl"),
            "settings": settings,
            "model": args.model_path,
            "rules": args.rules,
            "weights": args.weights,
        }
        (work / "trl_spec.json").write_text(json.dumps(spec))
        print(f"trl: {args.steps} steps, log {work / 'trl.log'}", flush=True)
        cmd = [
            str(python),
            str(Path(__file__).resolve()),
            "--child-trl",
            str(work / "trl_spec.json"),
            str(work / "trl_out.json"),
        ]
        child = run_child(cmd, log=work / "trl.log", env=env)
        if child["exit_code"]:
            sys.exit(f"TRL failed (exit {child['exit_code']}); see {work / 'trl.log'}")
        out = json.loads((work / "trl_out.json").read_text())
        versions["trl"] = out["versions"]["trl"]
        results["trl"] = {
            **summarise(out["rows"], child, out["optimizer_steps"], B),
            "config": out["settings"],
            "threads": out["threads"],
            "versions": out["versions"],
            "cuda_max_allocated_mib": out.get("cuda_max_allocated_mib"),
        }
    if "rlvr" in results:
        steps_mib = [r["cuda_max_allocated_mib"] for r in steps if r.get("cuda_max_allocated_mib") is not None]
        results["rlvr"]["cuda_max_allocated_mib"] = max(steps_mib) if steps_mib else None
    rates = rollout_floors(args, results, statistics.fmean(all_counts))

    calibration = eos_calibration(Path(args.model_path)) if args.eos_every else None
    if calibration:  # what independent draws would give, beside each side's measured lengths
        calibration["expected_len_mean"] = expected_len_mean(calibration["eos_probability"], args.max_new_tokens)
    ratio = results["rlvr"]["s_per_step"] / results["trl"]["s_per_step"] if len(results) == 2 else None
    md = table(results)
    report = {
        "date": date,
        "machine": {
            "device": args.device,
            "gpu": torch.cuda.get_device_name(args.device) if args.device != "cpu" else None,
            "rates": rates,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "load_avg_1m_at_end": os.getloadavg()[0],
        },
        "versions": versions,
        "settings": {
            **settings,
            "model": args.model,
            "rewards": dict(zip(args.rules, args.weights)),
            "prompt_tokens_mean": statistics.fmean(all_counts),
        },
        **results,
        "eos_calibration": calibration,
        "equal_work": equal_work(results, steps_prompt_tokens) if len(results) == 2 else None,
        "differences": DIFFERENCES,
        "table": md,
        "ratio": ratio,
    }
    gpu = report["machine"]["gpu"]
    slug = f"-{''.join(c if c.isalnum() else '-' for c in gpu).strip('-').lower()}" if gpu else ""
    out = args.out or RESULTS / f"vs_trl-{date}{slug}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    checkpointing = "on (TRL's default)" if args.trl_gradient_checkpointing else "off (as rlvr)"
    lengths = ""
    if calibration:
        lengths = (
            f"; {args.model}, EOS about every {args.eos_every} tokens (probability "
            f"{calibration['eos_probability']:.4f}, expected mean length {calibration['expected_len_mean']:.0f})"
        )
    out.with_suffix(".md").write_text(
        f"rlvr vs TRL {versions.get('trl', '')} ({date}; {report['machine']['cpu_capability']}, "
        f"{report['machine']['threads']} threads; {args.precision}; P={args.prompts_per_step}, G={args.group_size}, "
        f"{args.max_new_tokens} new tokens, {args.steps} steps; TRL gradient checkpointing {checkpointing}"
        f"{lengths})\n\n{md}\n\n"
        "ratio (rlvr s/step / TRL s/step): " + ("n/a" if ratio is None else f"{ratio:.3f}") + "\n"
    )
    print(f"\n{md}\n\nwrote {out} and {out.with_suffix('.md')}")
    if report["equal_work"]:
        print(
            "equal work:",
            json.dumps({k: v for k, v in report["equal_work"].items() if k.startswith(("same", "gen_tokens_rel"))}),
        )
    print("ratio (rlvr s/step / TRL s/step):", "n/a" if ratio is None else f"{ratio:.3f}")


if __name__ == "__main__":
    main()
