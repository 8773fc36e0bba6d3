"""The config's sections, one frozen dataclass each: every field with a default and a one-line
attribute docstring (``docs/config.md`` is generated from them), the section's own checks in its
``__post_init__``. The checks across sections are :class:`rlvr.config.tree.Config`'s.
"""

from __future__ import annotations

import enum
import importlib.util
import re
from dataclasses import dataclass, field

from rlvr.choices import (
    DATA_PRESETS,
    DATA_TASKS,
    FILE_FORMATS,
    TEMPLATE_NAMES,
    TOOL_CALL_SYNTAX,
    TOOL_RESULT_SYNTAX,
    AdvMethod,
    Backend,
    Engine,
    KLEstimator,
    KLPlacement,
    LossAgg,
    OnError,
    RatioLevel,
    Strategy,
    is_template_file,
    parse_tool_syntax,
)
from rlvr.errors import UserError


class Switch(str, enum.Enum):
    """A setting that is on, off, or chosen from the hardware (``auto``)."""

    AUTO = "auto"
    ON = "true"
    OFF = "false"

    def __str__(self) -> str:
        return self.value

    def as_bool(self) -> bool | None:
        """True for on, False for off, None for auto (the caller decides from the hardware)."""
        return None if self is Switch.AUTO else self is Switch.ON


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise UserError(msg)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ALL_LINEAR = "all-linear"
"""``model.lora.target_modules=all-linear``: every linear layer but the output head (peft's own rule)."""
"""The linear layers of a Llama-style block (SmolLM2, Qwen2.5, Llama): attention and MLP."""


@dataclass(frozen=True)
class LoRAConfig:
    rank: int = 0
    """LoRA rank r (0 = off: full fine-tuning). With r > 0 only the adapter trains (peft) and the reference is the base with the adapter off."""
    alpha: float = 32.0
    """LoRA alpha: the adapter's output is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input during the update (0 keeps the on-policy ratio at exactly 1)."""
    target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))
    """Names of the linear layers that get an adapter (default: a Llama-style block's attention and MLP projections), or all-linear (as in peft and TRL: every linear layer but the output head)."""

    def __post_init__(self) -> None:
        _check(self.rank >= 0, f"model.lora.rank={self.rank}: must be >= 0 (0 = off), e.g. 16")
        _check(self.alpha > 0, f"model.lora.alpha={self.alpha}: must be > 0, e.g. 32")
        _check(0 <= self.dropout < 1, f"model.lora.dropout={self.dropout}: must be in [0, 1)")
        _check(
            bool(self.target_modules) and all(self.target_modules),
            f"model.lora.target_modules={self.target_modules}: name at least one layer, e.g. [q_proj, v_proj]",
        )


@dataclass(frozen=True)
class ModelConfig:
    path: str = "smollm2-135m-instruct"
    """Built-in model name, local Hugging Face model directory, Hugging Face hub id (org/name or org/name@revision, fetched into the hub cache; HF_HUB_OFFLINE=1 reads the cache alone; a local folder of that name wins), or .gguf file. A run records a hub id pinned to the commit it loaded (org/name@COMMIT)."""
    dtype: str = "float32"
    """Dtype of the trained (master) weights: float32 or bfloat16. Keep float32: ~1e-6 updates vanish in bf16."""
    device: str = "auto"
    """cpu, cuda, cuda:N, or auto (cuda when visible)."""
    autocast_bf16: Switch = Switch.AUTO
    """Run training forward/backward under bf16 autocast (master weights stay in model.dtype): auto (on where bf16 is native: a bf16 CUDA device, an AVX-512 CPU with AMX, or an AVX-512 CPU with AVX512-BF16 whose bf16 products run at least 1.5x fp32's rate, measured once per machine and kept in $RLVR_CACHE/cpu), true or false."""
    packed_weights: Switch = Switch.AUTO
    """Multiply by oneDNN-prepacked copies of the linear weights on a CPU: sampling and the no-grad log-prob passes (faster products, benchmarks/NOTES.md; one more copy of the linear weights in memory, repacked after every optimizer step; the update keeps PyTorch's products, which were as fast, unless RLVR_PACKED_UPDATE=1): auto (on for float32, and for bfloat16 where oneDNN can pack it on this CPU: AVX-512 BW/VL/DQ or AVX-NE-CONVERT; elsewhere unpacked, with a line saying so), true (an error where it cannot pack), false."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward to save memory; exact together with train.shared_prompt_forward (the update then runs each prompt per sequence)."""
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    """LoRA adapter training (model.lora.rank > 0)."""

    def __post_init__(self) -> None:
        _check(self.dtype in ("float32", "bfloat16"), f"model.dtype={self.dtype}: use float32 or bfloat16")
        _check(
            self.device in ("cpu", "auto", "cuda") or self.device.startswith("cuda:"),
            f"model.device={self.device}: use cpu, cuda, cuda:N or auto",
        )


@dataclass(frozen=True)
class DataConfig:
    task: str = "arithmetic"
    """Where prompts come from: 'arithmetic', 'arithmetic_tool' (products and expressions for a model with a calculator), 'countdown' or 'code' (write a one-argument Python function, hidden tests for the code_tests reward) (built-in, offline, seeded), or 'files' (data.path)."""
    path: str | None = None
    """Training data when data.task=files: a Hugging Face data set name, org/name[:config][@revision] (e.g. openai/gsm8k:main: fetched into the Hugging Face cache when online, the cache alone with HF_HUB_OFFLINE=1; the run's config.yaml records the commit read), a file (.jsonl .json .parquet .csv .arrow), a folder, a save_to_disk folder, a glob, or several separated by commas. A local path of the same name wins."""
    test_path: str | None = None
    """Test data (same forms, e.g. HuggingFaceH4/MATH-500); null = the test split of data.path when it is a data set or folder that has one."""
    format: str = "auto"
    """File format: auto (by extension), jsonl, json, parquet, csv or arrow."""
    train_split: str = "train"
    """Split read from data.path when it is a Hugging Face data set, a save_to_disk DatasetDict or a folder of split-named files."""
    test_split: str = "test"
    """Split read for test rows from such data sets and folders."""
    preset: str = "auto"
    """Dataset schema: auto (detected from the columns), gsm8k, math, math500, deepscaler, orz, dapo_math, alpaca, trl (TRL's rows: prompt as a message list, or a string, with solution), the code sets humaneval, mbpp, apps (APPS and TACO), lcb (LiveCodeBench), deepcoder, kodcode (tests for the code_tests reward), or custom."""
    question_key: str | None = None
    """Key of the problem text (dotted path, e.g. prompt.0.content); overrides the preset's. Null = the preset's (custom: question)."""
    answer_key: str | None = None
    """Key of the gold answer (dotted path, e.g. reward_model.ground_truth); overrides the preset's. Null = the preset's (custom: answer)."""
    system_key: str | None = None
    """Key of a per-row system prompt (null = none, or the preset's)."""
    extra_keys: list[str] = field(default_factory=list)
    """Extra row values passed to reward functions as row['fields']: 'path' or 'name=path' (dotted paths allowed)."""
    date_from: str = ""
    """Keep only problems released on or after this date, YYYY-MM-DD (LiveCodeBench's date filter, against contamination: the lcb preset's contest_date, or a 'contest_date' / 'date' in data.extra_keys); rows without a date are left out and counted. '' = no lower bound."""
    date_to: str = ""
    """Keep only problems released on or before this date, YYYY-MM-DD ('' = no upper bound); see data.date_from."""
    limit: int = 0
    """Use at most this many training rows from files (0 = all); taken after data.shuffle."""
    test_limit: int = 0
    """Use at most this many test rows from files (0 = all)."""
    shuffle: bool = False
    """Shuffle file rows (seeded by data.train_seed / data.test_seed) before data.limit picks them."""
    on_bad_row: str = "error"
    """A bad row (a JSONL line that is not valid JSON or not an object, a missing or empty question/answer, a non-text label): error (stop, naming file and line) or skip (counted; the lines are listed). An unreadable file always stops."""
    max_line_mib: int = 256
    """Longest line of a JSONL data file (one row), in MiB; a longer one stops the run with the file and line, before it is read into memory."""
    dedupe: bool = True
    """Drop file rows whose question (and system prompt) repeats an earlier row's (counted); built-in tasks never dedupe."""
    max_prompt_tokens: int = 0
    """Longest rendered prompt in tokens (0 = no limit); longer ones follow data.on_long_prompt. A prompt longer than the model's context (max_position_embeddings in its config.json) is an error unless this limit drops it first."""
    on_long_prompt: str = "drop"
    """A prompt over data.max_prompt_tokens: drop (counted) or error."""
    num_workers: int = 0
    """Processes that render and tokenise prompts (0 = one per CPU core, at most 8)."""
    cache: bool = True
    """Cache prepared prompts under $RLVR_CACHE/data, keyed by files, mapping, template and tokenizer."""
    difficulty: int = 1
    """Built-in task difficulty 1..4. arithmetic: 1 = single-digit a+b, 2 = a+b / a-b up to 20, 3 = a*b and a-b+c with two digits, 4 = three operands up to 99. countdown: 3 numbers up to 10, 3 up to 25, 4 up to 50, 5 up to 100. arithmetic_tool: 1 = a 3-digit times a 2-digit number, 2 = half of those, half two-step expressions, 3 (and above) = half 3-digit times 2-digit, half single-digit sums (when to call)."""
    train_size: int = 5000
    """Number of generated training problems (built-in tasks)."""
    test_size: int = 100
    """Number of generated test problems (built-in tasks)."""
    train_seed: int = 1
    """Seed of the built-in training generator, and of data.shuffle for training files."""
    test_seed: int = 2
    """Seed of the built-in test generator (arithmetic drops test problems that also occur in train), and of data.shuffle for test files."""
    system_prompt: str | None = None
    """System turn; null = the template's own (r1: 'You are a helpful assistant.'), empty string = none."""
    template: str = "r1"
    """Prompt template: r1 (= qwen_r1, MindSpeed-RL's R1-Zero text), r1_base (plain text for base models), r1_tool (r1 plus the calculator's call syntax and a worked example), cot, plain, or a .yaml/.json template file (FILE or FILE:NAME)."""
    assistant_prefix: str | None = None
    """Text after the assistant turn opens (e.g. '<think>'); part of the prompt, not trained on; null = the template's own (r1_base: '<think>', others: none)."""

    def __post_init__(self) -> None:
        _check(
            self.task in DATA_TASKS,
            f"data.task={self.task}: use {', '.join(DATA_TASKS[:-1])} or {DATA_TASKS[-1]} "
            "(files reads data.path: .jsonl .json .parquet .csv .arrow, folders)",
        )
        _check(self.task != "files" or bool(self.path), "data.task=files needs data.path=FILE (or a folder or glob)")
        _check(
            self.task == "files" or not (self.path or self.test_path),
            f"data.path/data.test_path are set but data.task={self.task}; add data.task=files to train on files",
        )
        _check(
            self.format in ("auto", *FILE_FORMATS),
            f"data.format={self.format}: use auto, jsonl, json, parquet, csv or arrow",
        )
        _check(self.preset in DATA_PRESETS, f"data.preset={self.preset}: use one of {', '.join(DATA_PRESETS)}")
        _check(self.on_bad_row in ("error", "skip"), f"data.on_bad_row={self.on_bad_row}: use error or skip")
        _check(
            self.on_long_prompt in ("drop", "error"), f"data.on_long_prompt={self.on_long_prompt}: use drop or error"
        )
        _check(self.limit >= 0 and self.test_limit >= 0, "data.limit and data.test_limit must be >= 0 (0 = all rows)")
        _check(self.max_prompt_tokens >= 0, "data.max_prompt_tokens must be >= 0 (0 = no limit)")
        _check(self.max_line_mib >= 1, "data.max_line_mib must be >= 1 (MiB)")
        _check(self.num_workers >= 0, "data.num_workers must be >= 0 (0 = one per core)")
        _check(1 <= self.difficulty <= 4, f"data.difficulty={self.difficulty}: must be 1..4")
        for key in ("date_from", "date_to"):
            value = getattr(self, key)
            _check(
                not value or re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(value)) is not None,
                f"data.{key}={value}: give a date as YYYY-MM-DD, e.g. data.{key}=2024-08-01",
            )
        _check(
            not (self.date_from and self.date_to) or str(self.date_from) <= str(self.date_to),
            f"data.date_from={self.date_from} is after data.date_to={self.date_to}; swap them",
        )
        _check(self.train_size >= 1 and self.test_size >= 0, "data.train_size must be >= 1 and data.test_size >= 0")
        _check(
            self.template in TEMPLATE_NAMES or is_template_file(self.template),
            f"data.template={self.template}: use {', '.join(TEMPLATE_NAMES)} or a template file (.yaml/.json, optionally FILE:NAME)",
        )


@dataclass(frozen=True)
class RolloutConfig:
    samples_per_prompt: int = 8
    """G: completions sampled per prompt (one GRPO group)."""
    max_new_tokens: int = 128
    """Longest completion; longer ones are cut and counted as truncated."""
    temperature: float = 1.0
    """Sampling temperature (log-probs for the loss use the same temperature)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off)."""
    top_k: int = 0
    """Top-k sampling (0 = off)."""
    dtype: str = "auto"
    """Dtype of the generation copy of the model: auto (bfloat16 only where bf16 is native: a bf16 CUDA device, or an AVX-512 CPU with AMX; else float32), bfloat16, or float32 (shares the policy weights)."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: a response ends right after the first one it produces (e.g. ['</answer>']), in training, evaluation, chat and generate alike."""
    batch_seqs: int = 64
    """At most this many sequences are generated together, in whole groups (max(1, batch_seqs // G) prompts' G samples per batch)."""
    lean_decode: Switch = Switch.AUTO
    """Decode steps by rlvr's lean forward (rlvr.cpu.lean: products on the packed weights with fused q/k/v and fused residual/SiLU, each group's prompt attended once): auto = where it applies (a float32 Llama or Qwen2 model with model.packed_weights on), true = require it (an error where it cannot run), false = the model's own forward. Same logits up to float rounding."""
    static_decode: Switch = Switch.AUTO
    """Decode on a static KV cache with every row stepping together (rlvr.rollout.static), the step compiled with torch.compile (CUDA graphs) on a GPU: auto = on a CUDA device, true = also on a CPU (the step runs eagerly there), false = the dynamic decode. At float32 the same tokens as the dynamic decode (seeded per sequence; greedy token for token; tested on a CPU); at bf16 compiled and eager code round differently and compaction changes the batch's kernels, so rows can part at a near-tie (benchmarks/gpu_check.py measures the share, not yet on a GPU). A compile or capture failure falls back to the dynamic decode with one line."""
    engine: Engine = Engine.HF
    """What generates the rollouts: hf (Hugging Face generate, in the training process). vllm is not built yet (a one-line error)."""
    tools: list[str] = field(default_factory=list)
    """Tools the model may call mid-response (docs/tools.md): built-ins calculator and python (opt-in: runs code in a limited subprocess), or plugins 'package.module:function' / 'path/to/file.py:function'. Generation pauses at each call, the result is appended (masked out of the loss) and generation goes on. Empty = single-turn rollouts."""
    max_turns: int = 1
    """Turns of a code episode (rows with tests, e.g. data.task=code): after a failing attempt the first failing test comes back as a user turn and the model tries again, up to this many turns (1: single-turn). The reward is the final attempt's. Not with rollout.tools. With a plugin rollout.environment: its turn limit."""
    environment: str = ""
    """The environment each sampled sequence is an episode of (docs/code-and-environments.md): '' = the tool loop with rollout.tools, code with execution feedback with rollout.max_turns > 1, else single-turn; tools, code_feedback, or a plugin 'package.module:Class' / 'path/to/file.py:Class' (a subclass of rlvr.environments.Environment with reset(row) and step(turn))."""
    turn_discount: float = 1.0
    """Per-turn discount of an episode's reward: the reward of an episode that took n model turns is multiplied by turn_discount ** (n - 1) (1.0 = none), so a first-attempt pass is worth more than a third-attempt one."""
    max_staleness: int = 0
    """Asynchronous rollouts (distributed.rollout_workers > 0): how many weight versions the batch a step trains on may lag behind the policy it updates. 0 = synchronous (each step samples with the weights it then updates); 1 = one-step-off (the rollout of step k+1 runs during the update of step k); k = step j samples with the weights after step j-k. The update corrects for the sampler with the engine's log-probs and a truncated importance weight (algo.tis_cap, 2.0 when unset). Ignored, with a note, where no rollout workers run."""
    max_tool_calls: int = 4
    """Most tool calls per response; a call past it is not run (generation no longer pauses at it)."""
    tool_call: str = TOOL_CALL_SYNTAX
    """How the model calls a tool: {name} (optional with one tool) and {args} between fixed texts; generation pauses at the text after {args}."""
    tool_result: str = TOOL_RESULT_SYNTAX
    """What the environment appends after a call, {output} being the tool's result (or 'error: ...')."""
    tool_timeout_s: float = 5.0
    """Hard time limit per tool call (in the reward.workers pool); a slower call answers 'error: timed out'."""
    tool_max_chars: int = 400
    """Longest tool result, in characters; a longer one answers an error."""

    def __post_init__(self) -> None:
        _check(
            self.engine != Engine.VLLM,
            "rollout.engine=vllm: rlvr's vLLM engine is not built yet (it can only be verified on an NVIDIA GPU, "
            "and rlvr has had one for a single session); use rollout.engine=hf",
        )
        _check(self.samples_per_prompt >= 2, "rollout.samples_per_prompt must be >= 2 (a group needs a baseline)")
        _check(self.max_turns >= 1, f"rollout.max_turns={self.max_turns}: must be >= 1 (1 = single-turn)")
        _check(
            self.max_turns == 1 or not self.tools,
            f"rollout.max_turns={self.max_turns} runs code episodes with feedback, and rollout.tools={self.tools} "
            "a tool loop; one rollout does one of them: set rollout.max_turns=1 or rollout.tools=[]",
        )
        _check(
            not self.environment or not self.tools or self.environment == "tools",
            f"rollout.environment={self.environment} and rollout.tools={self.tools}: the tools run in the tools "
            "environment; set rollout.environment='' (or tools), or rollout.tools=[]",
        )
        _check(0 < self.turn_discount <= 1, f"rollout.turn_discount={self.turn_discount}: must be in (0, 1] (1 = none)")
        _check(
            self.max_staleness >= 0,
            f"rollout.max_staleness={self.max_staleness}: must be >= 0 (0 = synchronous, 1 = one-step-off)",
        )
        _check(self.max_new_tokens >= 1, "rollout.max_new_tokens must be >= 1")
        _check(self.temperature > 0, "rollout.temperature must be > 0")
        _check(0 < self.top_p <= 1, "rollout.top_p must be in (0, 1]")
        _check(self.top_k >= 0, "rollout.top_k must be >= 0")
        _check(
            self.dtype in ("auto", "float32", "bfloat16"), f"rollout.dtype={self.dtype}: use auto, float32 or bfloat16"
        )
        _check(
            all(self.stop),
            "rollout.stop holds an empty string; give non-empty stop strings, e.g. rollout.stop=['</answer>']",
        )
        _check(self.batch_seqs >= 1, "rollout.batch_seqs must be >= 1")
        try:
            parse_tool_syntax(self.tool_call, self.tool_result)
        except ValueError as e:
            raise UserError(f"rollout.{e}") from None
        _check(self.max_tool_calls >= 1, "rollout.max_tool_calls must be >= 1 (leave rollout.tools empty for no tools)")
        _check(self.tool_timeout_s > 0, "rollout.tool_timeout_s must be > 0")
        _check(self.tool_max_chars >= 16, "rollout.tool_max_chars must be >= 16 (room for an error message)")
        dupes = sorted({t for t in self.tools if self.tools.count(t) > 1})
        _check(not dupes, f"rollout.tools lists {', '.join(dupes)} twice; list each tool once")


@dataclass(frozen=True)
class RewardConfig:
    rules: list[str] = field(default_factory=lambda: ["accuracy", "format"])
    """Reward rules (`rlvr reward list`), or plugins 'package.module:function' / 'path/to/file.py:function'."""
    weights: list[float] = field(default_factory=lambda: [1.0, 0.5])
    """One weight per rule: total reward = sum(weight * rule score)."""
    accuracy_rule: str = "accuracy"
    """Which rule is reported as accuracy (metric rollout/accuracy); need not be in rules."""
    sandbox: str = "bwrap"
    """How the code rules (code_tests, code_tests_frac) run model-written code: bwrap (bubblewrap namespaces, no network, no files of yours, rlimits; apt-get install bubblewrap) or none (no isolation: it can read and write what you can; a warning once per run)."""
    env_weight: float = 1.0
    """Weight of an environment's own reward (a plugin environment's Step.reward, rollout.environment) in the total reward; the built-in environments give none (the rules score their episodes)."""
    timeout_s: float = 2.0
    """Hard time limit per item for math-verify and for plugin rules; a timed-out item counts as an error."""
    workers: int = 2
    """Worker processes for math-verify and plugin rules (0 = score in the trainer process, no hard time limit)."""
    on_error: OnError = OnError.SCORE
    """When a rule raises, times out or returns a non-number: score (the item gets on_error_score) or raise."""
    on_error_score: float = 0.0
    """Score of an item whose rule failed (counted in metric reward/<name>_errors)."""
    truncated_score: float | None = None
    """If set, the total reward of a completion cut at rollout.max_new_tokens (null = score it like any other)."""

    def __post_init__(self) -> None:
        _check(
            len(self.rules) > 0,
            "reward.rules is empty: give at least one rule, e.g. reward.rules=[accuracy] reward.weights=[1.0]",
        )
        _check(
            len(self.weights) == len(self.rules),
            f"reward.weights has {len(self.weights)} entries but reward.rules has {len(self.rules)} "
            f"({', '.join(self.rules)}); give one weight per rule, e.g. reward.weights={[1.0] * len(self.rules)}",
        )
        dupes = sorted({r for r in self.rules if self.rules.count(r) > 1})
        _check(not dupes, f"reward.rules lists {', '.join(dupes)} twice; list each rule once and set its weight")
        _check(self.timeout_s > 0, "reward.timeout_s must be > 0")
        _check(self.workers >= 0, "reward.workers must be >= 0 (0 = no worker processes)")


@dataclass(frozen=True)
class AlgoConfig:
    adv_method: AdvMethod = AdvMethod.GRPO
    """Advantage: grpo ((r - group mean) / (group std ddof=1 + adv_eps)), dr_grpo (r - group mean), rloo (leave-one-out mean), reinforce_pp (r - group mean, / batch std)."""
    adv_eps: float = 1e-6
    """Added to the std before dividing (grpo, reinforce_pp)."""
    clip_low: float = 0.2
    """PPO clip: ratio is clamped below at 1 - clip_low."""
    clip_high: float = 0.2
    """PPO clip: ratio is clamped above at 1 + clip_high (DAPO 'clip higher' uses 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1: the loss of a negative-advantage token is capped at -A*c (veRL clip_ratio_c=3); null = off."""
    ratio_level: RatioLevel = RatioLevel.TOKEN
    """Importance ratio per token (PPO/GRPO) or per sequence, length-normalised (GSPO; needs loss_agg=seq_mean_token_mean)."""
    kl_coef: float = 0.0
    """Weight of the KL-to-reference term; 0 loads no reference model at all."""
    kl_estimator: KLEstimator = KLEstimator.K3
    """KL estimator: k1, k2 or k3 (low-variance, DeepSeekMath; clamped as veRL low_var_kl). k1 only with kl_placement=reward: in the loss its gradient has zero mean."""
    kl_placement: KLPlacement = KLPlacement.LOSS
    """Where the KL acts: loss (kl_coef * token KL added to the loss, GRPO) or reward (kl_coef * sequence KL subtracted from the reward before advantages)."""
    ref_sync_every: int = 0
    """Copy the policy into the reference model every N steps (MindRLHF sync_ref_model; 0 = never)."""
    loss_agg: LossAgg = LossAgg.TOKEN_MEAN
    """Loss reduction: token_mean (over all tokens of the optimizer step), seq_mean_token_mean (GRPO paper), seq_mean_token_sum_norm (Dr. GRPO: / (sequences * rollout.max_new_tokens))."""
    num_iterations: int = 1
    """Optimizer steps on each rollout batch (PPO epochs, TRL's mu). >1 keeps old log-probs for the ratio."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (0 = off; entropy is still logged)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose rewards are all equal and sample more prompts until train.prompts_per_step groups carry signal."""
    dynamic_sampling_max_batches: int = 4
    """Extra rollout batches (of train.prompts_per_step prompts each) a step may draw; if still short, zero-variance groups fill the batch."""
    overlong_buffer: int = 0
    """DAPO overlong shaping: penalise responses in the last N tokens of rollout.max_new_tokens linearly down to -overlong_penalty (0 = off)."""
    overlong_penalty: float = 1.0
    """Largest overlong penalty (at rollout.max_new_tokens tokens)."""
    tis_cap: float | None = None
    """Truncated importance sampling: weight each token's loss by min(p_trainer / p_rollout, tis_cap) to correct the rollout engine's (e.g. bf16) sampling; null = off."""

    def __post_init__(self) -> None:
        _check(0 <= self.clip_low < 1, "algo.clip_low must be in [0, 1)")
        _check(self.clip_high >= 0, "algo.clip_high must be >= 0")
        _check(self.dual_clip is None or self.dual_clip > 1, "algo.dual_clip must be > 1 (e.g. 3.0), or null for off")
        _check(self.kl_coef >= 0, "algo.kl_coef must be >= 0")
        _check(self.adv_eps >= 0, "algo.adv_eps must be >= 0")
        _check(self.num_iterations >= 1, "algo.num_iterations must be >= 1")
        _check(self.ref_sync_every >= 0, "algo.ref_sync_every must be >= 0 (0 = never)")
        _check(
            self.ref_sync_every == 0 or self.kl_coef > 0,
            "algo.ref_sync_every needs a reference model; set algo.kl_coef > 0 (or algo.ref_sync_every=0)",
        )
        _check(self.dynamic_sampling_max_batches >= 0, "algo.dynamic_sampling_max_batches must be >= 0")
        _check(self.overlong_buffer >= 0, "algo.overlong_buffer must be >= 0 (0 = off)")
        _check(self.overlong_penalty >= 0, "algo.overlong_penalty must be >= 0")
        _check(self.tis_cap is None or self.tis_cap > 0, "algo.tis_cap must be > 0 (e.g. 2.0), or null for off")
        _check(
            self.ratio_level != RatioLevel.SEQUENCE or self.loss_agg == LossAgg.SEQ_MEAN_TOKEN_MEAN,
            f"algo.ratio_level=sequence (GSPO) with algo.loss_agg={self.loss_agg} is not GSPO: set algo.loss_agg=seq_mean_token_mean",
        )
        _check(
            self.kl_coef == 0 or self.kl_placement != KLPlacement.LOSS or self.kl_estimator != KLEstimator.K1,
            "algo.kl_estimator=k1 with algo.kl_placement=loss adds a KL whose gradient has zero mean: "
            "use algo.kl_estimator=k3 (or k2), or algo.kl_placement=reward",
        )


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 60
    """GRPO steps (one rollout batch each)."""
    prompts_per_step: int = 4
    """P: prompts per step; the step trains on P * G sequences."""
    micro_batch_seqs: int = 8
    """Sequences per forward/backward pass (gradient accumulation over the step): a divisor of the step's sequences (per worker), or at least all of them for one pass; unused with train.micro_batch_tokens."""
    micro_batch_seqs_bf16: int = 0
    """Sequences per forward/backward pass instead of train.micro_batch_seqs where the update runs under bf16 autocast (model.autocast_bf16 on, or auto choosing it); 0 = train.micro_batch_seqs. Larger passes pay under bf16 (larger products; each pass casts every weight's gradient to float32 and adds it), while in float32 they mostly cost memory. The same rule: a divisor of the step's sequences, or at least all of them (not checked with model.autocast_bf16=false, which never uses it)."""
    micro_batch_tokens: int = 0
    """Tokens per forward/backward pass instead of rows (0 = off): each row's prompt and response, without padding, packed end to end (position ids restarting per row), the rows spread over the fewest passes and balanced by tokens; a longer row runs alone. Each row runs its own prompt: needs train.shared_prompt_forward=false. Equal to row micro-batches up to float rounding."""
    logprob_micro_batch_tokens: int = 0
    """With train.micro_batch_tokens: tokens per pass of the old and reference log-probs, which keep no activations for a backward (0 = twice train.micro_batch_tokens)."""
    lr: float = 1e-6
    """Peak learning rate (AdamW)."""
    lr_schedule: str = "constant"
    """constant or cosine (after warmup)."""
    warmup_steps: int = 0
    """Linear warmup, in optimizer steps."""
    min_lr_ratio: float = 0.1
    """Cosine floor as a fraction of lr."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_betas: list[float] = field(default_factory=lambda: [0.9, 0.99])
    """AdamW betas."""
    shared_prompt_forward: bool = True
    """Run each group's shared prompt through the model once (exact; the prompt costs 1/G)."""
    length_buckets: bool = True
    """Split each micro-batch by response length, so short responses do not run padded to the longest (exact up to float rounding); packed passes (train.micro_batch_tokens) have no padding to cut."""
    remove_padding: bool = True
    """Run each group's responses end to end without their padding, and the micro-batch's groups end to end in one row, where the shared prompt runs in one pass (sdpa attention, no sliding window; with gradient checkpointing only the no-grad log-prob passes): the linears and the LM head compute real tokens only, one pass per micro-batch instead of length buckets. Exact up to float rounding."""
    zero_adv_forward_only: bool = True
    """Groups whose every advantage is exactly 0 (all G samples scored alike) run forward only, without a backward, where their loss is identically 0: no KL term in the loss (algo.kl_coef=0 or algo.kl_placement=reward) and no entropy bonus. The gradient and every train/ statistic are the same up to float rounding (the groups still count in the loss denominators and in the statistics); the optimizer steps as before. Off under distributed.strategy=fsdp, where every worker must run the same passes."""
    rollout_entropy: bool = True
    """train/entropy from the rollout's own record: the entropy of its sampling distribution (full softmax at rollout.temperature) at each sampled token, in the rollout's precision (float32 on a CPU), rather than from the update's passes, whose bf16 autocast reads low entropies high. And groups that train.zero_adv_forward_only runs forward only then need no pass at all where nothing needs their log-probs (no old log-probs, no TIS): their loss is 0 and their ratio exactly 1 whatever the log-probs. Applies with algo.num_iterations=1, no entropy bonus and single-turn rollouts (no rollout.tools); elsewhere the update's passes give the entropy. The gradient and the weights are the same bit for bit."""
    fused_attention: Switch = Switch.AUTO
    """The update's shared-prompt attention (its passes with and without gradients) by rlvr's compiled kernel (rlvr.cpu.update_attention: scores, mask, softmax and values in one call a direction on AVX512-BF16's bf16 products, no segment padding, the probabilities recomputed in the backward rather than kept): auto = where it applies (a CPU with AVX512-BF16 and a C compiler, bf16 autocast on, head size a multiple of 64 up to 256), true = require it (an error saying why where it cannot run), false = the torch kernels. The same values up to bf16 rounding (its scores stay float32)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm (0 = off)."""
    save_every: int = 0
    """Checkpoint every N steps (0 = only at the end, SIGINT/SIGTERM and train.save_every_min)."""
    save_every_min: float = 30.0
    """Also checkpoint when this many minutes have passed since the last checkpoint (0 = off), so a killed run loses at most that."""
    keep_checkpoints: int = 2
    """How many step checkpoints to keep (the newest; 0 = keep all)."""
    max_bad_steps: int = 5
    """An update whose loss or gradient is NaN/inf is skipped (counted in train/skipped_steps); after this many steps in a row with every update skipped, the run saves a checkpoint and stops."""
    save_hf: Switch = Switch.AUTO
    """distributed.strategy=fsdp: also write a loadable Hugging Face model in each checkpoint (rank 0's whole rollout copy, in rollout.dtype, beside the sharded state: no gather); auto = for models under 3B parameters. Other runs' checkpoints are Hugging Face models always."""
    skip_memory_check: bool = False
    """On a GPU, training refuses to start when the memory estimate (rlvr estimate, with the data's longest prompt) exceeds the device's free memory; true starts anyway."""

    def __post_init__(self) -> None:
        _check(self.steps >= 1, "train.steps must be >= 1")
        _check(self.prompts_per_step >= 1, "train.prompts_per_step must be >= 1")
        _check(self.micro_batch_seqs >= 1, "train.micro_batch_seqs must be >= 1")
        _check(self.micro_batch_seqs_bf16 >= 0, "train.micro_batch_seqs_bf16 must be >= 0 (0 = train.micro_batch_seqs)")
        _check(self.micro_batch_tokens >= 0, "train.micro_batch_tokens must be >= 0 (0 = row micro-batches)")
        _check(
            self.logprob_micro_batch_tokens >= 0,
            "train.logprob_micro_batch_tokens must be >= 0 (0 = twice train.micro_batch_tokens)",
        )
        _check(
            self.logprob_micro_batch_tokens == 0 or self.micro_batch_tokens > 0,
            f"train.logprob_micro_batch_tokens={self.logprob_micro_batch_tokens} sizes packed log-prob passes, but "
            "train.micro_batch_tokens=0 runs rows; set train.micro_batch_tokens too (or this to 0)",
        )
        _check(
            self.micro_batch_tokens == 0 or not self.shared_prompt_forward,
            f"train.micro_batch_tokens={self.micro_batch_tokens} packs each row with its own prompt, but "
            "train.shared_prompt_forward=true runs one prompt per group; set train.shared_prompt_forward=false "
            "(or train.micro_batch_tokens=0)",
        )
        _check(self.lr > 0, "train.lr must be > 0")
        _check(
            self.lr_schedule in ("constant", "cosine"), f"train.lr_schedule={self.lr_schedule}: use constant or cosine"
        )
        _check(self.warmup_steps >= 0, "train.warmup_steps must be >= 0")
        _check(0 <= self.min_lr_ratio <= 1, "train.min_lr_ratio must be in [0, 1]")
        _check(
            len(self.adam_betas) == 2 and all(0 <= b < 1 for b in self.adam_betas),
            "train.adam_betas must be two numbers in [0, 1)",
        )
        _check(self.max_grad_norm >= 0, "train.max_grad_norm must be >= 0")
        _check(
            self.save_every >= 0 and self.keep_checkpoints >= 0,
            "train.save_every and train.keep_checkpoints must be >= 0",
        )
        _check(self.max_bad_steps >= 1, "train.max_bad_steps must be >= 1")
        _check(self.save_every_min >= 0, "train.save_every_min must be >= 0 (0 = off)")

    @property
    def logprob_tokens(self) -> int:
        """Tokens per packed log-prob pass (0: row passes)."""
        return self.logprob_micro_batch_tokens or 2 * self.micro_batch_tokens

    def micro_batch(self, bf16: bool) -> int:
        """Sequences per update pass: train.micro_batch_seqs_bf16 under bf16 autocast where set, else
        train.micro_batch_seqs (the one rule the trainer and the estimate both follow)."""
        return (bf16 and self.micro_batch_seqs_bf16) or self.micro_batch_seqs


@dataclass(frozen=True)
class OffloadConfig:
    reference: bool = False
    """Keep each worker's shards of the reference model in host memory (pinned), copied to the GPU one layer at a time for its forward passes; it is read into host memory and sharded from there, so a GPU never holds it whole (FSDP2's CPUOffloadPolicy: GPU workers under distributed.strategy=fsdp or hsdp with a reference, algo.kl_coef > 0; not yet run on a GPU)."""
    optimizer: bool = False
    """Keep each worker's shard of the AdamW state in host memory; the AdamW step then runs on the CPU (FSDP2's CPUOffloadPolicy, with offload.params: GPU workers under distributed.strategy=fsdp or hsdp only; not yet run on a GPU)."""
    params: bool = False
    """Keep each worker's shards of the policy's parameters and gradients in host memory (pinned), copied to the GPU one layer at a time for each pass (FSDP2's CPUOffloadPolicy, which offloads the AdamW state with them: set offload.optimizer=true too; GPU workers under distributed.strategy=fsdp or hsdp only; not yet run on a GPU)."""

    def __post_init__(self) -> None:
        _check(
            self.params == self.optimizer,
            f"offload.params={str(self.params).lower()} and offload.optimizer={str(self.optimizer).lower()}: FSDP2's "
            "CPUOffloadPolicy keeps a worker's shards of the parameters, gradients and AdamW state in host memory "
            "together (the AdamW step runs on the CPU); set both to true (or both to false)",
        )


@dataclass(frozen=True)
class LogConfig:
    samples_every: int = 1
    """Write the step's prompts, completions and rewards to samples.jsonl every N steps (0 = never)."""
    tensorboard: bool = True
    """Also write TensorBoard events to RUN/tensorboard (if tensorboard is installed)."""
    progress: bool = True
    """Show a progress bar on the console."""
    print_config: bool = False
    """Print the full resolved config at start (`rlvr train --print-config`); it is always saved to RUN/config.yaml."""
    wandb: bool = False
    """Also log to Weights & Biases (needs `pip install wandb`; without it training stops before step 1 with a one-line error)."""
    wandb_project: str = "rlvr"
    """W&B project name (the W&B run is named after the run directory)."""
    wandb_mode: str = "offline"
    """offline (writes RUN/wandb, no network; upload later with `wandb sync`) or online."""
    report: bool = True
    """Write RUN/report/ (plots, report.md, report.html; `rlvr report`) when training ends."""

    def __post_init__(self) -> None:
        _check(self.samples_every >= 0, "log.samples_every must be >= 0")
        _check(self.wandb_mode in ("offline", "online"), f"log.wandb_mode={self.wandb_mode}: use offline or online")


@dataclass(frozen=True)
class EvalConfig:
    at_start: bool = True
    """Evaluate the starting model before step 1 (RUN/eval/step_000000), so every run shows its before/after."""
    at_end: bool = True
    """Evaluate the final model after the last step."""
    every_steps: int = 0
    """Also evaluate every N steps (0 = only at start/end)."""
    data: str = ""
    """What to evaluate on: empty = the run's test split (arithmetic test set, data.test_path or data.path's test split), else a built-in task name, a data file or a Hugging Face data set name (e.g. HuggingFaceH4/MATH-500; its commit is recorded as for data.path)."""
    limit: int = 50
    """Evaluate on the first N problems (0 = all). The quickstart's 50 greedy problems take seconds on 2 CPU cores."""
    samples: int = 1
    """K: 1 = greedy accuracy only; K > 1 also samples K completions per problem for pass@k and maj@K."""
    temperature: float = 1.0
    """Sampling temperature of the K samples (greedy accuracy ignores it)."""
    max_new_tokens: int = 0
    """Response length limit during evaluation (0 = rollout.max_new_tokens)."""
    batch_prompts: int = 64
    """Problems generated together."""

    def __post_init__(self) -> None:
        _check(self.every_steps >= 0, "eval.every_steps must be >= 0")
        _check(self.limit >= 0, "eval.limit must be >= 0 (0 = all problems)")
        _check(self.samples >= 1, f"eval.samples={self.samples}: must be >= 1 (1 = greedy only)")
        _check(self.temperature > 0, "eval.temperature must be > 0")
        _check(self.max_new_tokens >= 0, "eval.max_new_tokens must be >= 0 (0 = rollout.max_new_tokens)")
        _check(self.batch_prompts >= 1, "eval.batch_prompts must be >= 1")


WORKER_ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_DEBUG": "WARN"}
"""The environment every Ray worker starts with unless ``distributed.env`` says otherwise: the CUDA
caching allocator grows segments instead of leaving fragments of fixed-size blocks (torchtitan and
veRL set the same), and NCCL prints a warning line when a collective fails or times out."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class DistributedConfig:
    backend: Backend = Backend.NONE
    """none (one process) or ray (distributed.num_workers data-parallel Ray actors joined by torch.distributed: gloo on CPU, nccl on GPU)."""
    num_workers: int = 1
    """Data-parallel workers (backend=ray): each samples, scores and trains on train.prompts_per_step / num_workers prompts of every step; gradients are all-reduced."""
    address: str = "local"
    """Ray cluster: local (start Ray on this machine), auto (join the cluster `ray start` runs here), or HOST:PORT of a head node."""
    cpus_per_worker: float = 1.0
    """CPUs reserved per worker in the placement group (also its torch threads, at least 1)."""
    gpus_per_worker: float = 0.0
    """GPUs reserved per worker (> 0: each worker trains on the GPU Ray assigns it and all-reduces with nccl)."""
    resources_per_worker: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each worker needs besides CPUs and GPUs (e.g. {node_slot: 1} with `ray start --resources='{"node_slot": 1}'` on every node puts one worker on each node)."""
    strategy: Strategy = Strategy.DDP
    """ddp: every worker holds the whole model and all-reduces gradients; fsdp: PyTorch FSDP2 shards the policy, reference, gradients and AdamW state over the workers (checkpoints via torch.distributed.checkpoint; full-parameter training only); hsdp: FSDP2 shards them over the workers of one node (distributed.workers_per_node) and replicates the shards across nodes, so the per-pass weight gathers stay inside a node and only one gradient all-reduce per optimizer step crosses nodes."""
    workers_per_node: int = 0
    """distributed.strategy=hsdp: workers per node, each node's workers one shard group (a Ray placement group packed on one node, ranks contiguous); must divide num_workers."""
    step_timeout_s: float = 3600.0
    """How long the driver waits for the workers' answer to one call (a step, setup, a checkpoint) before it ends the run with one line, the last checkpoint intact (0 = no limit). It also bounds how long the other workers wait for rank 0 alone (writing a checkpoint) under FSDP."""
    collective_timeout_s: float = 600.0
    """How long a worker waits inside one collective (a gradient all-reduce, an FSDP all-gather, the gather of a step's rewards) for the others before it gives up (torch.distributed's timeout); the run then ends with one line that names the rank that never arrived."""
    async_save: bool = True
    """Under FSDP, write the periodic checkpoints' shards in the background (torch.distributed.checkpoint's async_save) while training goes on: each worker first copies its shard of the policy and AdamW state into host memory; the checkpoint appears in checkpoints/ only once whole. The final checkpoint, one on a signal and the next save wait for it."""
    rollout_workers: int = 0
    """Ray actors that only generate and score rollouts (docs/distributed.md#asynchronous-rollouts), apart from the num_workers trainers, each with cpus_per_worker / gpus_per_worker of its own: the trainers push their new weights to them after every update, and they take whole steps in turn. 0 = the trainers sample their own batches (synchronous). With rollout.max_staleness > 0 a step's rollout runs during the previous update."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables for the workers (Ray's runtime_env), over the defaults PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation of GPU memory) and NCCL_DEBUG=WARN (NCCL says why a collective failed), e.g. {NCCL_SOCKET_IFNAME: eth0, NCCL_IB_HCA: mlx5}; a value "" drops a default."""

    def __post_init__(self) -> None:
        _check(self.num_workers >= 1, "distributed.num_workers must be >= 1")
        _check(self.cpus_per_worker > 0, "distributed.cpus_per_worker must be > 0")
        _check(self.gpus_per_worker >= 0, "distributed.gpus_per_worker must be >= 0")
        _check(self.step_timeout_s >= 0, "distributed.step_timeout_s must be >= 0 (0 = no limit)")
        _check(
            self.collective_timeout_s > 0,
            f"distributed.collective_timeout_s={self.collective_timeout_s:g}: must be > 0 (seconds a worker waits "
            "in one collective for the others)",
        )
        for name in self.env:
            _check(
                _ENV_NAME.fullmatch(name) is not None,
                f"distributed.env.{name}: not an environment variable name (letters, digits and _, not first a digit)",
            )
        for name, amount in self.resources_per_worker.items():
            _check(
                name not in ("CPU", "GPU") and amount > 0,
                f"distributed.resources_per_worker.{name}={amount}: a custom resource needs an amount > 0 "
                "(CPUs and GPUs go in cpus_per_worker and gpus_per_worker)",
            )
        _check(bool(self.address), "distributed.address is empty: use local, auto or HOST:PORT")
        _check(self.rollout_workers >= 0, f"distributed.rollout_workers={self.rollout_workers}: must be >= 0")
        if self.backend == Backend.RAY:
            _check(
                importlib.util.find_spec("ray") is not None,
                "distributed.backend=ray needs Ray, which is not installed: pip install ray (or distributed.backend=none)",
            )
        else:
            _check(self.num_workers == 1, f"distributed.num_workers={self.num_workers} needs distributed.backend=ray")
            _check(
                self.rollout_workers == 0,
                f"distributed.rollout_workers={self.rollout_workers} runs rollouts in Ray actors apart from the "
                "trainer: set distributed.backend=ray (or distributed.rollout_workers=0)",
            )
            _check(
                self.strategy == Strategy.DDP,
                f"distributed.strategy={self.strategy} shards the model over Ray workers: "
                "set distributed.backend=ray (num_workers=1 is fine), or drop the strategy",
            )
        k = self.workers_per_node
        if self.strategy == Strategy.HSDP:
            _check(
                k >= 1 and self.num_workers % k == 0,
                f"distributed.strategy=hsdp shards within a node and replicates across nodes: set "
                f"distributed.workers_per_node to the workers on each node, a divisor of num_workers={self.num_workers} "
                f"(it is {k})",
            )
        else:
            _check(
                k == 0,
                f"distributed.workers_per_node={k} sizes the shard groups of distributed.strategy=hsdp, but the "
                f"strategy is {self.strategy}; set distributed.strategy=hsdp (or drop workers_per_node)",
            )

    @property
    def worker_env(self) -> dict[str, str]:
        """The variables the workers start with: :data:`WORKER_ENV`, then ``env`` over it ("" drops one)."""
        return {k: v for k, v in {**WORKER_ENV, **self.env}.items() if v != ""}
