"""What is sampled is what is trained: precision from the hardware, eval mode outside the update,
rlvr's own generation settings, and stop strings."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
from tiny_run import tiny_args

from rlvr.cli import main
from rlvr.config import Switch, load_config
from rlvr.models import precision
from rlvr.models.tiny import TINY_WORDS, tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.base import cut_at_stop, response_mask_from_eos
from rlvr.training.loop import batch_logprobs, update_policy

PROMPTS = ["what is 3 + 4 ?", "what is 2 + 2 ?"]


def _fake_cpu(monkeypatch, capability: str, probe: str):
    """PyTorch dispatching at ``capability`` on silicon whose ``torch.cpu.<probe>()`` says yes."""
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    monkeypatch.setattr(torch.cpu, probe, lambda: True, raising=False)
    precision.cpu_bf16.cache_clear()
    precision.machine_bf16_speedup.cache_clear()


@pytest.fixture
def cpu_without_bf16(monkeypatch):
    """A CPU that dispatches AVX2 although the silicon has AMX (as under ATEN_CPU_CAPABILITY=avx2)."""
    _fake_cpu(monkeypatch, "AVX2", "_is_amx_tile_supported")
    yield
    precision.cpu_bf16.cache_clear()


@pytest.fixture
def cpu_with_bf16(monkeypatch):
    _fake_cpu(monkeypatch, "AVX512", "_is_avx512_bf16_supported")
    _fake_cpu(monkeypatch, "AVX512", "_is_amx_tile_supported")
    yield
    precision.cpu_bf16.cache_clear()


def _avx512_bf16_without_amx(monkeypatch, speedup: float, cache=None):
    """AVX512-BF16 without AMX, where the stopwatch reads bf16 products at ``speedup`` times fp32's rate,
    with the machine's measurement kept under ``cache`` (default: a new temporary folder)."""
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(precision, "bf16_speedup", lambda: speedup)
    monkeypatch.setenv("RLVR_CACHE", str(cache or tempfile.mkdtemp(prefix="rlvr-test-cache-")))
    _fake_cpu(monkeypatch, "AVX512", "_is_avx512_bf16_supported")


def _forget_cpu():
    precision.cpu_bf16.cache_clear()
    precision.machine_bf16_speedup.cache_clear()


@pytest.fixture
def cpu_with_avx512_bf16_only(monkeypatch):
    """bf16 matmuls slower than fp32 (159 vs 259 GFLOP/s measured on one such CPU)."""
    _avx512_bf16_without_amx(monkeypatch, 0.61)
    yield
    _forget_cpu()


@pytest.fixture
def cpu_with_fast_avx512_bf16(monkeypatch):
    """bf16 matmuls at twice fp32's rate (a Zen 4 EPYC: 452 vs 223 GFLOP/s)."""
    _avx512_bf16_without_amx(monkeypatch, 2.03)
    yield
    _forget_cpu()


# -- 1. precision chosen from the hardware -------------------------------------------------------


def test_auto_is_float32_where_bf16_is_emulated(cpu_without_bf16):
    cfg = load_config(None, [])
    assert cfg.rollout.dtype == "auto" and cfg.model.autocast_bf16 is Switch.AUTO  # the defaults
    resolved, lines = precision.resolve_precision(cfg, torch.device("cpu"))
    assert resolved.rollout.dtype == "float32" and resolved.model.autocast_bf16 is Switch.OFF
    assert lines == [
        "rollout dtype: float32, training autocast bf16: off "
        "(auto: this CPU has no native bf16 as PyTorch dispatches: AVX2)"
    ]


def test_auto_is_bf16_where_it_is_native(cpu_with_bf16):
    resolved, lines = precision.resolve_precision(load_config(None, []), torch.device("cpu"))
    assert resolved.rollout.dtype == "bfloat16" and resolved.model.autocast_bf16 is Switch.ON
    assert "native bf16: AVX512 with AVX512_BF16+AMX" in lines[0]


def test_auto_is_float32_with_avx512_bf16_but_no_amx_where_bf16_products_are_slow(cpu_with_avx512_bf16_only):
    resolved, lines = precision.resolve_precision(load_config(None, []), torch.device("cpu"))
    assert resolved.rollout.dtype == "float32" and resolved.model.autocast_bf16 is Switch.OFF
    assert "AVX512_BF16 but no AMX" in lines[0] and "0.61x" in lines[0] and "under the 1.5x" in lines[0]
    explicit = load_config(None, ["model.autocast_bf16=true"])
    assert "may run slower" in precision.resolve_precision(explicit, torch.device("cpu"))[1][1]


def test_auto_autocasts_training_with_avx512_bf16_where_bf16_products_are_fast(cpu_with_fast_avx512_bf16):
    """Training under bf16 autocast, sampling in float32 (the packed weights and compiled decode step)."""
    resolved, lines = precision.resolve_precision(load_config(None, []), torch.device("cpu"))
    assert resolved.rollout.dtype == "float32" and resolved.model.autocast_bf16 is Switch.ON
    kept = precision.speed_cache_path()
    assert lines == [
        "rollout dtype: float32, training autocast bf16: on (auto: this CPU has AVX512_BF16 but no AMX (AVX512): "
        "bf16 products ran at 2.03x fp32's rate here, so training autocasts to bf16 and sampling stays float32; "
        f"measured once on this machine and kept in {kept} (delete it to measure again))"
    ]
    explicit = load_config(None, ["model.autocast_bf16=true"])
    assert len(precision.resolve_precision(explicit, torch.device("cpu"))[1]) == 1  # no warning where it pays
    off = load_config(None, ["model.autocast_bf16=false"])
    assert precision.resolve_precision(off, torch.device("cpu"))[0].model.autocast_bf16 is Switch.OFF


def test_estimate_counts_autocast_as_training_would(cpu_with_fast_avx512_bf16):
    from rlvr.estimate.peak import _precision

    assert _precision(load_config(None, []), "cpu") == ("float32", True)
    assert _precision(load_config(None, ["model.autocast_bf16=false"]), "cpu") == ("float32", False)


def test_bf16_micro_batch_replaces_the_micro_batch_only_under_bf16_autocast():
    on = ["model.autocast_bf16=true", "train.micro_batch_seqs=8", "train.micro_batch_seqs_bf16=32"]
    cfg, line = precision.bf16_micro_batch(load_config(None, on))
    assert cfg.train.micro_batch_seqs == 32 and cfg.train.micro_batch_seqs_bf16 == 32
    assert line == "micro-batches: 32 sequences a pass under bf16 autocast (train.micro_batch_seqs_bf16; 8 in float32)"
    assert precision.bf16_micro_batch(cfg) == (cfg, None)  # applied once: a resumed run's config stays as it is
    for off in (["model.autocast_bf16=false", *on[1:]], [*on[:2], "train.micro_batch_seqs_bf16=0"]):  # fp32, or unset
        cfg = load_config(None, off)
        assert precision.bf16_micro_batch(cfg) == (cfg, None)


def test_train_under_auto_bf16_uses_and_saves_the_bf16_micro_batch(tiny_dir, tmp_path, capsys, monkeypatch):
    _avx512_bf16_without_amx(monkeypatch, 2.03)
    monkeypatch.setenv("COLUMNS", "1000")
    run = tmp_path / "run"
    overrides = ["model.autocast_bf16=auto", "train.micro_batch_seqs=2", "train.micro_batch_seqs_bf16=4"]
    small = ["rollout.max_new_tokens=4", "rollout.samples_per_prompt=2", "train.steps=1", "train.prompts_per_step=2"]
    rc = main(["train", *tiny_args(tiny_dir, run, *small, *overrides, "eval.at_start=false", "eval.at_end=false")])
    assert rc == 0
    err = capsys.readouterr().err
    assert "micro-batches: 4 sequences a pass under bf16 autocast (train.micro_batch_seqs_bf16; 2 in float32)" in err
    saved = load_config(run / "config.yaml", [])
    assert saved.model.autocast_bf16 is Switch.ON and saved.train.micro_batch_seqs == 4


def test_bf16_speedup_measures_both_sides():
    ratio = precision.bf16_speedup(rounds=1)
    assert 0 < ratio < 100  # emulated bf16 (AVX2) gives a small ratio, native bf16 about 1 to 3


@pytest.mark.parametrize(
    "first, later", [(1.49, 9.9), (9.9, 1.49), (1.53, 1.2)], ids=["busy-then-idle", "idle-then-busy", "near"]
)
def test_the_precision_is_the_machines_not_the_stopwatchs(monkeypatch, tmp_path, first, later):
    """The stopwatch reads whatever the load lets it (1.49x to 9.9x within 20 minutes on one machine):
    the first run on a machine measures and keeps its figures; every later run, whatever its
    stopwatch would read, picks the same precision and says the same rate and where it is kept."""
    _avx512_bf16_without_amx(monkeypatch, first, cache=tmp_path)
    try:
        resolved, lines = precision.resolve_precision(load_config(None, []), torch.device("cpu"))
        kept = precision.speed_cache_path()
        figures = json.loads(kept.read_text())
        assert kept.parent == tmp_path / "cpu" and figures["bf16_over_fp32"] == first
        assert figures["cpu"]["capability"] == "AVX512" and figures["threads"] == torch.get_num_threads()
        assert f"{first:.2f}x" in lines[0] and f"kept in {kept} (delete it to measure again)" in lines[0]
        for _ in range(3):  # later runs: new processes (caches cleared), another reading on the stopwatch
            _avx512_bf16_without_amx(monkeypatch, later, cache=tmp_path)
            again, again_lines = precision.resolve_precision(load_config(None, []), torch.device("cpu"))
            assert again == resolved and again_lines == lines
        kept.unlink()  # what the line says to do to measure again
        _avx512_bf16_without_amx(monkeypatch, later, cache=tmp_path)
        redone, _ = precision.resolve_precision(load_config(None, []), torch.device("cpu"))
        assert json.loads(kept.read_text())["bf16_over_fp32"] == later
        assert (redone.model.autocast_bf16 is Switch.ON) == (later >= precision.AUTOCAST_MIN_SPEEDUP)
    finally:
        _forget_cpu()


def test_an_unwritable_cache_still_decides_with_a_measurement(monkeypatch, tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    _avx512_bf16_without_amx(monkeypatch, 2.5, cache=blocked)
    try:
        assert precision.machine_bf16_speedup() == (2.5, precision.speed_cache_path())
    finally:
        _forget_cpu()


def test_explicit_bf16_on_an_avx2_cpu_is_allowed_with_a_warning(cpu_without_bf16):
    cfg = load_config(None, ["rollout.dtype=bfloat16", "model.autocast_bf16=true"])
    resolved, lines = precision.resolve_precision(cfg, torch.device("cpu"))
    assert resolved.rollout.dtype == "bfloat16" and resolved.model.autocast_bf16 is Switch.ON
    assert len(lines) == 3 and all(line.startswith("warning: ") for line in lines[1:])
    assert "slower" in lines[1] and "slower" in lines[2]


def test_aten_avx2_dispatch_reads_as_no_native_bf16():
    """The real probe in a fresh process: PyTorch's own dispatch switch turns bf16 off."""
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    code = "from rlvr.models.precision import cpu_bf16; s = cpu_bf16(); print(s.native, s.why)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.startswith("False ") and "AVX2" in out, out


def test_train_prints_the_choice_first_and_saves_it(tiny_dir, tmp_path, capsys, cpu_without_bf16, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")  # rich wraps at 80 columns on a console that is not a terminal
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            *tiny_args(
                tiny_dir,
                run,
                "rollout.dtype=auto",
                "rollout.max_new_tokens=4",
                "rollout.samples_per_prompt=2",
                "train.steps=1",
                "train.prompts_per_step=2",
                "train.micro_batch_seqs=4",
                "eval.at_start=false",
                "eval.at_end=false",
            ),
        ]
    )
    assert rc == 0
    lines = capsys.readouterr().err.splitlines()  # in the run's summary, before any step
    precision = next(i for i, line in enumerate(lines) if line.startswith("  precision  "))
    assert lines[precision].startswith("  precision  rollout dtype: float32, training autocast bf16: off")
    assert precision < next(i for i, line in enumerate(lines) if line.startswith("step "))
    saved = load_config(run / "config.yaml", [])
    assert saved.rollout.dtype == "float32" and saved.model.autocast_bf16 is Switch.OFF


# -- 3. eval mode for sampling and log-probs, train mode only inside the update --------------------


def _engine(model, **kw):
    return HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=6, dtype="float32", **kw)


def test_update_leaves_the_policy_in_eval_mode():
    torch.manual_seed(0)
    policy = tiny_model(attention_dropout=0.5).eval()
    engine = _engine(policy)
    batch = engine.generate(PROMPTS, 4)
    cfg = load_config(None, ["rollout.samples_per_prompt=4", "train.prompts_per_step=2", "train.micro_batch_seqs=4"])
    opt = torch.optim.SGD(policy.parameters(), lr=0.0)  # lr 0: the weights stay, only the mode may change
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5] * 2)
    update_policy(policy, opt, sched, batch, adv, None, None, cfg, contextlib.nullcontext)
    assert not policy.training
    lp = dict(micro_batch_seqs=4, group_size=4, temperature=1.0, autocast=contextlib.nullcontext)
    a, b = batch_logprobs(policy, batch, **lp), batch_logprobs(policy, batch, **lp)
    assert torch.equal(a, b)  # dropout 0.5 would make these differ
    greedy = [engine.generate(PROMPTS, 1, greedy=True).input_ids for _ in range(2)]
    assert torch.equal(greedy[0], greedy[1])


def test_logprobs_ignore_a_policy_left_in_train_mode():
    torch.manual_seed(0)
    policy = tiny_model(attention_dropout=0.5)
    batch = _engine(policy).generate(PROMPTS, 2)
    lp = dict(micro_batch_seqs=4, group_size=2, temperature=1.0, autocast=contextlib.nullcontext)
    policy.train()
    a = batch_logprobs(policy, batch, **lp)
    assert policy.training  # the caller's mode is restored
    policy.eval()
    assert torch.equal(a, batch_logprobs(policy, batch, **lp))


# -- 4. sampling is plain softmax(z / T): nothing from generation_config.json -----------------------


def test_checkpoint_generation_defaults_do_not_change_sampling():
    plain, opinionated = tiny_model(seed=3), tiny_model(seed=3)
    gc = opinionated.generation_config
    gc.repetition_penalty, gc.temperature, gc.top_p, gc.do_sample, gc.top_k = 1.5, 0.3, 0.5, False, 5
    gc.no_repeat_ngram_size, gc.suppress_tokens = 2, [TINY_WORDS.index("7")]
    outs = []
    for model in (plain, opinionated):
        torch.manual_seed(11)
        outs.append(_engine(model, temperature=1.0).generate(PROMPTS, 8).input_ids)
    assert torch.equal(outs[0], outs[1])
    assert opinionated.generation_config.repetition_penalty == 1.5  # the checkpoint's file is left alone


# -- rollout.stop: a response ends with its first stop string, in training and evaluation alike ----


def test_stop_string_ends_the_response_and_its_mask():
    """A stop string matches text, as vLLM's does: '8' stops a row at '80' too, and the text is cut
    after the '8' while the token '80', which was sampled, is the last one trained on."""
    torch.manual_seed(0)
    tok = tiny_tokenizer()
    batch = _engine(tiny_model(seed=1), stop=["8"], temperature=1.0).generate(PROMPTS, 16)
    stopped = 0
    for ids, mask, text, cut in zip(batch.response_ids, batch.response_mask, batch.texts, batch.truncated):
        words = [
            w for w in tok.convert_ids_to_tokens(ids[mask.bool()].tolist()) if w not in ("<eos>", "<pad>", "<unk>")
        ]
        full = " ".join(words)
        if "8" in full:
            stopped += 1
            assert "8" in words[-1] and "8" not in "".join(words[:-1]) and not cut, full  # nothing after it
            assert text == full[: full.index("8") + 1]
        else:
            assert text == full
    assert stopped >= 8, batch.texts


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>1+2=3</think><answer>3</answer></", "<think>1+2=3</think><answer>3</answer>"),
        ("<answer>3</answer>", "<answer>3</answer>"),
        ("no stop here", "no stop here"),
        ("a</answer> b STOP c", "a</answer>"),
        ("a STOP b </answer>", "a STOP"),
    ],
)
def test_text_is_cut_after_the_first_stop_string(text, expected):
    assert cut_at_stop(text, ["</answer>", "STOP"]) == expected


def test_mask_ends_at_the_earlier_of_eos_and_stop():
    ids = torch.tensor([[5, 6, 1, 0], [5, 6, 7, 8], [5, 1, 0, 0], [5, 6, 7, 8]])
    stop_at = torch.tensor([-1, 1, 2, -1])
    mask, truncated = response_mask_from_eos(ids, [1], stop_at=stop_at)
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert truncated.tolist() == [False, False, False, True]


def test_quickstart_stops_at_the_closing_answer_tag():
    assert load_config(None, []).rollout.stop == ["</answer>"]


def test_generation_commands_say_nothing_of_training_precision(cpu_with_fast_avx512_bf16):
    """eval, chat and generate print the dtype they generate in; the training autocast choice (and its
    measured rate) is training's line, not theirs."""
    from rlvr.evaluation.loading import generation_dtype

    dtype, line = generation_dtype("cpu")
    assert dtype == "float32" and line.startswith("generation dtype: float32 (this CPU has AVX512_BF16 but no AMX")
    assert "train" not in line and "measured" not in line
