"""Megatron-core's multi-token prediction (--mtp-num-layers) as the analytic profile's `mtp.N` layers on the last
stage (planner/profiler/analytic_mtp.py), and --pipeline-model-parallel-layout's E / t / m / L placement as
Megatron-core's PipelineParallelLayerLayout asserts it (planner/models/configs/megatron_split.py)."""

import json

import pytest
from fixtures.cli import run, run_ok

from planner.errors import UserError
from planner.models import archs
from planner.models.configs import megatron
from planner.models.configs.megatron_split import check_layout, layout_counts, layout_stages
from planner.profiler import analytic, analytic_mtp, analytic_time
from planner.profiler.analytic import Shape
from planner.schema import FileRef

H100 = archs.gpu("h100")
REF = FileRef(file="arch:test", sha256="0" * 64)
# h 64, 4 heads of 16, 2 K/V heads, vocab 128; layer 0 dense, layer 1 MoE (8 experts of 32, top 2)
TINY = archs.Arch(name="tiny-mtp", hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4, num_kv_heads=2,
                  vocab_size=128, tie_word_embeddings=False, num_experts=8, num_experts_per_tok=2,
                  moe_intermediate_size=32, dense_layers=(0,))
SHAPE = Shape(seq_len=32, micro_batch_size=2, mtp=1)  # 64 tokens


def _profile(shape=SHAPE):
    return analytic.analytic_profile(TINY, shape, gpu=H100, model=REF)


def test_the_mtp_layer_sits_between_the_last_block_and_the_head_and_only_when_asked():
    plain = _profile(Shape(seq_len=32, micro_batch_size=2))
    assert [layer.name for layer in plain.layers] == ["tok_embeddings", "layers.0", "layers.1", "output"]
    layers = _profile().layers
    assert [layer.name for layer in layers] == ["tok_embeddings", "layers.0", "layers.1", "mtp.0", "mtp.0.head", "output"]
    assert (layers[3].kind, layers[4].kind) == ("mtp", "mtp_head") and _profile().name.endswith("-mtp1")
    two = _profile(Shape(seq_len=32, micro_batch_size=2, mtp=2))
    assert [layer.name for layer in two.layers][3:7] == ["mtp.0", "mtp.0.head", "mtp.1", "mtp.1.head"]
    # the other layers do not move
    assert [layer.model_dump() for layer in plain.layers] == [layer.model_dump() for layer in layers
                                                               if not layer.name.startswith("mtp.")]


def test_its_parameters_by_hand():
    layers = {layer.name: layer for layer in _profile().layers}
    mtp, block = layers["mtp.0"], layers["layers.1"]
    # its own embedding 128 x 64, enorm and hnorm 64 each, eh_proj 64 x 128, the MoE block (the last layer's kind),
    # its final norm 64; the head's weight is the main head's (not counted again)
    assert mtp.param_count == 128 * 64 + 2 * 64 + 64 * 128 + block.param_count + 64
    assert layers["mtp.0.head"].param_count == 0
    assert mtp.expert_param_count == block.expert_param_count > 0 and mtp.a2a_bytes == block.a2a_bytes > 0


def test_its_kept_bytes_by_hand():
    layers = {layer.name: layer for layer in _profile().layers}
    T, h, d = 64, 64, 2
    norms = 3 * (T * h * d + 4 * T)  # enorm's, hnorm's and its final norm's inputs and their fp32 1/rms
    concat = T * 2 * h * d  # eh_proj's input
    assert layers["mtp.0"].act_bytes == 8 * T + norms + concat + layers["layers.1"].act_bytes
    # the head's GEMM keeps the final norm's output; the cross-entropy its fp32 logits and the loss
    assert layers["mtp.0.head"].act_bytes == T * h * d + T * 128 * 4 + 4


def test_its_time_is_its_parts():
    layers = {layer.name: layer for layer in _profile().layers}
    proj = analytic_time.times_ms(analytic_mtp.proj_work(TINY, SHAPE), H100, None)
    loss = analytic.loss_ms(TINY, SHAPE, H100)
    fwd, bwd = analytic_mtp.loss_split_ms(loss, SHAPE)
    assert fwd + bwd == pytest.approx(loss)
    parts = ("tok_embeddings", "layers.1", "output")
    both = ("mtp.0", "mtp.0.head")
    assert sum(layers[n].fwd_ms for n in both) == pytest.approx(sum(layers[n].fwd_ms for n in parts) + proj[0] + fwd)
    assert sum(layers[n].bwd_ms for n in both) == pytest.approx(sum(layers[n].bwd_ms for n in parts) + proj[1] + bwd)
    # eh_proj: 2 x 64 tokens x 128 in x 64 out forward, twice that backward
    work = analytic_mtp.proj_work(TINY, SHAPE)
    assert (work[0].flops, work[1].flops) == (2 * 64 * 128 * 64, 4 * 64 * 128 * 64)


def test_the_layout_as_megatron_parses_and_checks_it():
    # Megatron-Bridge's layout_map[(4, 4)] for DeepSeek-V3 (recipes/deepseek/deepseek_v3.py at 00b7660b)
    layout = "Et*4|(t*4|)*14tmL"
    assert layout_counts(layout) == [4] * 15 + [1]
    assert layout_stages(layout)[0] == "Etttt" and layout_stages(layout)[-1] == "tmL"
    assert check_layout(layout, 1) == []
    assert "the last stage begins with its MTP layer" in check_layout("Et|mL", 1)[0]  # accepted, its send said
    for bad, mtp, words in [("tt|tL", 0, "embedding (E) must come once"), ("Et|tLt", 0, "loss (L) must come once"),
                            ("Et|tmL", 0, "places 1 MTP layer"), ("Et|tL", 1, "places 0 MTP layer"),
                            ("Etm|tL", 1, "a decoder layer (t) after an MTP layer"),
                            ("Et|tm|L", 1, "standalone MTP stage")]:
        with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
            check_layout(bad, mtp)


BASE = """--num-layers: 4
--hidden-size: 64
--num-attention-heads: 4
--seq-length: 32
--vocab-size: 128
--swiglu: true
--normalization: RMSNorm
--bf16: true"""


def _write(tmp_path, flags: str):
    path = tmp_path / "args.yaml"
    path.write_text("MODEL_ARGS:\n" + "".join(f"  {line}\n" for line in flags.strip().splitlines()))
    return path


def test_the_reader_takes_the_mtp_layers_and_the_scaling_factor(tmp_path):
    job = megatron.read(_write(tmp_path, BASE + "\n--mtp-num-layers: 1\n--mtp-loss-scaling-factor: 0.1"))
    status = {s.name: s.status for s in job.settings}
    assert job.mtp_layers == 1 and status["--mtp-num-layers"] == "modelled"
    assert status["--mtp-loss-scaling-factor"] == "no effect"
    assert megatron.read(_write(tmp_path, BASE)).mtp_layers == 0


def test_evaluate_puts_the_mtp_layer_on_the_last_stage_and_refuses_a_misplaced_one(tmp_path):
    flags = BASE + "\n--pipeline-model-parallel-size: 2\n--global-batch-size: 4\n--mtp-num-layers: 1"
    plain = json.loads(run_ok("evaluate", "--from-megatron", _write(tmp_path, BASE + "\n--pipeline-model-parallel-size: "
                                                                    '2\n--global-batch-size: 4\n'
                                                                    '--pipeline-model-parallel-layout: "Et*3|tL"'),
                              "--gpus", 2, "--gpu", "h100", "--json").stdout)
    out = json.loads(run_ok("evaluate", "--from-megatron", _write(tmp_path, flags + '\n--pipeline-model-parallel-layout: '
                                                                  '"Et*3|tmL"'), "--gpus", 2, "--gpu", "h100",
                            "--json").stdout)
    assert [r["layers"] for r in out["ranks"]] == [["tok_embeddings", "layers.0", "layers.1", "layers.2"],
                                                    ["layers.3", "mtp.0", "mtp.0.head", "output"]]
    assert out["ranks"][0]["static_bytes"] == plain["ranks"][0]["static_bytes"]
    assert out["ranks"][1]["static_bytes"] > plain["ranks"][1]["static_bytes"]
    bad = run("evaluate", "--from-megatron", _write(tmp_path, flags + '\n--pipeline-model-parallel-layout: "Et*2|tt|m|L"'),
              "--gpus", 2, "--gpu", "h100")
    assert bad.exit_code != 0 and "standalone MTP stage" in bad.output


def test_the_mtp_layer_recomputes_as_megatron_core_runs_it(tmp_path):
    layers = {layer.name: layer for layer in _profile().layers}
    mtp, block = layers["mtp.0"], layers["layers.1"]
    options = {option.name: option for option in mtp.recompute_options}
    T, h, d = 64, 64, 2
    # full: the lookup's ids and the checkpoint's two inputs (the hidden states, the rolled embedding)
    assert options["full"].kept_bytes == mtp.input_bytes == 8 * T + 2 * T * h * d
    # a selective option: the block's option inside, the rest of the layer kept
    mla = {option.name: option for option in block.recompute_options}["mlp"]
    assert options["mlp"].kept_bytes == mtp.act_bytes - block.act_bytes + mla.kept_bytes
    assert "op-sac" not in options and "offload" not in options
    from planner.commands.evaluate_config import predict

    flags = BASE + "\n--mtp-num-layers: 1\n--global-batch-size: 2\n--recompute-granularity: full\n"
    uniform = megatron.read(_write(tmp_path, flags + "--recompute-method: uniform"))
    assert "mtp.0" in predict(uniform, gpus=1, gpu_name="h100").stages[0].checkpointed
    block_method = megatron.read(_write(tmp_path, flags + "--recompute-method: block\n--recompute-num-layers: 4"))
    assert "mtp.0" not in predict(block_method, gpus=1, gpu_name="h100").stages[0].checkpointed  # 1630-1634
    with pytest.raises(UserError, match="recompute_num_layers 1 for MTP"):
        megatron.read(_write(tmp_path, flags + "--recompute-method: uniform\n--recompute-num-layers: 2"))
