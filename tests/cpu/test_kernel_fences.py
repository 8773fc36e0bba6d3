"""The compiled decode kernels' fences (rlvr.cpu.kernels, rlvr.cpu.lean): every way they can fail to build,
load or agree falls back to the torch-operations step with one line; their wrappers refuse bad
arguments before C sees an address; and the whole compiled step equals the Hugging Face forward over a
grid of head layouts, head sizes, row counts and embeddings, for Llama and Qwen2."""

from __future__ import annotations

import functools
import os
import shutil
import stat

import pytest
import torch
from test_lean import _eos, _steps_match_a_full_forward
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from rlvr.cpu import kernels, lean, packed
from rlvr.cpu.lean import LeanDecoder, LeanUnavailable
from rlvr.cpu.packed import PackedLinears
from rlvr.models.tiny import TINY_WORDS

HAVE_CC = bool(os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc"))
needs_cc = pytest.mark.skipif(not HAVE_CC, reason="no C compiler: the decode runs as torch operations")


@pytest.fixture
def fresh(monkeypatch):
    """kernels.load() and the self-checks run again under this test's environment, and again after it."""
    kernels.load.cache_clear()
    lean.kernel_self_check.cache_clear()
    yield monkeypatch
    kernels.load.cache_clear()
    lean.kernel_self_check.cache_clear()


def _d64():
    torch.manual_seed(8)
    cfg = dict(
        vocab_size=len(TINY_WORDS),
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return _eos(LlamaForCausalLM(LlamaConfig(**cfg)))


def _falls_back(why: str) -> None:
    model = _d64()
    dec = LeanDecoder(model, PackedLinears(model))
    assert dec.attention == "torch" and why in dec.describe(), dec.describe()
    with pytest.raises(LeanUnavailable, match="compiled decode kernels are unavailable"):
        LeanDecoder(model, PackedLinears(model), kernel=True)


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


@needs_cc
@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++")
def test_a_cxx_compiler_as_cc_builds_the_file_as_c(fresh):
    """CC=g++ compiled the .c as C++ (mangled names: 'undefined symbol: cascade_supports'); -x c makes it C."""
    fresh.setenv("CC", "g++")
    assert kernels.load() is not None, kernels.why_not


@needs_cc
def test_cc_with_a_wrapper_word_is_split_as_a_shell_would(fresh, tmp_path):
    """CC="ccache gcc": a launcher then the compiler (here `env`, which runs what follows)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    fresh.setenv("CC", f"env RLVR_TEST=1 {cc}")
    assert kernels.load() is not None, kernels.why_not


def test_a_failed_build_gives_the_compilers_first_error_line(fresh, tmp_path):
    """GCC names the function first ('In function ...'), then the error: the reason is the error line."""
    cc = _script(
        tmp_path,
        "oldgcc",
        "echo \"decode_kernels.c: In function 'lean_pick':\" >&2\n"
        "echo \"decode_kernels.c:448:24: error: implicit declaration of function '__builtin_shufflevector'\" >&2\n"
        "exit 1\n",
    )
    fresh.setenv("CC", cc)
    _falls_back("failed to build decode_kernels.c: decode_kernels.c:448:24: error: implicit declaration of function")


@needs_cc
def test_a_library_without_the_kernels_symbols_falls_back(fresh, tmp_path):
    other = tmp_path / "other.c"
    other.write_text("int cascade_supports(int rep, int d) { return 1; }\n")  # lean_step and the rest missing
    fresh.setattr(kernels, "SOURCE", other)
    _falls_back("could not load other.c")


@needs_cc
def test_a_second_openmp_runtime_turns_the_kernels_off(fresh):
    fresh.setattr(kernels, "openmp_runtimes", lambda: ["libgomp.so.1", "libiomp5.so"])
    _falls_back("two OpenMP runtimes are loaded (libgomp.so.1, libiomp5.so)")


def test_the_openmp_runtimes_of_this_process_are_read():
    assert kernels.openmp_runtimes() == [] or all(
        r.startswith(("libgomp", "libomp", "libiomp")) for r in kernels.openmp_runtimes()
    )


@needs_cc
def test_off_by_default_where_not_measured_and_opt_in(fresh):
    fresh.setattr(kernels, "default_on", lambda: False)
    _falls_back("off by default on")
    kernels.load.cache_clear()
    fresh.setenv("RLVR_DECODE_KERNELS", "1")
    assert kernels.load() is not None, kernels.why_not


def test_one_switch_turns_all_cpu_acceleration_off(fresh):
    """RLVR_CPU_ACCEL=0: no kernels, no packing (so no lean decode), no huge pages; each says why."""
    from rlvr import cpu
    from rlvr.models.tiny import tiny_model, tiny_tokenizer
    from rlvr.rollout import HFRolloutEngine

    fresh.setenv("RLVR_CPU_ACCEL", "0")
    assert not cpu.enabled()
    assert kernels.load() is None and kernels.why_not == "RLVR_CPU_ACCEL=0"
    assert packed.dtype_unpackable(torch.float32) == "RLVR_CPU_ACCEL=0 turns the CPU acceleration off"
    engine = HFRolloutEngine(tiny_model(), tiny_tokenizer(), max_new_tokens=4)
    assert engine.packed is None and engine.lean is None and "RLVR_CPU_ACCEL=0" in engine.unpacked
    assert cpu.huge_pages_env({"RLVR_CPU_ACCEL": "0"}, platform="linux", glibc=(2, 39), thp="madvise") is None
    assert cpu.huge_pages_env({}, platform="linux", glibc=(2, 39), thp="madvise") is not None
    assert cpu.keep_freed_env({"RLVR_CPU_ACCEL": "0"}, platform="linux", glibc=(2, 39)) is None


@needs_cc
def test_a_step_that_disagrees_with_the_torch_step_turns_the_kernels_off(fresh):
    """The self-check at load: a compiled step that is wrong (here by one in one logit) is never used."""
    real = kernels.DecodeKernels.step

    def wrong(self, *args, **kwargs):
        logits = real(self, *args, **kwargs)
        logits[0, 0] += 1.0
        return logits

    fresh.setattr(kernels.DecodeKernels, "step", wrong)
    _falls_back("the compiled step disagrees with the torch step on a LlamaForCausalLM with 6 query heads over 2")


@needs_cc
def test_the_self_check_passes_and_leaves_the_global_rng_alone(fresh):
    torch.manual_seed(123)
    before = torch.get_rng_state()
    assert lean.kernel_self_check("Qwen2ForCausalLM", 14, 2, 64, bias=True, tied=False) is None
    assert torch.equal(torch.get_rng_state(), before)


@pytest.fixture(scope="module")
def k():
    kernels.load.cache_clear()
    k = kernels.load()
    if k is None:
        pytest.skip(f"no compiled kernels here: {kernels.why_not}")
    return k


def _step_args(k, b=2, **change):
    shape = kernels.StepShape(
        layers=1, hidden=8, intermediate=8, vocab=8, heads=2, kv_heads=1, head_dim=64, eps=1e-6, scaling=0.125
    )
    args = dict(
        shape=shape,
        table=torch.zeros(1, len(kernels.SLOTS), dtype=torch.int64),
        final_norm=torch.ones(8),
        head=torch.zeros(-(-8 // k.width), 8, k.width),
        head_bias=None,
        bias=torch.zeros(1, k.width),
        prompt=torch.zeros(b, dtype=torch.int64),
        cache_row=torch.arange(b),
        capacity=k.width,
        t=0,
        cos=torch.ones(b, 64),
        sin=torch.zeros(b, 64),
        x=torch.zeros(b, 8),
    )
    args.update(change)
    return args


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(x=torch.zeros(2, 8, dtype=torch.float64)), "x must be a contiguous float32 CPU tensor, got float64"),
        (
            dict(x=torch.zeros(8, 2).t()),
            "x must be a contiguous float32 CPU tensor, got float32 on cpu, not contiguous",
        ),
        (dict(x=torch.zeros(2, 9)), r"x must have shape \(2, 8\), got \(2, 9\)"),
        (dict(cos=torch.ones(2, 32)), r"cos must have shape \(2, 64\)"),
        (dict(prompt=torch.zeros(2, dtype=torch.int32)), "prompt must be a contiguous int64"),
        (dict(prompt=torch.tensor([0, 5])), "prompt indices must be in"),
        (dict(table=torch.zeros(2, len(kernels.SLOTS), dtype=torch.int64)), "table must have shape"),
        (dict(t=-1), "outside the capacity"),
    ],
    ids=["dtype", "strided", "shape", "rotary", "index-dtype", "index-range", "layers", "position"],
)
def test_the_step_refuses_bad_arguments_before_c_reads_them(k, change, message):
    with pytest.raises(ValueError, match=message):
        k.step(**_step_args(k, **change))


def test_a_shape_without_a_kernel_is_an_error_code_not_a_crash(k):
    """9 query heads a key/value head: C returns -1 before reading anything (the table's addresses are 0)."""
    shape = kernels.StepShape(
        layers=1, hidden=8, intermediate=8, vocab=8, heads=9, kv_heads=1, head_dim=64, eps=1e-6, scaling=0.125
    )
    with pytest.raises(ValueError, match="no kernel for 9 query heads over 1 key/value heads of size 64"):
        k.step(**_step_args(k, shape=shape))


def test_nan_logits_raise_as_torch_multinomial_does(k):
    logits = torch.randn(3, 500)
    logits[1, 7] = float("nan")
    with pytest.raises(ValueError, match=r"logits of rows \[1\] contain NaN"):
        k.pick(logits, torch.rand(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="no finite value"):
        k.pick(torch.full((1, 100), float("-inf")), torch.rand(1, dtype=torch.float64))
    with pytest.raises(RuntimeError):
        torch.multinomial(torch.softmax(logits, -1), 1)


# --- the shape grid: the whole compiled step against the Hugging Face forward ---------------------------

GRID_PROMPTS = ["what is 3 + 4 ?", "the answer", "what is 2 + 2 ? 7 7 and 9 + 1 = ?", "7"]
ROWS = {1: (1, 1), 16: (2, 8), 17: (1, 17), 33: (3, 11), 64: (4, 16)}  # rows: (prompts, samples a prompt)


@functools.cache
def _grid_model(arch: str, rep: int, head_dim: int, tied: bool):
    """One layer, 2 key/value heads of ``head_dim``, ``rep`` query heads each; Qwen2 has its q/k/v biases."""
    torch.manual_seed(rep * 1000 + head_dim + tied)
    cfg = dict(
        vocab_size=len(TINY_WORDS),
        hidden_size=32 * rep,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=2 * rep,
        num_key_value_heads=2,
        head_dim=head_dim,
        tie_word_embeddings=tied,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(Qwen2Config(**cfg)) if arch == "qwen2" else LlamaForCausalLM(LlamaConfig(**cfg))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.1)
    return _eos(model)


@pytest.mark.slow
@needs_cc
@pytest.mark.parametrize("rows", list(ROWS))
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("rep", range(1, 9))
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_compiled_step_equals_the_hf_forward_over_the_shape_grid(k, arch, rep, head_dim, tied, rows):
    P, G = ROWS[rows]
    model = _grid_model(arch, rep, head_dim, tied)
    dec = _steps_match_a_full_forward(model, GRID_PROMPTS[:P], G=G, steps=2, drops={}, kernel=True, atol=5e-5)
    assert dec.attention == "kernel"
