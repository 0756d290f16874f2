"""A kind's layers that differ (Gemma 3's global layers among its sliding ones, SmolLM3's NoPE layers) charged at
their own time and bytes, not their kind's mean (LayerProfile.variant, layers.layer_costs); the solvers place
them by it (brute force over splits); the compiled figures not recorded for a layer without rotary."""

from __future__ import annotations

import itertools

import pytest

from planner.cost import costmodel
from planner.cost.layers import layer_costs
from planner.models import archconfig, archs
from planner.profiler import analytic, compiled_kept, compiled_time
from planner.profiler.formulas import Shape
from planner.schema import FileRef, TrainSetup
from planner.solve import milp, search

# hidden 64, 4 heads of 32, 2 K/V heads, MLP 128; layer 0 global, layers 1 and 2 sliding at 64 tokens
GEMMA3 = {"model_type": "gemma3_text", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256,
          "max_position_embeddings": 16384, "sliding_window": 64, "pad_token_id": 0,
          "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
          "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6}
SMOLLM3 = {"model_type": "smollm3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "pad_token_id": None,
           "max_position_embeddings": 512, "no_rope_layer_interval": 2, "rms_norm_eps": 1e-6}
SEQ = 8192


def _profile(config: dict, seq: int = SEQ, **kwargs):
    arch = archconfig.from_hf_config(config, where="config.json", name="tiny")
    return analytic.analytic_profile(arch, Shape(seq_len=seq, micro_batch_size=1), gpu=archs.gpu("h100"),
                                     model=FileRef(file="arch:test", sha256="0" * 64), **kwargs)


def test_a_stage_is_charged_the_sum_of_its_own_layers():
    profile = _profile(GEMMA3)
    glob, local, other = profile.layers[1], profile.layers[2], profile.layers[3]
    assert (glob.variant, local.variant, other.variant) == ("full attention", "window 64", "window 64")
    assert glob.fwd_ms > 1.3 * local.fwd_ms  # 8,192 tokens of attention against 64: the global layer is not the mean
    costs = layer_costs(profile)
    for lo, hi in itertools.combinations(range(len(costs) + 1), 2):  # every contiguous stage, by hand
        own = profile.layers[lo:hi]
        assert sum(c.fwd_ms for c in costs[lo:hi]) == pytest.approx(sum(x.fwd_ms for x in own), rel=1e-12)
        assert sum(c.bwd_ms for c in costs[lo:hi]) == pytest.approx(sum(x.bwd_ms for x in own), rel=1e-12)
    assert (costs[1].variant, costs[2].variant) == ("full attention", "window 64")
    # the MILP's runs of equal layers break where the variant does
    assert [(run.start, run.size) for run in milp.find_runs(costs)] == [(0, 1), (1, 1), (2, 2), (4, 1)]


def test_a_model_whose_layers_are_alike_records_no_variant():
    profile = _profile({**GEMMA3, "layer_types": ["sliding_attention"] * 3}, seq=512)
    assert {layer.variant for layer in profile.layers} == {None}


@pytest.mark.parametrize("solver", ["dp", "milp"])
def test_solvers_place_the_global_layer_by_its_own_time(solver):
    """Two stages, roomy caps (no checkpoint pays): brute force over the splits. With the global layer charged the
    mean, the split is 2 blocks | 1; by its own time (G > L + head) the global layer stands alone with the
    embedding."""
    profile = _profile(GEMMA3)
    emb, glob, local, _, head = profile.layers
    assert glob.fwd_ms + glob.bwd_ms > local.fwd_ms + local.bwd_ms + head.fwd_ms + head.bwd_ms
    setup = TrainSetup(stages=2, microbatches=4, micro_batch_size=1, schedule="1F1B", mem_caps_bytes=[2**40] * 2)
    n = len(profile.layers)
    splits = {cut: costmodel.evaluate(costmodel.split_to_stages([0, cut], [False] * n, profile), profile, setup)
              for cut in range(1, n)}
    best = min(splits, key=lambda cut: splits[cut].iteration_ms)
    assert best == 2
    result = search.plan(profile, setup, solver=solver, mip_gap=0.0, threads=1)
    assert [stage.layers for stage in result.stages] == [["tok_embeddings", "layers.0"],
                                                         ["layers.1", "layers.2", "output"]]
    assert result.cost.iteration_ms == pytest.approx(splits[best].iteration_ms, rel=1e-9)


def test_smollm3_nope_layers_record_no_compiled_figures():
    """The compiled counts were read on a block that rotates Q and K: a NoPE layer keeps its eager figures."""
    profile = _profile(SMOLLM3, seq=256, compiled=True)
    rope, nope = profile.layers[1], profile.layers[2]
    assert (rope.variant, nope.variant) == ("full attention", "full attention, no rotary")
    assert rope.compiled_kept_bytes and rope.compiled_time is not None
    assert not nope.compiled_kept_bytes and nope.compiled_time is None
    arch, shape = archconfig.from_hf_config(SMOLLM3, where="config.json", name="tiny"), Shape(seq_len=256,
                                                                                              micro_batch_size=1)
    assert compiled_kept.compiled_kept_bytes(arch.layer(1), shape, moe=False) == {}
    assert compiled_time.compiled_block_bytes(arch.layer(1), shape, moe=False) == {}
    assert compiled_time.compiled_block_bytes(arch.layer(0), shape, moe=False) != {}
    # eager, the NoPE layer moves less than the RoPE one (no rotary), charged its own
    assert nope.fwd_ms < rope.fwd_ms
    assert [c.fwd_ms for c in layer_costs(profile)[1:3]] == [rope.fwd_ms, nope.fwd_ms]


def test_a_model_code_profile_records_its_blocks_variants_by_name():
    """--hf-config's wrapper names decoder layer i `layers.{i}` (hfmodels.py): those take the arch's variant; the
    embedding, the head and a name past the decoder keep none."""
    from planner.models.synthetic import layer
    from planner.profiler.variants import with_variants

    arch = archconfig.from_hf_config(GEMMA3, where="config.json", name="tiny")
    names = ["embed", "layers.0", "layers.1", "layers.2", "layers.3", "output"]
    plain = [layer(name, "Block", fwd_ms=1, act_mib=1, input_mib=1, param_count=1) for name in names]
    made = with_variants(plain, arch)
    assert [x.variant for x in made] == [None, "full attention", "window 64", "window 64", None, None]
    alike = archconfig.from_hf_config({**GEMMA3, "layer_types": ["sliding_attention"] * 3}, where="c", name="t")
    assert {x.variant for x in with_variants(plain, alike)} == {None}
