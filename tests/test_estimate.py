"""The memory estimate (rlvr/estimate/): its arithmetic by hand on a tiny shape, the parameter count
against instantiated models, the model shape from config.json or the built-in table, and LoRA."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from rlvr.config import load_config
from rlvr.cpu import packed
from rlvr.errors import UserError
from rlvr.estimate import (
    CPU_RUNTIME_BYTES,
    KNOWN_MODELS,
    ModelShape,
    autocast_weight_copies,
    estimate,
    fused_head_bytes,
    model_shape,
    shape_from_config,
)

# layers 2, hidden 32, intermediate 64, 4 heads of 8, 2 kv heads (kv_dim 16), vocab 128, tied
TINY = ModelShape(2, 32, 64, 4, 2, 128, tie_word_embeddings=True, model_type="gemma2")
"""A tiny shape whose update takes the full logits (gemma2 post-processes them: no fused head)."""

TINY_RUN = [
    "model.dtype=float32",
    "rollout.dtype=float32",
    "model.autocast_bf16=false",
    "train.prompts_per_step=2",
    "rollout.samples_per_prompt=2",
    "train.micro_batch_seqs=4",
    "rollout.max_new_tokens=8",
    "data.max_prompt_tokens=16",
    "eval.batch_prompts=2",
    "algo.kl_coef=0.1",
]


def _items(est):
    return {i.name: i.bytes for i in est.items}


def test_tiny_shape_arithmetic_by_hand(monkeypatch):
    monkeypatch.setattr(packed, "packed_training_pays", lambda: True)  # an AVX-512 CPU: the update packed too
    # embeddings 128*32 = 4096 (tied: no LM head)
    # a layer: q 32*32 = 1024, k 32*16 = 512, v 512, o 1024, gate/up/down 3 * 32*64 = 6144, 2 norms 64 -> 9280
    # total 4096 + 2 * 9280 + final norm 32 = 22688
    assert TINY.num_params() == 22688
    est = estimate(load_config(None, TINY_RUN), TINY, device="cpu")
    got = _items(est)
    assert got["parameters"] == 22688 * 4 == 90752
    assert got["rollout copy"] == 0  # float32 rollout shares the float32 weights
    assert got["reference"] == 90752  # kl_coef 0.1: a second copy
    assert got["AdamW state"] == 2 * 90752 == 181504
    assert got["gradients"] == 90752
    # shared prompt: G=2 divides the micro-batch of 4 -> 2 prompts of 16 tokens + 4 responses of 8 = 64 tokens
    # saved: layers 2 * 64 tokens * (9*32 + 4*64 = 544) * 4 B = 278528
    #   + repeated prompt key/values 2 layers * 4 rows * 16 * 2 * (32 + 16) * 4 B = 49152 -> 327680
    # logits 4 rows * 8 * 128 * (2 * 4 + 2 * 4) B = 65536; on a CPU x 1.2: int(1.2 * 393216) = 471859
    assert got["activations"] == 471859
    # KV: rows min(64, 4 seqs) = 4 (the evaluation's 2 are fewer) x (16 + 8) tokens
    #   2 (K, V) * 2 layers * 16 kv dims * 96 tokens * 4 B = 24576
    assert got["KV cache"] == 24576
    assert got["runtime"] == CPU_RUNTIME_BYTES
    # packed linears (model.packed_weights=auto on a CPU): 2 layers * (1024 + 512 + 512 + 1024 + 6144) + LM head
    #   128 * 32 = 22528 weights * 4 B = 90112, twice: W (shared by the float32 rollout and update) and W^T;
    #   + rollout.lean_decode's [q; k; v]: 2 layers * (1024 + 512 + 512) * 4 B = 16384
    assert got["packed weights"] == 2 * 90112 + 16384
    # resident runtime + 90752 + 196608 + 90752 + 181504; update 90752 + 471859 > rollout 24576
    assert est.total == CPU_RUNTIME_BYTES + 559616 + 562611
    unpacked = _items(estimate(load_config(None, [*TINY_RUN, "model.packed_weights=false"]), TINY, device="cpu"))
    assert unpacked["packed weights"] == 0
    no_lean = _items(estimate(load_config(None, [*TINY_RUN, "rollout.lean_decode=false"]), TINY, device="cpu"))
    assert no_lean["packed weights"] == 2 * 90112
    monkeypatch.setattr(packed, "packed_training_pays", lambda: False)  # AVX2: sampling packed, the update plain
    assert _items(estimate(load_config(None, TINY_RUN), TINY, device="cpu"))["packed weights"] == 90112 + 16384
    # head_dim 64, 2 query heads a KV head: where the compiled decode kernels build, lean decode keeps
    # every linear weight once more in their layout instead of the [q; k; v] copy
    from rlvr.cpu import kernels as kernel

    d64 = ModelShape(2, 32, 64, 4, 2, 128, tie_word_embeddings=True, head_dim=64)
    # 2 layers * (32*256 + 2 * 32*128 + 256*32 + 3 * 32*64) + 128*32 = 2 * 30720 + 4096 = 65536 weights
    lean_extra = 65536 * 4 if kernel.load() is not None else 2 * (8192 + 4096 + 4096) * 4
    assert _items(estimate(load_config(None, TINY_RUN), d64, device="cpu"))["packed weights"] == 65536 * 4 + lean_extra
    monkeypatch.setenv("RLVR_DECODE_KERNELS", "0")
    kernel.load.cache_clear()
    try:
        assert (
            _items(estimate(load_config(None, TINY_RUN), d64, device="cpu"))["packed weights"]
            == 65536 * 4 + 2 * 16384 * 4
        )
    finally:
        kernel.load.cache_clear()


def test_no_reference_without_kl_and_no_runtime_on_cuda():
    est = estimate(load_config(None, [*TINY_RUN, "algo.kl_coef=0", "rollout.static_decode=false"]), TINY, device="cuda")
    got = _items(est)
    assert got["reference"] == 0 and "runtime" not in got
    assert est.total == 90752 + 181504 + 90752 + 550502


def test_the_static_decode_cache_is_resident_through_the_update():
    """On CUDA the static decode keeps one cache for the run (its CUDA graphs keep their addresses), so
    it stays allocated through the update: counted resident, sized by whole groups of rollout.batch_seqs
    and the longest prompt + response of rollout or evaluation, rounded up to 256 positions."""
    run = [*TINY_RUN, "rollout.batch_seqs=5", "eval.max_new_tokens=24"]
    est = estimate(load_config(None, run), TINY, device="cuda")  # rollout.static_decode=auto: on for CUDA
    got, phase = _items(est), {i.name: i.phase for i in est.items}
    # rows: whole groups of G=2 in batch_seqs 5 -> 4; capacity: 16 prompt + max(8, 24) new = 40 -> 256
    # cache 2 (K, V) * 2 layers * 16 kv dims * 4 rows * 256 * 4 B (float32 rollout) = 262144
    #   + bool mask 4 * 256 * 1 = 1024 + int64 response 4 * 24 * 8 = 768 -> 263936
    assert got["static KV cache"] == 263936 and phase["static KV cache"] == "resident"
    assert got["KV cache"] == 0  # the rollout holds no other cache
    # the compiled step's CUDA-graph pool, resident: 4 rows * (4 float32 [rows, 128 vocab] = 2048
    #   + one layer's activations 4 * (32 hidden + 64 intermediate) * 4 B = 1536) = 14336
    assert got["CUDA-graph pool"] == 14336 and phase["CUDA-graph pool"] == "resident"
    # resident: parameters 90752 + reference 90752 + AdamW 181504 + cache 263936 + pool; update: 90752 + 550502
    assert est.total == 90752 + 90752 + 181504 + 263936 + 14336 + 90752 + 550502
    line = next(l for l in est.lines() if "static KV cache" in l)
    assert "resident" in line and "4 rows x 256 positions (16 prompt + 24 response" in line, line
    # past 256 positions: 250 + 24 = 274 -> 512; batch_seqs 1 < G: one group's 2 rows
    # 2 * 2 * 16 * 2 rows * 512 * 4 B = 262144 + mask 2 * 512 * 1 = 1024 + response 2 * 24 * 8 = 384
    long = estimate(
        load_config(None, [*run, "data.max_prompt_tokens=250", "rollout.batch_seqs=1"]), TINY, device="cuda"
    )
    assert _items(long)["static KV cache"] == 263552
    # bf16 rollout: the cache's keys and values at 2 B, the mask and response unchanged: 131072 + 1024 + 768
    bf16 = estimate(load_config(None, [*run, "rollout.dtype=bfloat16"]), TINY, device="cuda")
    assert _items(bf16)["static KV cache"] == 132864


@pytest.mark.parametrize(
    "overrides, device, static",
    [
        ([], "cpu", False),  # auto: dynamic on a CPU
        (["rollout.static_decode=true"], "cpu", True),  # forced: static (eager) on a CPU too
        (["rollout.static_decode=false"], "cuda", False),
        (["rollout.lean_decode=true"], "cuda", False),  # lean decode takes auto's place
    ],
)
def test_the_static_decode_cache_line_only_where_the_run_decodes_statically(overrides, device, static):
    est = estimate(load_config(None, [*TINY_RUN, *overrides]), TINY, device=device)
    table = "\n".join(est.lines())
    assert ("static KV cache" in table) is static, table
    got = _items(est)
    if not static:  # the dynamic decode's cache lives during the rollout only: 4 rows x 24 tokens, float32
        assert got["KV cache"] == 24576 and "static KV cache" not in got
        assert next(i.phase for i in est.items if i.name == "KV cache") == "rollout"


def test_bf16_rollout_copy_and_autocast():
    cfg = load_config(None, [*TINY_RUN, "rollout.dtype=bfloat16", "model.autocast_bf16=true"])
    got = _items(estimate(cfg, TINY, device="cpu"))
    assert got["rollout copy"] == 22688 * 2
    assert got["KV cache"] == 24576 // 2
    # saved 2 * 64 * 544 * 3.3 + 49152 / 2 (bf16 key/values) + 22688 * 2 (autocast's bf16 weights)
    # logits 4 * 8 * 128 * (2 * 2 + 2 * 4) = 49152
    assert got["activations"] == int(1.2 * (2 * 64 * 544 * 3.3 + 24576 + 45376 + 49152))


def test_gradient_checkpointing_saves_layer_inputs():
    cfg = load_config(None, [*TINY_RUN, "model.gradient_checkpointing=true"])
    got = _items(estimate(cfg, TINY, device="cpu"))
    # no shared prompt under checkpointing: 4 rows * (16 + 8) = 96 tokens
    # layer inputs 2 * 96 * 32 * 4 B + one layer recomputed 96 * 544 * 4 B, + logits 65536
    assert got["activations"] == int(1.2 * (2 * 96 * 32 * 4 + 96 * 544 * 4 + 65536))


def test_lora_counts_adapter_params_and_no_reference():
    cfg = load_config(None, TINY_RUN)
    object.__setattr__(cfg.model, "lora", SimpleNamespace(rank=4, target_modules=["q_proj", "v_proj"]))
    est = estimate(cfg, TINY, device="cpu")
    got = _items(est)
    # per layer 4 * (32 + 32) for q + 4 * (32 + 16) for v = 448; 2 layers -> 896 trainable
    assert est.trainable == 896
    assert got["gradients"] == 896 * 4 and got["AdamW state"] == 2 * 896 * 4
    assert got["reference"] == 0  # the base with the adapter off
    assert got["parameters"] == 90752
    with pytest.raises(UserError, match="target_modules"):
        TINY.lora_params(4, ["c_attn"])


def test_lora_under_autocast_saves_the_frozen_weights_copies_per_pass():
    # autocast caches the bf16 cast of a weight that requires grad only: full fine-tuning N x 2 once;
    # LoRA's frozen base is cast (and saved) by each forward pass: the shared prompt's second pass
    # adds the layers' projections again, 2 layers x 9216 (q 1024, k 512, v 512, o 1024, gate/up/down 6144)
    copies = dict(lora_params=896, passes=2, checkpointed=False)
    assert autocast_weight_copies(TINY, lora_params=0, passes=2, checkpointed=False) == 22688 * 2
    assert autocast_weight_copies(TINY, **copies) == (22688 + 2 * 9216 + 896) * 2 == 84032
    assert autocast_weight_copies(TINY, **{**copies, "passes": 1}) == (22688 + 896) * 2
    # checkpointed: the LM head (vocab 128 x hidden 32) and the recomputed layer's projections
    assert autocast_weight_copies(TINY, **{**copies, "checkpointed": True}) == (128 * 32 + 9216 + 896) * 2
    cfg = load_config(None, [*TINY_RUN, "model.autocast_bf16=true"])  # G=2 shares the prompt in micro-batches of 4
    full = _items(estimate(cfg, TINY, device="cpu"))["activations"]
    object.__setattr__(cfg.model, "lora", SimpleNamespace(rank=4, target_modules=["q_proj", "v_proj"]))
    adapted = _items(estimate(cfg, TINY, device="cpu"))["activations"]
    assert abs((adapted - full) - 1.2 * (84032 - 22688 * 2)) <= 1


@pytest.mark.parametrize(
    "model_type, extra",
    [
        ("llama", {}),
        ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": False}),
        ("qwen2", {"tie_word_embeddings": False}),
    ],
)
def test_param_count_equals_the_instantiated_model(model_type, extra):
    from transformers import AutoConfig, AutoModelForCausalLM

    values = dict(
        num_hidden_layers=2,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=100,
        **extra,
    )
    config = AutoConfig.for_model(model_type, **values)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    shape = shape_from_config({"model_type": model_type, **config.to_dict()}, "config.json")
    assert shape.num_params() == sum(p.numel() for p in model.parameters())


def test_known_qwen_shapes_match_published_counts():
    # Qwen's model cards: 0.49B, 1.54B, 7.61B parameters
    assert KNOWN_MODELS["Qwen/Qwen2.5-0.5B"].num_params() == 494_032_768
    assert KNOWN_MODELS["Qwen/Qwen2.5-1.5B"].num_params() == 1_543_714_304
    assert KNOWN_MODELS["Qwen/Qwen2.5-7B"].num_params() == 7_615_616_512


def test_model_shape_sources(tmp_path, tiny_model):
    shape, source = model_shape(str(tiny_model))
    assert shape.num_hidden_layers == 2 and source.endswith("config.json")
    only_config = tmp_path / "cfg_only"
    only_config.mkdir()
    (only_config / "config.json").write_text((tiny_model / "config.json").read_text())
    assert model_shape(str(only_config))[0] == shape  # config.json alone is enough
    shape, source = model_shape("models/Qwen2.5-7B-Instruct")  # not here: the table, by its last part
    assert shape == KNOWN_MODELS["Qwen/Qwen2.5-7B"] and "Qwen/Qwen2.5-7B" in source
    with pytest.raises(UserError, match="not a known architecture"):
        model_shape(str(tmp_path / "nope"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "gpt2", "n_layer": 2}')
    with pytest.raises(UserError, match="num_hidden_layers"):
        model_shape(str(bad))


def test_the_prompt_length_read_from_the_data_replaces_the_assumed_one():
    """A files task assumed 512-token prompts (+74 % on a GPU run); the trainer and `rlvr estimate` pass the
    data's longest rendered prompt instead, and the activations and KV cache follow it."""
    from rlvr.estimate import data_prompt_tokens

    cfg = load_config(None, [o for o in TINY_RUN if not o.startswith("data.max_prompt_tokens")])  # assumes 128
    rows = [{"prompt_tokens": n} for n in (40, 90, 61)]
    prompt = data_prompt_tokens(rows)
    assert prompt == (90, "the longest of the 3 training prompts, as the tokenizer renders them")
    assumed, read = estimate(cfg, TINY, device="cpu"), estimate(cfg, TINY, device="cpu", prompt=prompt)
    a, r = ({i.name: i for i in e.items} for e in (assumed, read))
    assert "(90 prompt +" in r["activations"].how and r["activations"].bytes < a["activations"].bytes
    assert r["KV cache"].bytes < a["KV cache"].bytes
    assert (
        read.notes[0] == "prompt length 90 tokens: the longest of the 3 training prompts, as the tokenizer renders them"
    )


def test_a_run_that_does_not_fit_the_gpu_is_refused_with_the_keys_that_shrink_it():
    from rlvr.estimate import GiB, memory_check

    est = estimate(load_config(None, [*TINY_RUN, "algo.kl_coef=0.1"]), TINY, device="cuda")
    memory_check(est, est.total, "GPU 0")  # fits exactly: no error
    with pytest.raises(UserError) as err:
        memory_check(est, est.total - 1, "NVIDIA H100 (cuda:0)")
    line = str(err.value)
    assert line.startswith(f"this run needs about {est.total / GiB:.1f} GiB but NVIDIA H100 (cuda:0) has")
    assert "train.skip_memory_check=true" in line and "\n" not in line
    largest = sorted((i for i in est.items if i.bytes), key=lambda i: -i.bytes)
    assert any(
        k in line for k in ("model.lora.rank", "train.micro_batch_seqs", "offload.reference", "rollout.batch_seqs")
    )
    assert largest[0].name in line or largest[0].name == "runtime"


def test_a_run_whose_static_decode_cache_does_not_fit_names_what_lowers_it():
    from rlvr.estimate import memory_check

    # 64 rows x 512 positions: the static cache (8.4 MB) dwarfs the tiny model's weights
    est = estimate(load_config(None, [*TINY_RUN, "data.max_prompt_tokens=300"]), TINY, device="cuda")
    with pytest.raises(UserError) as err:
        memory_check(est, est.total - 1, "GPU 0")
    line = str(err.value)
    assert line.count("static KV cache") == 1 and "rollout.batch_seqs or rollout.max_new_tokens" in line, line
    assert "rollout.static_decode=false" in line, line


def test_rlvr_estimate_reads_the_prompt_lengths_from_the_data(tiny_dir, capsys):
    from rlvr.cli import main

    assert main(["estimate", f"model.path={tiny_dir}", "data.template=plain", "data.train_size=50"]) == 0
    out = capsys.readouterr().out
    assert "training prompts, as the tokenizer renders them" in out and "assumed" not in out
    assert main(["estimate", "model.path=/nonexistent/model"]) in (0, 2)


def test_load_peak_and_host_ram_per_node_of_the_7b_fsdp_preset():
    """Sharded, rank 0 alone reads the weights: 8 workers on a node need at most 64 GiB of host RAM."""
    from rlvr.estimate import GPU_HOST_RUNTIME_BYTES, load_memory

    cfg = load_config("r1_zero_qwen25_7b", [])
    shape = KNOWN_MODELS["Qwen/Qwen2.5-7B"]
    N = shape.num_params()
    est = estimate(cfg, shape, device="cuda")
    items, load = _items(est), load_memory(cfg, est)
    # a GPU never holds the whole fp32 policy: its shards, the reference's, the bf16 rollout copy, and
    # the one whole fp32 tensor being broadcast or gathered (the embeddings, 152064 x 3584)
    embeddings = 152064 * 3584 * 4
    assert load.device_peak == items["parameters"] + items["reference"] + items["rollout copy"] + embeddings
    assert load.device_peak < N * 4 and load.device_peak < est.total
    # rank 0 reads the whole fp32 policy into host memory; the others read nothing (the preset writes
    # its checkpoints in the step: nothing staged in host memory) and save_hf is auto, off at 7B
    assert not cfg.distributed.async_save
    assert load.host_worker == GPU_HOST_RUNTIME_BYTES + N * 4 and load.host_other == GPU_HOST_RUNTIME_BYTES
    assert load.workers_per_node == 8 and load.host_node == load.host_worker + 7 * load.host_other
    assert load.host_node <= 64 * 2**30, load.host_node / 2**30
    text = "\n".join(load.lines())
    for line in ("load peak", "host RAM rank 0", "host RAM others", "host RAM / node", "rank 0 + 7 others on a node"):
        assert line in text, text
    # a background checkpoint stages every worker's shards of the policy and AdamW state in host RAM
    staged_cfg = load_config("r1_zero_qwen25_7b", ["distributed.async_save=true"])
    staged = load_memory(staged_cfg, estimate(staged_cfg, shape, device="cuda"))
    shards = items["parameters"] + items["AdamW state"]
    assert staged.host_other == GPU_HOST_RUNTIME_BYTES + shards and staged.host_worker == load.host_worker
    assert staged.host_node == load.host_node + 7 * shards > 64 * 2**30


def test_unsharded_workers_each_read_the_whole_policy():
    from rlvr.estimate import GPU_HOST_RUNTIME_BYTES, load_memory

    cfg = load_config("r1_zero_qwen25_7b", ["distributed.strategy=ddp", "model.lora.rank=8"])
    est = estimate(cfg, KNOWN_MODELS["Qwen/Qwen2.5-7B"], device="cuda")
    load = load_memory(cfg, est)
    assert load.others == load.host_worker >= GPU_HOST_RUNTIME_BYTES + est.params * 4
    assert load.host_node == 8 * load.host_worker and "host RAM others" not in "\n".join(load.lines())


def test_a_background_checkpoint_stages_each_workers_shards_in_host_ram():
    from rlvr.estimate import load_memory

    fsdp = [*TINY_RUN, "train.micro_batch_seqs=2", "distributed.backend=ray", "distributed.num_workers=2"]
    fsdp.append("distributed.strategy=fsdp")
    for overrides, staged in ((fsdp, True), ([*fsdp, "distributed.async_save=false"], False)):
        cfg = load_config(None, overrides)
        est = estimate(cfg, TINY, device="cpu")
        items, load = _items(est), load_memory(cfg, est)
        shards = items["parameters"] + items["AdamW state"] if staged else 0  # 1/2 of the fp32 weights and AdamW
        # rank 0 reads the whole model beside its shards; the others hold no more than their shards,
        # the rollout copy and one whole tensor
        assert load.host_worker == max(est.total, load.device_peak) + shards
        assert load.host_other <= load.host_worker and load.host_other >= est.total + shards
        assert load.workers_per_node == 2
        assert load.host_node == load.host_worker + load.host_other + items["rollout copy"]  # save_hf


def test_one_cpu_process_needs_its_training_peak_in_host_ram():
    from rlvr.estimate import load_memory

    est = estimate(load_config(None, TINY_RUN), TINY, device="cpu")
    load = load_memory(load_config(None, TINY_RUN), est)
    assert load.workers_per_node == 1 and load.host_node == load.host_worker == max(est.total, load.device_peak)


def test_the_fused_head_counts_tiles_and_gradients_not_the_logits():
    """A Llama-type model's update fuses the LM head with the log-probs (issue 37): the activations count
    :func:`fused_head_bytes`, not the [b, T, V] logits and their float32 copies."""
    fused = dataclasses.replace(TINY, model_type="llama")
    cfg = load_config(None, TINY_RUN)
    # 4 rows x 8 response tokens = 32 tokens, V 128, H 32: logits 32 * 128 * 4 = 16384 B (kept: small),
    # tiles 32 * 128 * (4 + 4) = 32768, hidden-state gradient 32 * 32 * 4 = 4096, head gradient 128 * 32 * 4 = 16384
    assert fused_head_bytes(32, 128, 32, autocast=False, head_trains=True) == 16384 + 32768 + 4096 + 16384
    # under autocast the kept logits are the bf16 product (half), beside a third, bf16 tile
    assert fused_head_bytes(32, 128, 32, autocast=True, head_trains=True) == 8192 + 40960 + 4096 + 16384
    plain, fast = _items(estimate(cfg, TINY, device="cpu")), _items(estimate(cfg, fused, device="cpu"))
    # the same saved activations (327680 B, see the by-hand test), the log-probs' share 69632 B instead of 65536
    assert plain["activations"] == int(1.2 * (327680 + 65536))
    assert fast["activations"] == int(1.2 * (327680 + 69632))
    # a 151,936-word vocabulary and 8 x 512 response tokens: the logits (2.3 GiB in float32) are not kept
    big = fused_head_bytes(8 * 512, 151936, 896, autocast=True, head_trains=False)
    assert big == 1024 * 16384 * 10 + 8 * 512 * 896 * 4
    assert big < 8 * 512 * 151936 * 4 / 10


def test_a_cpu_run_past_the_available_ram_gets_one_warning_line():
    from rlvr.estimate import GiB, available_ram, ram_warning

    est = estimate(load_config(None, list(TINY_RUN)), TINY, device="cpu")
    assert ram_warning(est, est.total) is None and ram_warning(est, None) is None  # fits, or RAM unknown
    line = ram_warning(est, est.total // 2)
    assert line.startswith(f"warning: this run may need up to {est.total / GiB:.1f} GiB") and "\n" not in line
    assert "train.micro_batch_seqs" in line or "model.lora.rank" in line, line
    ram = available_ram()  # Linux: /proc/meminfo's MemAvailable
    assert ram is None or 0 < ram < 2**50


def test_the_estimate_counts_the_bf16_micro_batch_where_training_autocasts():
    passes = ["train.prompts_per_step=4", "train.micro_batch_seqs=2", "train.micro_batch_seqs_bf16=8"]  # 8 seqs
    on = estimate(load_config(None, [*TINY_RUN, *passes, "model.autocast_bf16=true"]), TINY, device="cpu")
    off = estimate(load_config(None, [*TINY_RUN, *passes, "model.autocast_bf16=false"]), TINY, device="cpu")
    act = lambda e: next(i for i in e.items if i.name == "activations")  # noqa: E731
    assert "micro-batch 8 seqs" in act(on).how and "micro-batch 2 seqs" in act(off).how


def test_the_updates_repeated_keys_and_values_are_counted_where_sdpa_makes_them():
    """Issue 61 item 4: sdpa given a mask repeats each layer's keys and values to every query head and
    backward keeps the copies (two of the nine hidden-sized elements per token and layer); packed rows on
    CUDA attend with no mask, where the grouped-query kernels keep the unrepeated kv_dim instead."""
    packed = [*TINY_RUN, "train.micro_batch_tokens=48", "train.shared_prompt_forward=false"]
    rows = estimate(load_config(None, TINY_RUN), TINY, device="cuda")  # row micro-batches: a padding mask
    cuda = estimate(load_config(None, packed), TINY, device="cuda")
    cpu = estimate(load_config(None, packed), TINY, device="cpu")
    line = lambda est: next(l for l in est.lines() if l.lstrip().startswith("activations"))  # noqa: E731
    assert "repeated per query head" in line(cpu) and "repeated per query head" in line(rows), line(rows)
    assert "unrepeated" in line(cuda), line(cuda)
    # CUDA's packed update: 48 tokens x 2 layers x 2 (K, V) x (32 hidden - 16 kv dims) x 4 B fewer, x 1.4;
    # the same count on a CPU, whose factor is 1.2
    saved = 48 * 2 * 2 * (32 - 16) * 4
    assert abs(_items(cpu)["activations"] / 1.2 - _items(cuda)["activations"] / 1.4 - saved) <= 2
