"""`profile --fake` of a mixture of experts: its routed experts found by structure and recorded
as a measured profile records them (expert parameters, dispatch bytes, what the experts keep),
the routing charged balanced (a fake tensor has no values to route by), and the grouped matmuls
transformers' experts run counted as work."""

import json

import pytest
import torch
from fixtures.cli import run_ok

from planner import io
from planner.profiler import fake, fake_moe
from planner.profiler.roofline import Kernel
from planner.profiler.saved import saved_bytes
from planner.runtime.routing import layer_routing

transformers = pytest.importorskip("transformers")

from planner.models import hfmodels  # noqa: E402

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=256, max_position_embeddings=128)
# tests/test_hf_config.py's mixtures of experts: 4 routed experts, top 2
FAMILIES = {
    "mixtral": dict(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2, **SMALL),
    "qwen2_moe": dict(model_type="qwen2_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=64, **SMALL),
    "phimoe": dict(model_type="phimoe", num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=False,
                   pad_token_id=None, **SMALL),
    "qwen3_moe": dict(model_type="qwen3_moe", head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                      **SMALL),
    "olmoe": dict(model_type="olmoe", num_experts=4, num_experts_per_tok=2, pad_token_id=None, tie_word_embeddings=False,
                  **SMALL),
    "granitemoe": dict(model_type="granitemoe", num_local_experts=4, num_experts_per_tok=2, embedding_multiplier=12.0,
                       logits_scaling=8.0, **SMALL),
    # latent attention, 4 routed experts in 2 groups (one group chosen), one shared; every layer MoE
    # (first_k_dense_replace 0), so layers.0 is one
    **{family: dict(model_type=family, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=2,
                    topk_group=1, first_k_dense_replace=0, moe_intermediate_size=32, kv_lora_rank=16, q_lora_rank=24,
                    qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, tie_word_embeddings=False,
                    **{**SMALL, "num_key_value_heads": 4})  # latent attention: as many K/V heads as query heads
       for family in ("deepseek_v2", "deepseek_v3")},
}
TOKENS = 2 * 16  # two sequences of 16


def _first_block(config: dict, *, on_meta: bool):
    """layers.0 of the config's model in bf16 and its input: real, or built on meta and made fake
    (as `profile --fake` makes them), with the fake mode to run it under."""
    build_model, _ = hfmodels.model_file(config, seq_len=16)
    torch.manual_seed(0)
    if not on_meta:
        return build_model().to(torch.bfloat16).train().layers[0], torch.randn(2, 16, 64).bfloat16(), None
    with torch.device("meta"):
        model = build_model()
    model.to(torch.bfloat16).train()
    mode = fake.new_mode()
    with mode:
        fake.fake_module(model, mode)
        x = fake.fake_tensor(torch.empty(2, 16, 64, dtype=torch.bfloat16, device="meta"), mode)
    return model.layers[0], x, mode


def _kept(block, x) -> int:
    return saved_bytes([("layers.0", block)], x.requires_grad_(), x, lambda out, target: out.float().sum()).act_bytes[0]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_fake_block_records_the_experts_a_measured_one_records(family):
    """Expert parameters, dispatch bytes, what the experts keep and the whole block's kept bytes equal
    the real block's: transformers' dropless experts compute every token copy whatever the routing, so
    routing imbalance moves none of them; only which expert gets which copy is the expectation."""
    block, x, _ = _first_block(FAMILIES[family], on_meta=False)
    with torch.no_grad():
        real = layer_routing(block, x)
    real_kept = _kept(block, x.clone())
    block, x, mode = _first_block(FAMILIES[family], on_meta=True)
    with mode:
        fake_record = fake_moe.fake_routing(block, x)
        fake_kept = _kept(block, x.detach().clone())
    assert fake_record.expert_param_count == real.expert_param_count > 0
    assert fake_record.a2a_bytes == real.a2a_bytes == TOKENS * 2 * 64 * 2  # copies x hidden x bf16
    assert fake_record.expert_act_bytes == real.expert_act_bytes > 0
    # Phi-3.5-MoE's and DeepSeek-V3's routers save tensors in graph branches that only pick indices and are freed
    # at once; counted, they made both blocks' kept bytes vary run to run (saved.py now counts what is alive)
    assert fake_kept == real_kept
    assert sum(real.routed_tokens) == TOKENS * 2 and fake_record.routed_tokens == [16, 16, 16, 16]


def test_balanced_spreads_the_copies_a_whole_token_apart():
    assert fake_moe.balanced(10, 4) == [3, 3, 2, 2]
    assert fake_moe.balanced(64, 8) == [8] * 8


def test_grouped_matmuls_count_their_flops_in_every_layout():
    """torch's counter has no formula for aten._grouped_mm: 2 x rows x contracted x columns by hand."""
    assert fake_moe.grouped_mm_flops((32, 64), (4, 64, 256)) == 2 * 32 * 64 * 256  # tokens x experts' weights
    assert fake_moe.grouped_mm_flops((64, 32), (32, 256)) == 2 * 64 * 32 * 256  # weight gradient, groups along 32
    assert fake_moe.grouped_mm_flops((4, 8, 64), (64, 96)) == 2 * 8 * 64 * 96
    assert fake_moe.grouped_mm_flops((4, 8, 64), (4, 64, 96)) == 2 * 4 * 8 * 64 * 96


def test_a_grouped_matmul_runs_as_one_matmul_per_expert_forward_and_backward():
    """Forward 2·S·K·N, backward twice that (the input's and the weights' gradients), each pass one
    kernel per expert at an equal share (balanced)."""
    tokens, hidden, width, experts = 32, 64, 96, 4
    a = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    b = torch.randn(experts, width, hidden, dtype=torch.bfloat16, requires_grad=True)  # as transformers stores them
    offs = torch.tensor([8, 16, 24, 32], dtype=torch.int32)
    with fake.counting() as done:
        out = torch._grouped_mm(a, b.transpose(-2, -1), offs=offs)
        forward = done()
        out.backward(torch.ones_like(out))  # a whole gradient: the CPU kernel refuses sum()'s expanded one
        both = done()
    one = 2 * tokens * hidden * width
    assert forward.flops == one and both.flops == 3 * one
    assert forward.kernels == ((Kernel("matmul", one // experts), experts),)
    assert (both - forward).kernels == ((Kernel("matmul", one // experts), 2 * experts),)


def test_a_fake_mixtral_profile_carries_its_experts_and_plans_expert_parallelism(tmp_path):
    """profile --fake of a transformers Mixtral: its MoE layers carry the measured profile's record
    (byte for byte where routing does not enter), routing charged balanced and said so, the experts'
    matmuls counted, and `solve --ep` plans it and says what balanced routing leaves unweighed."""
    config = tmp_path / "mixtral.json"
    # one decoder layer, not two: both profiles' time grows with the layers, and a second MoE layer
    # is the first's kind, held to the same figures
    config.write_text(json.dumps({**FAMILIES["mixtral"], "num_hidden_layers": 1}))
    args = ("--hf-config", config, "--seq-len", "16", "--micro-batch-size", "2", "--dtype", "bfloat16")
    run_ok("profile", *args, "--threads", "1", "--repeats", "1", "--warmup", "0", "--out", tmp_path / "m.json")
    run_ok("profile", *args, "--fake", "--device", "cpu", "--out", tmp_path / "f.json")
    measured, faked = io.load_profile(tmp_path / "m.json"), io.load_profile(tmp_path / "f.json")
    for mine, theirs in zip(faked.layers, measured.layers, strict=True):
        for key in ("act_bytes", "transient_bytes", "param_count", "expert_param_count", "a2a_bytes", "expert_act_bytes",
                    "expert_transient_bytes"):
            assert getattr(mine, key) == getattr(theirs, key), (mine.name, key)
        assert {o.name: o.kept_bytes for o in mine.recompute_options} == \
            {o.name: o.kept_bytes for o in theirs.recompute_options}, mine.name
        assert sum(mine.routed_tokens) == sum(theirs.routed_tokens)
    assert [layer.name for layer in faked.layers][1:-1] == ["layers.0"]
    moe = faked.layers[1]
    assert moe.expert_param_count == 4 * 3 * 64 * 128 and moe.routed_tokens == [16] * 4
    assert "charged balanced" in faked.assumptions["routing"]
    # layer 0's forward by hand: q, k, v, o; attention's two matmuls; the router; 64 copies through the experts
    attention = 2 * TOKENS * 64 * (64 + 32 + 32 + 64) + 4 * 2 * 4 * 16 * 16 * 16
    router, experts = 2 * TOKENS * 64 * 4, 2 * 2 * TOKENS * 64 * 3 * 128
    assert faked.assumptions["flops"]["layers.0"]["forward"] == attention + router + experts
    result = run_ok("solve", "--profile", tmp_path / "f.json", "--stages", "2", "--dp", "2", "--ep", "2",
                    "--out", tmp_path / "plan.yaml")
    assert "a --fake profile has no routing to weigh that against" in result.output


def test_a_fake_mixture_of_experts_in_float32_is_refused_in_one_sentence(tmp_path):
    """torch's fake kernel of the grouped matmul takes bfloat16 only: a float32 --fake run failed inside the
    first MoE layer with "Expected inputs of BF16 type", blamed on the chain's contract."""
    from fixtures.cli import run

    config = tmp_path / "mixtral.json"
    config.write_text(json.dumps(FAMILIES["mixtral"]))
    result = run("profile", "--hf-config", config, "--seq-len", "16", "--fake", "--device", "cpu",
                 "--out", tmp_path / "f.json")
    assert result.exit_code != 0
    assert "fake kernel takes bfloat16 only (torch 2.13), not --dtype float32: use --dtype bfloat16" in result.output
    assert not (tmp_path / "f.json").exists() and not (tmp_path / "hf_mixtral.py").exists()
