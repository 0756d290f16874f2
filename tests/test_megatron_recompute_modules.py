"""Megatron-LM's --recompute-modules read per layer: dense and MoE decoder layers take different parts
(megatron-core d98e8a64 transformer_config.py 560-584, transformer_layer.py 470-540), each layer the
parts its profile offers, the rest named in a note; names Megatron-LM refuses are refused."""

import dataclasses
from pathlib import Path

import pytest

from planner.commands.evaluate_config import predict, read_job
from planner.errors import UserError
from planner.models.configs import megatron
from planner.models.configs.megatron_flags import (
    layer_option,
    module_parts,
    norm_alternative,
    recompute_modules_option,
)

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
DEEPSEEK_V3 = CONFIGS / "megatron_mfsdp_deepseek_v3.sh"  # examples/megatron_fsdp at d98e8a64
MOE_OFFERED = {"core-attn", "mla-up", "mlp", "mlp-act", "core-attn,mla-up", "mla-up,mlp", "mla-up,mlp-act"}


def test_each_module_is_the_part_megatron_recomputes_in_that_layer():
    modules = ("mlp", "moe", "mla_up_proj", "layernorm")
    # layernorm: the analytic blocks' norm-out, or a measured profile's norm (norm_alternative)
    assert module_parts(modules, moe=False) == ["mla-up", "mlp", "norm-out", "norm"]  # "moe" is no part of a dense layer
    assert module_parts(modules, moe=True) == ["mla-up", "mlp", "norm-out", "norm"]  # "mlp" none of a MoE layer
    # "moe" checkpoints the whole MoE layer: its experts' activation and its shared experts inside it
    assert module_parts(("moe", "moe_act", "shared_experts"), moe=True) == ["mlp"]
    assert module_parts(("moe_act", "shared_experts"), moe=True) == ["mlp-act", "shared-experts"]
    assert module_parts(("moe_act", "moe"), moe=False) == []


def test_a_layer_takes_the_parts_it_offers_and_names_the_rest():
    assert layer_option(["mla-up", "mlp", "norm"], MOE_OFFERED) == ("mla-up,mlp", ["norm"])
    assert layer_option(["mla-up", "mlp", "norm"], {"mla-up", "mlp-act"}) == ("mla-up", ["mlp", "norm"])
    assert layer_option(["core-attn", "mlp-act"], {"core-attn", "mlp-act"}) == ("core-attn", ["mlp-act"])  # no combination
    assert layer_option(["norm"], MOE_OFFERED) == ("none", ["norm"])
    assert layer_option(["mla-up", "mlp", "norm-out"], MOE_OFFERED | {"mla-up,mlp,norm-out"}) == ("mla-up,mlp,norm-out", [])


def test_layernorm_is_norm_out_unless_the_layer_offers_only_norm():
    assert norm_alternative({"core-attn", "norm-out", "core-attn,norm-out"}) == "norm"
    assert norm_alternative({"attn", "attn,norm"}) == "norm-out"  # a measured profile: ckplan's norm
    assert norm_alternative({"core-attn"}) == "norm"  # neither: an analytic block whose norms Megatron fuses
    assert recompute_modules_option(("core_attn", "layernorm"), moe=True) == "core-attn,norm-out"
    assert recompute_modules_option(("core_attn", "layernorm"), moe=True, offered={"core-attn,norm"}) == "core-attn,norm"


def test_the_deepseek_v3_example_recomputes_what_its_modules_say_on_each_layer():
    """Megatron-LM's DeepSeek-V3 example (--recompute-modules mlp moe mla_up_proj layernorm) was scored as
    no recompute (627 GiB a GPU): one option, "mla-up,mlp,norm", was asked of every layer and none offers it.
    Its 3 dense layers recompute the MLA up-projections (mla_up_proj), the whole MLP (mlp) and the attention
    norm's output (layernorm: the MLP norm is fused into linear_fc1), its 58 MoE layers the up-projections,
    the whole MoE layer (moe) and both norms' outputs (layernorm)."""
    job = read_job(DEEPSEEK_V3, None)
    assert job.recompute.modules == ("mlp", "moe", "mla_up_proj", "layernorm") and job.mtp_layers == 1
    # its MTP layer (--mtp-num-layers 1, modelled since branch dsv3rows): its transformer layer recomputes the
    # modules a MoE layer does, and the rank keeps exactly what mtp.0 keeps under that option and mtp.0.head more
    with_mtp = predict(job, gpus=256, gpu_name="h100-sxm")
    job = dataclasses.replace(job, mtp_layers=0)  # the pins below are the 61 decoder layers'
    found = predict(job, gpus=256, gpu_name="h100-sxm")
    mtp = {layer.name: layer for layer in with_mtp.profile.layers if layer.name.startswith("mtp.")}
    assert with_mtp.stages[0].recompute["mtp.0"] == "mla-up,mlp,norm-out"
    kept = next(o.kept_bytes for o in mtp["mtp.0"].recompute_options if o.name == "mla-up,mlp,norm-out")
    assert with_mtp.cost.stages[0].kept_bytes - found.cost.stages[0].kept_bytes == kept + mtp["mtp.0.head"].act_bytes
    recompute = found.stages[0].recompute
    assert [recompute[f"layers.{i}"] for i in range(3)] == ["mla-up,mlp,norm-out"] * 3
    assert {recompute[f"layers.{i}"] for i in range(3, 61)} == {"mla-up,mlp,norm-out"}
    assert not [note for note in found.notes if note.startswith("selective recompute of mlp moe mla_up_proj")]
    # what the options free, layer by layer, is exactly what the rank keeps less than with no recompute
    none = predict(dataclasses.replace(job, recompute=dataclasses.replace(job.recompute, mode="none")), gpus=256,
                   gpu_name="h100-sxm")
    layers = {layer.name: layer for layer in found.profile.layers}
    freed = sum(layers[name].act_bytes - next(o.kept_bytes for o in layers[name].recompute_options if o.name == option)
                for name, option in recompute.items())
    assert none.cost.stages[0].kept_bytes - found.cost.stages[0].kept_bytes == freed
    rank = found.cost.stages[0]
    # 182,806,035,068 before dense mlp and layernorm were offered, less: 3 dense MLPs, 4 x 16,384 tokens x 18,432
    # x 2 B each (2,415,919,104), and 119 norms (2 a MoE layer, 1 a dense one), each its output 16,384 x 7,168 x
    # 2 B and its 1/rms 16,384 x 4 B (234,946,560); both peaks since with the cuBLAS workspaces (torch's two of 32 MiB
    # at :4096:8, the forward's thread's and autograd's, and TE's 32 MiB + 1,024 B on Hopper: 100,664,320 B), and
    # since branch megmem TE's four grouped-GEMM workspaces of 32 MiB + 1,024 B (--moe-grouped-gemm: 134,221,824 B)
    workspaces = 100_664_320 + 134_221_824
    # and since branch d1 mla_up_proj frees each layer's latent norms' outputs and statistics (TE's spec runs them
    # inside the up projections' checkpoint): 16,384 x (1,536 + 512) x 2 B + 2 x 16,384 x 4 B = 67,239,936 a layer
    # and since branch megfsdp Megatron-FSDP's own buffers (planner/cost/megatron_fsdp.py; the example runs
    # --use-megatron-fsdp, optim_grads_params, --fsdp-double-buffer, unfused gradients) in place of FSDP2's
    # largest-layer term (16,422,830,080): the embedding and output layer gathered whole ((926,679,040 +
    # 926,686,208) x 2 B = 3,706,730,496), two weight and two gradient slots of the largest unit (2 x 1,642,283,008
    # x (2 + 4) B = 19,707,396,096): 23,414,126,592. Since branch fsdpalloc the output layer's fp32 bucket and the
    # unit's unfused bf16 gradients (926,686,208 x 4 + 1,642,283,008 x 2 = 6,991,310,848) are charged at their own
    # moments (the head's post-backward, the last unit's backward: megatron_fsdp_moments.py), not at the loss's,
    # where the rank's peak is (its scratch before the head's backward makes any of them)
    mfsdp = 23_414_126_592 - 16_422_830_080
    assert 182_806_035_068 + workspaces + mfsdp - rank.peak_bytes == \
        3 * 2_415_919_104 + 119 * 234_946_560 + 61 * 67_239_936
    # 147,599,637,116 + workspaces before branch d1, less 61 x 67,239,936 (the latent norms, above); the option none's
    # 673,020,557,948 was before d1's shared experts kept as Megatron's SharedExpertMLP keeps them (te_moe_kept)
    assert (rank.static_bytes, rank.peak_bytes) == (47_181_544_056, 143_498_001_020 + workspaces + mfsdp)


@pytest.mark.parametrize("flags, sentence", [
    ("--recompute-modules: core_attn mhc", "--recompute-modules mhc recomputes part of a block ckplan does not build"),
    ("--recompute-modules: attention", "--recompute-modules 'attention' is not one of Megatron-LM's"),
    ("--recompute-method: block", "--recompute-method with --recompute-granularity selective: Megatron-LM refuses"),
    ("--recompute-num-layers: 2", "--recompute-num-layers with --recompute-granularity selective"),
])
def test_selective_recompute_refuses_what_megatron_refuses_in_one_sentence(tmp_path, flags, sentence):
    path = tmp_path / "args.yaml"
    lines = ["--num-layers: 2", "--hidden-size: 256", "--num-attention-heads: 8", "--seq-length: 128",
             "--vocab-size: 1024", "--swiglu: true", "--bf16: true", "--recompute-granularity: selective", flags]
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in lines))
    with pytest.raises(UserError, match=sentence.replace("(", r"\(")):
        megatron.read(path)


def test_layernorm_on_dense_gqa_layers_frees_nothing_and_says_so(tmp_path):
    """megatron-core's Transformer Engine layer fuses a dense GQA layer's two norms into linear_qkv and
    linear_fc1 (IdentityOp norms), where layernorm sets no recompute (transformer_layer.py 474-479,
    522-527 at d98e8a64): the layers keep core_attn's option, the bytes are core_attn's alone, and the
    note says why layernorm changes nothing rather than that it is kept."""
    path = tmp_path / "args.yaml"
    lines = ["--num-layers: 2", "--hidden-size: 256", "--num-attention-heads: 8", "--seq-length: 128",
             "--vocab-size: 1024", "--swiglu: true", "--bf16: true", "--recompute-granularity: selective"]

    def scored(modules):
        path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in [*lines, f"--recompute-modules: {modules}"]))
        return predict(megatron.read(path), gpus=1, gpu_name="h100")

    both, attn = scored("core_attn layernorm"), scored("core_attn")
    assert set(both.stages[0].recompute.values()) == {"core-attn"}
    assert both.cost.stages[0].peak_bytes == attn.cost.stages[0].peak_bytes
    said = [note for note in both.notes if note.startswith("selective recompute of core_attn layernorm")]
    assert len(said) == 1 and "layernorm frees nothing on the profile's decoder_block layers" in said[0]
