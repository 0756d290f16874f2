"""The analytic profile's split backward bytes (analytic_split.split_bytes; docs/published-runs.md §67.fakesplit):
what torch 2.13's stage_backward_input leaves the weight pass (each parameter group's saved output gradient) by
hand and against torch's own split of the same family's transformers block (splitbackward.split_per_option, the
measured profiler's function, on the CPU in bfloat16), and the passes' peaks and the carry at or above torch's.
Before, an analytic profile recorded none of them: a ZB / ZBV plan from it charged nothing for the two passes."""

import json
from pathlib import Path

import pytest
import torch

from planner.models import hfmodels
from planner.models.archconfig import from_hf_config
from planner.models.gpus import gpu
from planner.profiler import analytic, analytic_split
from planner.profiler.formulas import Shape
from planner.profiler.splitbackward import split_per_option
from planner.profiler.storages import StorageTracker
from planner.schema import FileRef

HF = Path(__file__).resolve().parent.parent / "configs" / "hf"
TINY = ("hidden_size=64", "intermediate_size=128", "num_attention_heads=4", "num_key_value_heads=2",
        "num_hidden_layers=2", "vocab_size=128", "head_dim=16")
# widths in a real model's proportions (MLP 3.5 x hidden), where the MLP's backward is the widest moment, as
# analytic_scratch.block_scratch counts it
WIDE = ("hidden_size=512", "intermediate_size=1792", "num_attention_heads=8", "num_key_value_heads=2",
        "num_hidden_layers=2", "vocab_size=128", "head_dim=64")
MOE = ("num_experts=4", "num_experts_per_tok=2", "moe_intermediate_size=32")
FAMILIES = {"llama": ("llama-3.2-1b", ()), "qwen3": ("qwen3-0.6b", ()), "gemma": ("gemma-2b", ()),
            "gemma3_text": ("gemma-3-12b", ()), "mixtral": ("mixtral-8x7b", ("num_local_experts=4", "num_experts_per_tok=2")),
            "qwen3_moe": ("qwen3-30b-a3b", MOE)}


def _block_and_arch(family: str, widths: tuple[str, ...], seq: int):
    name, settings = FAMILIES[family]
    config = json.loads((HF / f"{name}.json").read_text())
    config = hfmodels.with_settings(config, (*widths, *settings))
    build_model, example_batch = hfmodels.model_file(config, seq_len=seq)
    torch.manual_seed(0)
    (_, embed), (_, block) = build_model().pipeline_layers()[:2]
    x = embed(example_batch(1)[0]).detach().requires_grad_(True)
    return block, x, from_hf_config(config, where=family, name=family)


def _torch_and_analytic(family: str, widths: tuple[str, ...], seq: int):
    """Per option none and full: torch's (held, input peak, peak, first, carry) and the analytic layer's option."""
    block, x, arch = _block_and_arch(family, widths, seq)
    grad = torch.ones_like(block(x))
    found = split_per_option(block, x, grad, ["none", "full"], tracker=lambda device: StorageTracker())
    profile = analytic.analytic_profile(arch, Shape(seq_len=seq, micro_batch_size=1), gpu=gpu("h100"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    layer = profile.layers[1]
    return found, {option.name: option for option in layer.recompute_options}, layer.param_count


def test_a_llama_blocks_held_bytes_by_hand():
    """16 tokens, bf16: q 64, k 32, v 32, o 64, gate 128, up 128, down 64 (the incoming gradient, passed on by the
    residual add: not new), two norms 64 each: (64 + 32 + 32 + 64 + 128 + 128 + 2 x 64) x 16 x 2 B = 18,432 B."""
    _, _, arch = _block_and_arch("llama", TINY, 16)
    assert analytic_split.saved_output_grad_bytes(arch, Shape(seq_len=16, micro_batch_size=1), moe=False) == 18432


@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma", "gemma3_text"])
def test_a_dense_blocks_analytic_split_is_torchs_held_and_at_least_its_peaks(family):
    """Held to the byte (Qwen3's q and k norms, Gemma's fp32 norm outputs, Gemma 3's post-norms); the input pass's
    peak, the weight pass's, its first group's (the whole pass's) and the carry (none's the fallback wgroups
    charges: the whole weight gradient less held) at or above torch's, none and full alike."""
    found, options, params = _torch_and_analytic(family, WIDE, 128)
    for name in ("none", "full"):
        option = options[name]
        carry = option.split_carry_bytes if option.split_carry_bytes is not None else 2 * params - option.split_held_bytes
        held, input_peak, peak, first, torch_carry, torch_left = found[name]
        assert option.split_held_bytes == held, name
        assert option.split_input_peak_bytes >= input_peak, name
        assert option.split_peak_bytes >= max(peak, first), name
        assert carry >= torch_carry, name
        assert (option.split_left_bytes or 0) >= torch_left, name


@pytest.mark.parametrize("family", ["mixtral", "qwen3_moe"])
def test_a_moe_blocks_analytic_split_holds_at_least_torchs(family):
    """Every expert's rows at its capacity: held at or above torch's (transformers' experts loop); the weight pass
    and the carry too. (The input pass's peak rests on block_transient_bytes, torchtitan's grouped experts, not
    transformers' loop: not compared.)"""
    found, options, params = _torch_and_analytic(family, WIDE, 128)
    for name in ("none", "full"):
        option = options[name]
        carry = option.split_carry_bytes if option.split_carry_bytes is not None else 2 * params - option.split_held_bytes
        held, _, peak, first, torch_carry, torch_left = found[name]
        assert (option.split_held_bytes >= held, option.split_peak_bytes >= max(peak, first), carry >= torch_carry,
                (option.split_left_bytes or 0) >= torch_left) == (True, True, True, True), name


def test_every_analytic_option_torch_splits_records_bytes_and_the_rest_none():
    """Full's weight pass reruns the block once per parameter group (9), each rerun's tensors alive to the pass's
    end; mlp's 3 (gate, up, down); core-attn none (no parameter); offload's copies held, not rerun; mlp-act (a
    selective checkpoint) is not split."""
    _, _, arch = _block_and_arch("llama", TINY, 16)
    profile = analytic.analytic_profile(arch, Shape(seq_len=16, micro_batch_size=1), gpu=gpu("h100"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    options = {option.name: option for option in profile.layers[1].recompute_options}
    none = options["none"]
    for name, reruns in (("full", 9), ("mlp", 3), ("core-attn", 0), ("attn,mlp", 7)):
        option = options[name]
        assert option.split_peak_bytes == none.split_peak_bytes + reruns * option.recompute_peak_bytes, name
        assert option.split_input_peak_bytes == none.split_input_peak_bytes + option.recompute_peak_bytes, name
    offload = options["offload"]
    assert (offload.split_held_bytes, offload.split_peak_bytes) == \
           (none.split_held_bytes + offload.recompute_peak_bytes, none.split_peak_bytes)
    assert (options["mlp-act"].split_peak_bytes, options["mlp-act"].split_held_bytes) == (0, 0)
    assert none.split_held_bytes == 18432 and none.split_carry_bytes is None
