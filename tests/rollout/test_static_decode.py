"""The static-cache decode (rlvr.rollout.static) gives what the dynamic decode gives: greedy token for token,
seeded samples draw for draw, stop strings, log-probs and token accounting; its step compiles to one graph
with no breaks (what CUDA graphs need), and sees weights changed in place. On a CPU the step runs eagerly
or under torch.compile's eager backend; on a GPU (``pytest --device cuda``) the engine compiles it."""

from __future__ import annotations

import contextlib

import pytest
import torch
from host_syncs import HostSyncs
from tiny_run import metrics, tiny_config

from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.models.gqa_decode import attention_traffic, gqa_decode_attention
from rlvr.models.tiny import tiny_model, tiny_qwen2, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.decode import GreedyPicker, decode
from rlvr.rollout.hf import eos_token_ids, sample_seed
from rlvr.rollout.static import Sampler, StaticDecoder

PROMPTS = ["what is 3 + 4 ?", "the answer", "what is 2 + 2 ? 7 7 and 9 + 1 = ?"]


MODELS = {"llama": lambda: tiny_model(seed=5), "qwen2": lambda: tiny_qwen2().eval()}


def _engines(model, device, **kw):
    tok = tiny_tokenizer()
    model = model.to(device)
    common = dict(max_new_tokens=14, batch_seqs=6, packed_weights=False, **kw)
    return (
        HFRolloutEngine(model, tok, static_decode=False, lean_decode=False, **common),
        HFRolloutEngine(model, tok, static_decode=True, **common),
    )


def _same(a, b, logprobs=False):
    assert a.texts == b.texts
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.response_mask, b.response_mask)
    assert torch.equal(a.truncated, b.truncated)
    if logprobs:
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-5, rtol=1e-5)
    if a.entropy is not None or b.entropy is not None:
        torch.testing.assert_close(a.entropy, b.entropy, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", list(MODELS))
def test_greedy_is_token_identical_to_the_dynamic_decode(arch, device):
    dynamic, static = _engines(MODELS[arch](), device, stop=["7"])
    assert static.static and not dynamic.static
    a, b = (e.generate(PROMPTS, 3, greedy=True) for e in (dynamic, static))
    _same(a, b)


@pytest.mark.parametrize("arch", list(MODELS))
def test_seeded_samples_stop_strings_and_logprobs_equal_the_dynamic_decode(arch, device):
    dynamic, static = _engines(
        MODELS[arch](), device, temperature=0.9, top_k=30, stop=["</answer>", "7"], logprobs=True
    )
    seeds = [sample_seed(3, i) for i in range(len(PROMPTS) * 4)]
    a, b = (e.generate(PROMPTS, 4, seeds=seeds) for e in (dynamic, static))
    _same(a, b, logprobs=True)
    assert (a.response_mask.sum(-1) < 14).any()  # rows ended early: the static decode kept stepping them


def _decoder_inputs(model, tok, prompts=PROMPTS, G=2, greedy=True, new=10, entropy=False):
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    seeds = None if greedy else torch.tensor([sample_seed(7, i) for i in range(len(prompts) * G)])
    how = Sampler(greedy, temperature=0.9, entropy_temperature=0.9 if entropy else None)
    kw = dict(max_new_tokens=new, how=how, seeds=seeds, eos_ids=eos_token_ids(model, tok), pad_id=tok.pad_token_id)
    return (enc.input_ids, enc.attention_mask, G), kw


@pytest.mark.parametrize("entropy", [False, True], ids=["plain", "entropy"])
def test_the_step_compiles_to_one_graph_without_breaks(entropy):
    """CUDA graphs capture a whole step (forward, sampling, bookkeeping, the entropy's record) only when
    dynamo traces it as one graph."""
    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    decoder = StaticDecoder(model)
    args, kw = _decoder_inputs(model, tok, greedy=False, entropy=entropy)
    decoder.decode(*args, **kw)  # allocates the buffers
    step, _ = decoder._compiled(kw["how"], kw["eos_ids"])
    decoder.t.fill_(1)  # a token position the response buffer holds
    with torch.no_grad():
        explained = torch._dynamo.explain(step)(decoder._view(8, 256))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


class _HostReads(HostSyncs):
    """Host syncs plus the copies into the decoder's host buffers (on a CPU every tensor is on the host,
    so the copies are told apart by their destination)."""

    def __init__(self, decoder):
        super().__init__()
        self.decoder = decoder

    def other(self, func, args) -> None:
        if func is torch.ops.aten.copy_.default and self.decoder.rows:
            ptrs = {s.untyped_storage().data_ptr() for s in self.decoder.staging}
            self.count += args[0].untyped_storage().data_ptr() in ptrs


def test_the_host_reads_the_device_once_per_sync_interval():
    """Issue 36: at most one host sync per 16 decode steps. Counted as the extra syncs of a longer decode
    (the prefill's are the same in both), on a model that never ends a row."""
    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    counts = {}
    for new in (64, 256):
        decoder = StaticDecoder(model)
        args, kw = _decoder_inputs(model, tok, greedy=False, new=new)
        kw["eos_ids"] = [tok.vocab_size + 10]  # no token ends a row
        with _HostReads(decoder) as reads:
            out = decoder.decode(*args, **kw)
        assert out.response.shape[1] == new and out.steps == new - 1
        counts[new] = reads.count
    per_step = (counts[256] - counts[64]) / (256 - 64)
    assert 0 < per_step <= 1 / 16, counts


def test_seeded_rows_draw_the_same_alone_or_in_any_batch():
    """A row's samples depend on its seed and position only: alone, beside other rows, or after others are
    compacted away, it draws the same tokens."""
    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    decoder = StaticDecoder(model)
    args, kw = _decoder_inputs(model, tok, greedy=False, G=6, new=24)
    ids, mask, G = args
    both = decoder.decode(ids, mask, G, **kw)
    for p in range(len(PROMPTS)):
        kw1 = dict(kw, seeds=kw["seeds"][p * G : (p + 1) * G])
        alone = decoder.decode(ids[p : p + 1], mask[p : p + 1], G, **kw1)
        rows = both.response[p * G : (p + 1) * G]
        n = alone.response.shape[1]
        assert torch.equal(alone.response, rows[:, :n]) and (rows[:, n:] == tok.pad_token_id).all()


def test_finished_rows_are_compacted_away_and_the_output_is_unchanged():
    """64 rows, most ending early (a stop string and EOS): the batch shrinks down the ladder, the row-steps
    fall far below rows x steps, and the result is the dynamic decode's."""
    model, tok = tiny_model(seed=5), tiny_tokenizer()
    common = dict(max_new_tokens=96, batch_seqs=64, packed_weights=False, stop=["7"], temperature=1.3)
    dynamic = HFRolloutEngine(model, tok, static_decode=False, lean_decode=False, **common)
    static = HFRolloutEngine(model, tok, static_decode=True, **common)
    static.decoder.sync_every = 4  # responses of a few tokens: look often enough to see rows end
    seeds = [sample_seed(11, i) for i in range(64)]
    prompts = [PROMPTS[i % 3] for i in range(16)]
    a, b = (e.generate(prompts, 4, seeds=seeds) for e in (dynamic, static))
    _same(a, b)
    stats = static.last_stats
    assert stats["row_steps"] < 0.6 * stats["decode_steps"] * 64, stats
    assert {b for b, _ in static.decoder.views} >= {64, 8}


def test_the_cache_is_kept_for_the_run_and_the_window_follows_the_filled_part():
    """One set of buffers serves every rollout (fixed addresses for the CUDA graphs); the step attends a
    window holding the filled positions, not the whole capacity."""
    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    decoder = StaticDecoder(model, rows=8, capacity=1000)
    args, kw = _decoder_inputs(model, tok, new=20)
    decoder.decode(*args, **kw)
    ptrs = [k.data_ptr() for k in decoder.keys]
    assert decoder.capacity == 1024 and decoder.rows == 8
    for _ in range(2):
        decoder.decode(*args, **kw)
    assert [k.data_ptr() for k in decoder.keys] == ptrs
    assert {W for _, W in decoder.views} == {256}  # 1024 positions allocated, 256 attended
    args, kw = _decoder_inputs(model, tok, new=300)
    decoder.decode(*args, **kw)
    assert {W for _, W in decoder.views} == {256, 512} and [k.data_ptr() for k in decoder.keys] == ptrs


def _compiles() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def test_twenty_rollouts_of_different_prompt_lengths_compile_the_step_at_most_twice():
    """Batch and window are dynamic: new prompt lengths, batch sizes and windows reuse the compiled step
    (dynamo counts each compiled graph; the prefill is not compiled)."""
    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    decoder = StaticDecoder(model, compile="eager", rows=16, capacity=600)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    words = "one two three four five six seven eight nine ten".split()
    for i in range(20):
        prompts = [" ".join(words[: 1 + (i + j) % 10] * (1 + i % 4)) for j in range(1 + i % 4)]
        args, kw = _decoder_inputs(model, tok, prompts, G=2 + i % 3, greedy=False, new=8 + 13 * (i % 5))
        decoder.decode(*args, **kw)
    assert len(decoder.views) > 3  # several (batch, window) pairs were met
    assert _compiles() <= 2, dict(torch._dynamo.utils.counters["stats"])


@pytest.mark.slow
def test_the_compiled_step_decodes_what_the_dynamic_decode_does_and_sees_new_weights():
    """torch.compile (eager backend on a CPU: the capture without a code generator) over two rollouts, with
    the weights changed in place between them, as an optimizer step changes them."""
    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    decoder = StaticDecoder(model, compile="eager")
    enc = tok(PROMPTS, return_tensors="pt", padding=True, add_special_tokens=False)
    eos, pad = eos_token_ids(model, tok), tok.pad_token_id
    for _ in range(2):
        want = decode(model, enc.input_ids, enc.attention_mask, 2, max_new_tokens=10, pick=GreedyPicker(),
                      eos_ids=eos, pad_id=pad)  # fmt: skip
        got = decoder.decode(enc.input_ids, enc.attention_mask, 2, max_new_tokens=10, how=Sampler(True), seeds=None,
                             eos_ids=eos, pad_id=pad)  # fmt: skip
        assert torch.equal(got.response, want.response) and torch.equal(got.stop_at, want.stop_at)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)  # in place: the same tensors, new values


def test_static_and_lean_decode_together_are_one_config_error():
    with pytest.raises(UserError, match="rollout.lean_decode=true and rollout.static_decode=true are two decoders"):
        load_config(None, ["rollout.lean_decode=true", "rollout.static_decode=true"])


def test_auto_is_static_on_a_gpu_only():
    engine = HFRolloutEngine(tiny_model(), tiny_tokenizer(), max_new_tokens=4)
    assert engine.static is False


def test_training_with_the_static_decode_takes_the_steps_the_dynamic_decode_takes(tiny_dir, tmp_path):
    from rlvr.training import train

    runs = {}
    for how in ("true", "false"):
        train(
            tiny_config(
                tiny_dir,
                tmp_path / how,
                "train.steps=2",
                f"rollout.static_decode={how}",
                "rollout.lean_decode=false",
                "model.packed_weights=false",
            )
        )
        runs[how] = metrics(tmp_path / how, timings=False)
    # train/entropy is each decoder's own record of its sampling distribution: equal up to rounding
    entropy = {how: [m.pop("train/entropy") for m in rows] for how, rows in runs.items()}
    assert runs["true"] == runs["false"]
    assert entropy["true"] == pytest.approx(entropy["false"], rel=1e-5)


@pytest.mark.extended
def test_the_inductor_compiled_step_samples_what_the_dynamic_decode_samples_with_one_compile():
    """The code generator a GPU uses (inductor; on a CPU without CUDA graphs): seeded samples, stop strings,
    log-probs and entropies equal to the dynamic decode over batches of 4, 8 and 12 rows, one compiled graph."""
    model, tok = tiny_qwen2().eval(), tiny_tokenizer()
    common = dict(
        max_new_tokens=60, batch_seqs=12, packed_weights=False, stop=["7"], temperature=0.9, top_k=30, logprobs=True,
        entropy=True,
    )  # fmt: skip
    dynamic = HFRolloutEngine(model, tok, static_decode=False, lean_decode=False, **common)
    static = HFRolloutEngine(model, tok, static_decode=True, **common)
    static.decoder = StaticDecoder(static.model, compile="inductor", rows=12)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for i in range(4):
        prompts = PROMPTS[: 1 + i % 3]
        seeds = [sample_seed(i, j) for j in range(len(prompts) * 4)]
        _same(*(e.generate(prompts, 4, seeds=seeds) for e in (dynamic, static)), logprobs=True)
    assert {b for b, _ in static.decoder.views} >= {4, 8, 12}
    assert _compiles() == 1


def test_the_host_copy_event_is_recorded_on_the_buffers_device(monkeypatch):
    """Issue 61.4: with the buffers on cuda:1 and cuda:0 current, the event must wait for cuda:1's stream
    (where the copy was queued), not the current device's. CUDA's calls are stood in for on the CPU."""
    from rlvr.rollout import static

    recorded = []

    class Event:
        def record(self, stream=None):
            recorded.append(stream)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: f"stream of {device}")
    assert static.copy_event(torch.device("cpu")) is None and recorded == []
    assert isinstance(static.copy_event(torch.device("cuda:1")), Event)
    assert recorded == ["stream of cuda:1"]


def test_a_failing_static_decode_falls_back_to_the_dynamic_decode(monkeypatch, capsys):
    """Issue 61 fail soft: a compile or capture failure of the static step (injected here) leaves the run on
    the dynamic decode, with one line; the batch is the one the dynamic decode samples from the same seeds,
    and in an unseeded call from the row seeds the static decode had drawn."""
    dynamic, static = _engines(MODELS["llama"](), "cpu", temperature=0.9, stop=["7"])

    def broken(*args, **kw):
        raise RuntimeError("CUDA graph capture failed: operation not permitted when stream is capturing")

    monkeypatch.setattr(static.decoder, "decode", broken)
    seeds = [sample_seed(4, i) for i in range(len(PROMPTS) * 2)]
    _same(static.generate(PROMPTS, 2, seeds=seeds), dynamic.generate(PROMPTS, 2, seeds=seeds))
    assert not static.static and static.decoder is None and static.static_failure.startswith("RuntimeError: CUDA")
    err = capsys.readouterr().err
    assert err.count("warning: the static decode failed (RuntimeError: CUDA graph capture failed") == 1
    assert "rollout.static_decode=false always does" in err
    _same(static.generate(PROMPTS, 2, seeds=seeds), dynamic.generate(PROMPTS, 2, seeds=seeds))  # and stays there
    assert capsys.readouterr().err == ""


def test_refused_pinned_memory_gives_pageable_buffers_and_one_line(monkeypatch, capsys):
    """Issue 61 fail soft: where page-locked memory is refused (here, naturally: a CPU-only torch has no
    pinned allocator), the static decode's host buffers are pageable and one line says so."""
    from rlvr.rollout import static

    monkeypatch.setattr(static, "pinning_failure", None)
    a, b = static.host_buffer(8, pinned=True), static.host_buffer(8, pinned=True)
    assert not a.is_pinned() and a.shape == (8,) and not b.is_pinned()
    err = capsys.readouterr().err
    assert err.count("warning: pinned host memory was refused") == 1 and static.pinning_failure
    assert not static.host_buffer(4, pinned=False).is_pinned() and capsys.readouterr().err == ""


def test_twelve_sampling_modes_compile_without_reaching_the_recompile_limit():
    """Issue 61.2: each sampling mode (training's sampling, greedy and sampled evaluation, other
    temperatures, EOS sets) compiles its own step; on one shared code object the 9th version would hit
    dynamo's recompile limit, which ``fullgraph=True`` makes an error."""
    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    decoder = StaticDecoder(model, compile="eager", rows=8, capacity=200)
    torch._dynamo.reset()
    args, kw = _decoder_inputs(model, tok, PROMPTS[:2], G=2, greedy=False, new=4)
    for i in range(12):
        how = Sampler(False, 0.5 + 0.1 * i, top_k=10 * (i % 3))
        decoder.decode(*args, **{**kw, "how": how})
    codes = {fn.__code__ for fn in decoder.raw_steps.values()}
    assert len(codes) == len(decoder.compiled) == 12


def test_a_growing_cache_lets_the_old_one_go_before_making_the_new(monkeypatch):
    """Issue 61.5: when a call needs more rows or positions than the cache holds, the old keys and values
    are freed before the new ones are allocated, so the two never coexist."""
    import weakref

    from rlvr.rollout import static

    model, tok = tiny_model(seed=5).eval(), tiny_tokenizer()
    decoder = StaticDecoder(model, rows=4, capacity=16)
    args, kw = _decoder_inputs(model, tok, PROMPTS[:2], G=2, greedy=True, new=4)
    decoder.decode(*args, **kw)  # buffers and views at the small size
    old = [weakref.ref(t) for t in (*decoder.keys, *decoder.values, decoder.mask, decoder.out_tokens)]
    alive_at_first_new = []
    zeros = torch.zeros

    def watching(*a, **k):
        if not alive_at_first_new:
            alive_at_first_new.append(sum(r() is not None for r in old))
        return zeros(*a, **k)

    monkeypatch.setattr(static.torch, "zeros", watching)
    args, kw = _decoder_inputs(model, tok, PROMPTS, G=4, greedy=True, new=600)  # more rows and positions
    decoder.decode(*args, **kw)
    assert decoder.capacity > 16 and decoder.rows >= 12
    assert alive_at_first_new == [0]


def _traced_step_traffic(model, monkeypatch=None) -> dict:
    """The attention traffic of the static decode's step as dynamo traces it (a backend that keeps the graph)."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    tok = tiny_tokenizer()
    decoder = StaticDecoder(model, compile=keep)
    args, kw = _decoder_inputs(model, tok, new=6)
    decoder.decode(*args, **kw)
    assert len(graphs) == 1
    return attention_traffic(graphs[0])


def test_the_compiled_step_attends_grouped_heads_without_copying_keys_and_values(monkeypatch):
    """Issue 61 item 1: compiled, transformers' sdpa attention repeats each layer's keys and values to every
    query head; the step's own attention folds the query heads instead. Counted in the traced graph, and
    the same count under transformers' attention shows the copies (the count can see them)."""
    model = tiny_qwen2().eval()
    groups = model.config.num_attention_heads // model.config.num_key_value_heads
    assert model.config._attn_implementation == "sdpa" and groups > 1
    folded = _traced_step_traffic(model)
    assert folded["attention_calls"] == model.config.num_hidden_layers
    assert (folded["kv_copies"], folded["kv_copy_bytes"]) == (0, 0)
    monkeypatch.setattr("rlvr.rollout.static.gqa_decode", lambda model: contextlib.nullcontext())
    repeated = _traced_step_traffic(model)
    assert repeated["kv_copies"] == 2 * model.config.num_hidden_layers
    assert repeated["attention_kv_bytes"] == groups * folded["attention_kv_bytes"]
    assert repeated["kv_copy_bytes"] == 2 * repeated["attention_kv_bytes"]
    assert model.config._attn_implementation == "sdpa"  # left as it was


def test_the_folded_attention_equals_transformers_attention():
    """One token of a grouped-query layer, folded, gives transformers' sdpa output (same shapes, float32)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model = tiny_qwen2().eval()
    layer = model.model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, 1, 8, generator=g)
    k, v = torch.randn(3, 2, 11, 8, generator=g), torch.randn(3, 2, 11, 8, generator=g)
    mask = torch.rand(3, 1, 1, 11, generator=g) > 0.3
    mask[..., 0] = True
    ours, _ = gqa_decode_attention(layer, q, k, v, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(layer, q, k, v, mask, scaling=0.3)
    assert ours.shape == theirs.shape == (3, 1, 4, 8)
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
