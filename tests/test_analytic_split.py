"""The analytic profile's split backward (a zero-bubble schedule's I and W) of full recompute and the
selective options: the parameter groups it counts from a block's structure against torch 2.13's own
grouping of the same family's transformers block (brute force on CPU, tiny widths), and its passes'
work against the fake profile's count of torch's passes on the same tiny block (analytic_split.py,
fake_split.py; docs/framework-facts.md §73, §78)."""

import json
from pathlib import Path

import pytest
import torch

from planner.models import hfmodels
from planner.models.archconfig import from_hf_config
from planner.models.gpus import gpu
from planner.profiler import analytic, analytic_split, analytic_time
from planner.profiler.fake import counting
from planner.profiler.fake_split import split_work, torch_param_groups
from planner.profiler.formulas import Shape
from planner.runtime.recompute import layer_runner
from planner.schema import FileRef

HF = Path(__file__).resolve().parent.parent / "configs" / "hf"
SMALL = ("hidden_size=64", "intermediate_size=128", "num_attention_heads=4", "num_key_value_heads=2",
         "num_hidden_layers=2", "vocab_size=128", "head_dim=16")
MOE = ("num_experts=4", "num_experts_per_tok=2", "moe_intermediate_size=32")
LATENT = ("num_key_value_heads=4", "first_k_dense_replace=0", "n_routed_experts=4", "num_experts_per_tok=2",
          "kv_lora_rank=32", "qk_nope_head_dim=16", "qk_rope_head_dim=8", "v_head_dim=16", "moe_intermediate_size=32")
QWEN2_MOE = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4,
             "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
             "decoder_sparse_step": 1, "mlp_only_layers": []}
SEQ = 16


def _config(name: str, settings: tuple[str, ...] = (), update: dict | None = None) -> dict:
    config = json.loads((HF / f"{name}.json").read_text())
    config.pop("auto_map", None)  # DeepSeek-V2-Lite's: built as transformers' own deepseek_v2
    config.update(update or {})
    return hfmodels.with_settings(config, (*SMALL, *settings))


def _first_block(config: dict):
    build_model, example_batch = hfmodels.model_file(config, seq_len=SEQ)
    torch.manual_seed(0)
    layers = build_model().pipeline_layers()
    (_, embed), (_, block) = layers[0], layers[1]
    return block, embed(example_batch(1)[0]).detach()


CASES = {  # family: (config, settings, update); torch's groups in a comment where the structure says why
    "llama": ("llama-3.2-1b", (), None),  # q, k, v, o, gate, up, down, two norms: 9
    "qwen2": ("qwen2-1.5b", (), None),  # q, k, v each with its bias (one group each): 9
    "qwen3": ("qwen3-0.6b", (), None),  # + q_norm, k_norm: 11
    "mistral": ("mistral-7b", (), None),
    "gemma": ("gemma-2b", (), None),  # (1 + weight) norms: still one group each
    "gemma3_text": ("gemma-3-12b", (), None),  # + q_norm, k_norm and two post-norms: 13
    "smollm3": ("smollm3-3b", ("pad_token_id=null", "no_rope_layers=[1, 0]"), None),  # LLaMA's 9
    "mixtral": ("mixtral-8x7b", ("num_local_experts=4", "num_experts_per_tok=2"), None),  # router, gate_up_proj, down_proj
    "qwen3_moe": ("qwen3-30b-a3b", MOE, None),
    "qwen2_moe": ("qwen2-1.5b", (), QWEN2_MOE),  # + the shared expert's three and its gate: 13
    "deepseek_v2": ("deepseek-v2-lite", LATENT, None),  # q_proj, kv_a, kv_a norm, kv_b, o: 5 + MoE 6 + 2
    "deepseek_v2 q latent": ("deepseek-v2-lite", (*LATENT, "q_lora_rank=24"), None),  # q_a, q_a norm, q_b: 15
    "gpt2": ("gpt2-medium", (), None),  # ln_1, c_attn, c_proj, ln_2, c_fc, c_proj (weight + bias each): 6
}


@pytest.mark.parametrize("family", list(CASES))
def test_the_groups_counted_from_a_blocks_structure_are_torchs(family):
    """Per part (attention module, MLP, the two block norms) and in all, the groups analytic_split counts
    from the Arch the --arch-config reader makes of the config are those torch's stage_backward_input
    makes of the same config's transformers block."""
    name, settings, update = CASES[family]
    config = _config(name, settings, update)
    block, x = _first_block(config)
    groups = torch_param_groups(block, x)
    arch = from_hf_config(config, where=name, name=name)
    counted = analytic_split.block_param_groups(arch, moe=arch.is_moe_layer(0))
    in_mlp = [g for g in groups if any(".mlp." in p or ".block_sparse_moe." in p for p in g)]
    in_attention = [g for g in groups if any(".self_attn." in p or ".attn." in p for p in g)]
    assert (counted["attention"], counted["mlp"], counted["norms"]) == (
        len(in_attention), len(in_mlp), len(groups) - len(in_attention) - len(in_mlp))
    assert sum(counted.values()) == len(groups)


def _works(config: dict, option: str):
    block, x = _first_block(config)
    x = x.requires_grad_(True)
    grad = torch.zeros_like(block(x))
    return split_work(layer_runner(block, option), block, x, grad, counting)


def test_analytic_weight_pass_is_the_fake_counts_on_a_tiny_llama_block():
    """Option none: W's work as counted on torch's weight pass of the same block (FLOPs: the seven
    weight GEMMs; bytes: their .grad adds, 3 x 2 B a parameter, and the two RMSNorm weights' gradients,
    8 B an element of the 16 x 64 rows and 2 x 64 B written each), to the byte. Full: W = none's W + 9
    reruns (torch's groups), I = none's I + 1; the analytic rerun's FLOPs are the fake's (all but the
    down projection)."""
    config = _config("llama-3.2-1b")
    arch = from_hf_config(config, where="llama", name="llama")
    shape = Shape(seq_len=SEQ, micro_batch_size=1)
    weight = analytic_time.block_weight_grad_work(arch, shape)
    none_input, none_weight, _ = _works(config, "none")
    params = sum(p.numel() for p in _first_block(config)[0].parameters())
    assert (weight.flops, weight.bytes) == (none_weight.flops, none_weight.bytes)
    assert weight.bytes == 3 * 2 * params + 2 * (8 * SEQ * 64 + 2 * 64)
    full_input, full_weight, _ = _works(config, "full")
    _, _, rerun = analytic_time.block_work(arch, shape)
    assert full_weight.flops - none_weight.flops == 9 * rerun.flops
    assert full_input.flops - none_input.flops == rerun.flops
    # the MLP checkpointed: torch reruns gate and up (its early stop: not down), once in I, in W once per
    # group of gate, up, down
    mlp_input, mlp_weight, _ = _works(config, "mlp")
    gate_up = 2 * (2 * SEQ * 64 * 128)
    assert (mlp_input.flops - none_input.flops, mlp_weight.flops - none_weight.flops) == (gate_up, 3 * gate_up)


def test_the_analytic_profile_records_full_and_selective_splits():
    """Small Llama under --mfu 0.5 (times are FLOPs at half the peak): full's I = none's I + its rerun,
    W = none's W + 9 reruns; mlp's rerun under torch is gate and up (early stop before down: 2 x 2·T·h·f
    FLOPs, T = 32 tokens), once in I and in W once per group of its 3; core-attn (the attention core: no
    parameter) reruns in I only, attn (the attention module) in I and in W once per group of its 4 (q, k, v,
    o); an option under torch's selective checkpoint (mlp-act) is not split."""
    config = _config("llama-3.2-1b")
    arch = from_hf_config(config, where="llama", name="llama")
    h100 = gpu("h100")
    profile = analytic.analytic_profile(arch, Shape(seq_len=SEQ, micro_batch_size=2), gpu=h100, mfu=0.5,
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    options = {option.name: option for option in profile.layers[1].recompute_options}
    none = options["none"]
    mlp_rerun = 2 * (2 * 32 * 64 * 128) / (h100.bf16_tflops * 1e12 * 0.5) * 1e3
    for name, in_input, in_weight in (("full", options["full"].recompute_ms, 9 * options["full"].recompute_ms),
                                      ("mlp", mlp_rerun, 3 * mlp_rerun),
                                      ("core-attn", options["core-attn"].recompute_ms, 0.0),
                                      ("core-attn,mlp", options["core-attn"].recompute_ms + mlp_rerun, 3 * mlp_rerun),
                                      ("attn", options["attn"].recompute_ms, 4 * options["attn"].recompute_ms),
                                      ("attn,mlp", options["attn"].recompute_ms + mlp_rerun,
                                       4 * options["attn"].recompute_ms + 3 * mlp_rerun)):
        option = options[name]
        assert option.input_grad_ms == pytest.approx(none.input_grad_ms + in_input), name
        assert option.weight_grad_ms == pytest.approx(none.weight_grad_ms + in_weight), name
    assert options["mlp"].recompute_ms == pytest.approx(1.5 * mlp_rerun)  # the option's own: the whole MLP (reentrant)
    assert options["mlp-act"].input_grad_ms is None and options["mlp-act"].weight_grad_ms is None


def test_a_gpt2_mlp_rerun_runs_its_second_matrix_for_the_dropout_after_it():
    """GPT-2's MLP ends in its residual dropout, whose mask is the last tensor it saves (after c_proj):
    torch's rerun runs c_fc and c_proj both (2 x 2·T·h·4h FLOPs), once in I and in W once per group of its
    2, as analytic_split.torch_rerun_ms times it (the whole MLP and the dropout)."""
    config = _config("gpt2-medium", ("n_embd=64", "n_inner=256", "n_head=4"))  # the reader's fields for GPT-2's widths
    none_input, none_weight, _ = _works(config, "none")
    mlp_input, mlp_weight, _ = _works(config, "mlp")
    both = 2 * (2 * SEQ * 64 * 256)
    assert (mlp_input.flops - none_input.flops, mlp_weight.flops - none_weight.flops) == (both, 2 * both)
    arch = from_hf_config(config, where="gpt2", name="gpt2")
    shape = Shape(seq_len=SEQ, micro_batch_size=1)
    assert arch.drops_residual and (arch.hidden_size, arch.intermediate_size) == (64, 256)
    rerun = analytic_split.torch_rerun_ms(arch, shape, gpu("h100"), 0.5, "mlp", 0.0, moe=False)
    assert rerun == pytest.approx(both / (gpu("h100").bf16_tflops * 1e12 * 0.5) * 1e3)
