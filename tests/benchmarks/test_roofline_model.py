"""The roofline floor (benchmarks/roofline_model.py, used only by the benchmarks): FLOPs and bytes of each
phase counted by hand on a tiny shape. Nothing is timed: the rates are made-up numbers."""

import sys
from pathlib import Path

import pytest

from rlvr.estimate import ModelShape

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))  # the benchmarks' own folder

from roofline_model import (  # noqa: E402
    Cost,
    Rates,
    decode_cost,
    floor,
    forward_cost,
    head_params,
    layer_matmul_params,
    prefill_cost,
    rollout_floor,
    streamed_params,
    update_cost,
)

# layers 2, hidden 32, intermediate 64, 4 heads of 8, 2 kv heads (kv_dim 16), vocab 128, tied
TINY = ModelShape(2, 32, 64, 4, 2, 128, tie_word_embeddings=True)
# attention: 4 FLOPs x 4 heads x 8 head_dim x 2 layers = 256 per (query, key) pair
# KV cache in fp32: 2 (k, v) x 2 layers x 16 kv_dim x 4 B = 256 B per token
# fp32 weights streamed: 22688 params x 4 B = 90752 B (tied: every parameter)


def test_parameter_counts():
    # a layer: q 32*32 = 1024, k 32*16 = 512, v 512, o 1024, gate/up/down 3 * 32*64 = 6144 -> 9216; x 2 layers
    assert layer_matmul_params(TINY) == 18432
    assert head_params(TINY) == 32 * 128 == 4096
    assert streamed_params(TINY) == TINY.num_params() == 22688  # + embeddings 4096 + norms 2*2*32 + 32
    untied = ModelShape(2, 32, 64, 4, 2, 128, tie_word_embeddings=False)
    assert untied.num_params() == 22688 + 4096
    assert streamed_params(untied) == 22688  # the lookup table is not streamed, the LM head is


def test_prefill_by_hand():
    # B=2 sequences x Lp=4 prompt tokens = 8 tokens
    # projections 2 * 18432 * 8 = 294912; LM head on the last position: 2 * 4096 * 2 = 16384
    # causal attention: 2 * (1+2+3+4 = 10) = 20 pairs * 256 = 5120 -> 316416 FLOPs
    # weights 90752 B + KV written for 8 tokens * 256 B = 2048 -> 92800 B
    assert prefill_cost(TINY, sequences=2, prompt_tokens=4) == Cost(316416, 92800)
    # bf16: the weights and the cache take half the bytes, the FLOPs stay
    assert prefill_cost(TINY, sequences=2, prompt_tokens=4, dtype_bytes=2) == Cost(316416, 92800 / 2)
    # both rows start from one prompt pass (prompt_share=2): 4 tokens -> 147456 + head 8192 + 10 pairs 2560
    # = 158208 FLOPs; weights 90752 + KV 4 * 256 = 1024 -> 91776 B
    assert prefill_cost(TINY, sequences=2, prompt_tokens=4, prompt_share=2) == Cost(158208, 91776)


def test_decode_by_hand():
    # T=3 response tokens: the prefill sampled the first, 2 single-token passes per sequence -> 4 token passes
    # projections + LM head: 2 * (18432 + 4096) * 4 = 180224
    # pass k attends to Lp + k = 5, 6 positions: 11 pairs per sequence, 22 in all * 256 = 5632 -> 185856 FLOPs
    # weights stream per decode step: S - 1 = 2 steps * 90752 = 181504; KV read 22 * 256 = 5632 -> 187136 B
    assert decode_cost(TINY, sequences=2, prompt_tokens=4, response_tokens=3) == Cost(185856, 187136)
    # the longest response sets the lockstep steps: S = 5 -> 4 weight streams, the FLOPs follow the mean
    assert decode_cost(TINY, sequences=2, prompt_tokens=4, response_tokens=3, decode_steps=5) == Cost(
        185856, 4 * 90752 + 5632
    )
    # a one-token response needs no decode pass
    assert decode_cost(TINY, sequences=2, prompt_tokens=4, response_tokens=1) == Cost(0, 0)


def test_forward_and_update_by_hand():
    # 2 sequences sharing one prompt pass (prompt_share=2): 4 prompt + 2 * 3 response = 10 tokens
    # projections 2 * 18432 * 10 = 368640; LM head on 6 response positions 2 * 4096 * 6 = 49152
    # pairs: prompt 1+2+3+4 = 10, each response 3*4 + (1+2+3) = 18, twice -> 46 * 256 = 11776 -> 429568 FLOPs
    # one micro-batch streams the weights once: 90752 B
    shared = dict(sequences=2, prompt_tokens=4, response_tokens=3, prompt_share=2)
    assert forward_cost(TINY, **shared) == Cost(429568, 90752)
    # every sequence its own prompt, 2 micro-batches: 8 + 6 = 14 tokens -> 516096; head 49152;
    # pairs 20 + 36 = 56 -> 14336
    plain = forward_cost(TINY, sequences=2, prompt_tokens=4, response_tokens=3, micro_batches=2)
    assert plain == Cost(516096 + 49152 + 14336, 2 * 90752)
    # update: 3 x the forward's FLOPs = 1288704
    # bytes: weights twice + gradient read and write = 4 * 22688 * 4 B = 363008 per micro-batch,
    # AdamW 7 * 22688 * 4 B = 635264 -> 998272
    assert update_cost(TINY, **shared) == Cost(3 * 429568, 363008 + 635264)
    # half the sequences forward only: 3 x half the forward + one more half = 2 x 429568; the same bytes
    assert update_cost(TINY, **shared, forward_only=0.5) == Cost(2 * 429568, 363008 + 635264)
    assert update_cost(TINY, **shared, forward_only=1.0) == Cost(429568, 363008 + 635264)
    # with no pass for them (their statistics from the rollout): only the trained half's 3 forwards
    assert update_cost(TINY, **shared, forward_only=0.5, forward_only_pass=False) == Cost(1.5 * 429568, 363008 + 635264)
    assert update_cost(TINY, **shared, forward_only=1.0, forward_only_pass=False).flops == 0


def test_floor_takes_the_larger_term_and_phases_add():
    rates = Rates(flops_per_s=1e6, bytes_per_s=1e5)
    pre = floor(Cost(316416, 92800), rates)  # compute 0.316416 s, memory 0.928 s
    assert pre.seconds == pytest.approx(0.928) and pre.bound == "memory"
    both = rollout_floor(TINY, rates, sequences=2, prompt_tokens=4, response_tokens=3)
    # decode: compute 185856 / 1e6 = 0.185856 s, memory 187136 / 1e5 = 1.87136 s
    assert both.seconds == pytest.approx(0.928 + 1.87136)
    assert both.compute_s == pytest.approx(0.316416 + 0.185856)
    fast_memory = floor(Cost(316416, 92800), Rates(flops_per_s=1e5, bytes_per_s=1e6))
    assert fast_memory.seconds == pytest.approx(3.16416) and fast_memory.bound == "compute"


def test_device_rates_floor_uses_the_faster_of_reading_and_copying():
    """The floor's bandwidth is the best the device showed: the faster of a read (sum) and a copy,
    both kept in the result; a floor on the copy rate alone sat above a measured CPU rollout."""
    import workload

    rates = workload.device_rates("cpu", "float32")
    assert rates["read_bytes_per_s"] > 0 and rates["copy_bytes_per_s"] > 0
    assert rates["bytes_per_s"] == max(rates["read_bytes_per_s"], rates["copy_bytes_per_s"])


@pytest.mark.parametrize(
    "lines, passes",
    [((), True), (("train.rollout_entropy=true",), False), (("train.rollout_entropy=false",), True)],
    ids=["written-before-the-key", "rollout-stats", "switched-off"],
)
def test_a_runs_forward_only_groups_cost_a_pass_unless_the_rollout_gave_their_statistics(tmp_path, lines, passes):
    """roofline.py --run: a config.yaml written before train.rollout_entropy existed ran the
    forward-only passes; a later one ran them only with the switch off."""
    import roofline

    from rlvr.config import load_config, to_yaml

    text = to_yaml(load_config("quickstart", list(lines)))
    if not lines:  # as an older rlvr wrote it: no such key
        text = "\n".join(line for line in text.splitlines() if "rollout_entropy" not in line) + "\n"
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(text, encoding="utf-8")
    batch, _, _ = roofline.run_batch(run, prompt_tokens=100.0)
    assert batch["forward_only_pass"] is passes
