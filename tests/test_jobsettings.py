"""The settings Megatron-LM's functional tests run that move bytes the profile does not
(planner/cost/jobsettings.py): --no-gradient-accumulation-fusion, the logging reads and
--deterministic-mode's NaN fill, counted by hand on tiny blocks, through evaluate, refused elsewhere,
and read from a Megatron config."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from fixtures.tiny_gpt2 import tiny_gpt2_profile

from planner import io
from planner.cli import cli
from planner.cost import jobsettings
from planner.cost.layers import layer_costs
from planner.models import archs
from planner.profiler import analytic
from planner.profiler.analytic import Shape
from planner.schema import FileRef, TrainSetup

HBM = 3.35e12  # the H100's bandwidth, as the analytic profile records it
H, F, V, POS = 64, 256, 128, 32  # fixtures.tiny_gpt2's config
# a GPT block (Megatron's default biases, LayerNorm with a bias, no GQA): Q/K/V 3h x h + 3h, the
# projection h x h + h, fc1 f x h + f, fc2 h x f + h, two LayerNorms 2 x 2h
BLOCK = 3 * H * H + 3 * H + H * H + H + F * H + F + H * F + H + 2 * 2 * H
# the final LayerNorm (2h) and the untied output layer (V x h)
HEAD = 2 * H + V * H


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return tiny_gpt2_profile(tmp_path_factory.mktemp("p"), "h100")


def _setup(runtime="megatron", **training) -> TrainSetup:
    return TrainSetup(stages=1, microbatches=1, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                      runtime=runtime, dp=2, zero=1, **training)


def test_unfused_accumulation_adds_4_bytes_a_weight_a_microbatch_and_none_for_the_embedding(tiny_path):
    profile = io.load_profile(tiny_path)
    embedding, block, *_, head = layer_costs(profile)
    assert (block.param_count, head.param_count) == (BLOCK, HEAD)
    unfused = _setup(unfused_grad_accumulation=True)
    # the DDP hook's add reads the bf16 gradient (2) and the fp32 main_grad (4) and writes it (4), and the
    # GEMM writes the bf16 gradient (2): 12 B where the fused GEMM's epilogue reads and writes 4 + 4
    # at the rate the profile times its eager .grad add at (the elementwise class's), not the HBM's
    rate = profile.assumptions["membound_tbps"]["by_class"]["elementwise"] * 1e12
    assert rate < HBM
    assert jobsettings.unfused_accumulation_ms(block, profile, unfused) == pytest.approx(BLOCK * 4 / rate * 1e3)
    assert jobsettings.unfused_accumulation_ms(head, profile, unfused) == pytest.approx(HEAD * 4 / rate * 1e3)
    # the analytic embedding's tables (tokens and learned positions) are its lookups': no wgrad GEMM
    assert embedding.lookup_param_count == embedding.param_count == V * H + POS * H
    assert jobsettings.unfused_accumulation_ms(embedding, profile, unfused) == 0.0
    assert jobsettings.unfused_accumulation_ms(block, profile, _setup()) == 0.0  # fused (the default)


def test_the_logging_reads_read_the_rank_s_fp32_shard_once_a_step_each(tiny_path):
    profile = io.load_profile(tiny_path)
    block = layer_costs(profile)[1]
    both = _setup(log_params_norm=True, log_num_zeros_in_grad=True)
    # the norm over the fp32 main parameters and the zeros of the fp32 main grads: 4 B each over 1 / DP 2
    assert jobsettings.logged_reads_ms(block, profile, both) == pytest.approx(BLOCK * 2 * 4 / 2 / HBM * 1e3)
    one = _setup(log_params_norm=True)
    assert jobsettings.logged_reads_ms(block, profile, one) == pytest.approx(BLOCK * 4 / 2 / HBM * 1e3)
    assert jobsettings.logged_reads_ms(block, profile, _setup()) == 0.0


def test_deterministic_mode_fills_each_te_output_once_more(tiny_path):
    profile = io.load_profile(tiny_path)
    embedding, block, *_, head = layer_costs(profile)
    tokens = POS  # one sequence of 32 tokens
    # forward: the GEMMs' Q/K/V (3h: 4 heads of 16, no GQA), projection (h), fc1 (f), fc2 (h), the two
    # norms' outputs (2h) and the attention's output (h); backward each GEMM's input gradient (h, h, h, f),
    # dQ, dK, dV (3h) and the norms' input gradients (2h); 2 B each (bf16)
    elements = (3 * H + H + F + H + 2 * H + H, H + H + H + F + 3 * H + 2 * H)
    forward, backward = elements[0] * tokens * 2, elements[1] * tokens * 2
    assert jobsettings.te_output_elements(profile, block) == elements
    on = _setup(deterministic=True)
    # on the H100 (sm90) cuDNN's deterministic backward allocates its dP workspace too: batch 1 x 4 heads x 32
    # tokens padded to 64, squared, x 2 B = 32,768 B, once a backward (not again in a recompute)
    workspace = 1 * 4 * 64 * 64 * 2
    assert jobsettings.dp_workspace_bytes(block, profile, on) == workspace == 32768
    assert jobsettings.deterministic_fill_ms(block, 0, profile, on) == pytest.approx(
        (forward + backward + workspace) / HBM * 1e3)
    # a recomputed block allocates its forward's outputs again
    assert jobsettings.deterministic_fill_ms(block, 1, profile, on) == pytest.approx(
        (2 * forward + backward + workspace) / HBM * 1e3)
    # with unfused accumulation each weight gradient is a bf16 tensor its GEMM allocates too
    both = _setup(deterministic=True, unfused_grad_accumulation=True)
    assert jobsettings.deterministic_fill_ms(block, 0, profile, both) == pytest.approx(
        (forward + backward + BLOCK * 2 + workspace) / HBM * 1e3)
    # the embedding and the head (Megatron's own output linear, torch.matmul) are not TE GEMMs; off: nothing
    assert jobsettings.deterministic_fill_ms(embedding, 0, profile, on) == 0.0
    assert jobsettings.deterministic_fill_ms(head, 0, profile, on) == 0.0
    assert jobsettings.deterministic_fill_ms(block, 0, profile, _setup()) == 0.0


def test_a_llama_block_fills_its_fused_gate_and_up_output_at_the_groups_width(tmp_path):
    arch = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=1, num_heads=4,
                      num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
    profile = analytic.analytic_profile(arch, Shape(seq_len=32, micro_batch_size=2, tp=2), gpu=archs.gpu("h100"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    block = next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")
    # per device at TP 2: Q 2 heads x 16, K and V 1 group x 16 each, gate and up 2 x 80, the norms 2h, the
    # attention's output 32; backward h, 32, h, 80, dQ 32, dK and dV 16 each, the norms 2h
    assert jobsettings.te_output_elements(profile, block) == (32 + 2 * 16 + 64 + 2 * 80 + 64 + 2 * 64 + 32,
                                                              64 + 32 + 64 + 80 + 32 + 2 * 16 + 2 * 64)


def test_deterministic_mode_runs_cudnns_deterministic_attention_backward_at_its_published_rate():
    arch = archs.Arch(name="tiny-llama", hidden_size=64, intermediate_size=160, num_layers=1, num_heads=4,
                      num_kv_heads=2, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=32)
    on, off = _setup(deterministic=True), _setup()
    # the A100 runs FlashAttention-2's deterministic backward: 2 x 2 (batch, head) pairs split 27 ways fill its
    # 108 SMs in one wave, nothing beyond the non-deterministic kernel (flash2_deterministic_factor below)
    for gpu, expected in (("gb200", True), ("h100", False), ("b200", False), ("a100-80g", False)):
        profile = analytic.analytic_profile(arch, Shape(seq_len=32, micro_batch_size=2, tp=2), gpu=archs.gpu(gpu),
                                            model=FileRef(file="arch:test", sha256="0" * 64))
        embedding, block, *_ = layer_costs(profile)
        # 2 heads a device at TP 2, head dim 16, 32 tokens, 2 sequences: 2.5 x 4·s²·d·heads·batch, causal half
        flops = 2.5 * 4 * 32 * 32 * 16 * 2 * 2 / 2
        if expected:  # cuDNN 9.22 on GB200, 8192 tokens: backward 4.127 ms, deterministic 4.754 ms (same FLOPs)
            rate, det = 1.0995116277760e12 * 2 * 2.5 / 4.127e-3, 1.0995116277760e12 * 2 * 2.5 / 4.754e-3
            assert jobsettings.deterministic_attention_ms(block, 0, profile, on) == pytest.approx(
                (flops / det - flops / rate) * 1e3, rel=1e-9)
            assert jobsettings.deterministic_attention_ms(block, 0, profile, on) > 0
        else:  # no deterministic rate published: the backward stays the profile's
            assert jobsettings.deterministic_attention_ms(block, 0, profile, on) == 0.0
        assert jobsettings.deterministic_attention_ms(block, 0, profile, off) == 0.0
        assert jobsettings.deterministic_attention_ms(embedding, 0, profile, on) == 0.0
    # an unfused attention (the s x s scores kept) is not cuDNN's kernel: nothing
    eager = analytic.analytic_profile(arch, Shape(seq_len=32, micro_batch_size=2, tp=2, attention="eager"),
                                      gpu=archs.gpu("gb200"), model=FileRef(file="arch:test", sha256="0" * 64))
    block = next(layer for layer in layer_costs(eager) if layer.kind == "decoder_block")
    assert jobsettings.deterministic_attention_ms(block, 0, eager, on) == 0.0


def test_flash2s_deterministic_backward_runs_its_split_blocks_in_waves_by_hand():
    # blocks = ceil(108 / (b·h)) x b·h, one an SM: T16 (batch 1, 32 heads) 4 x 32 = 128 in 2 waves, T19 (batch 2,
    # 8 heads) 7 x 16 = 112 in 2: time / the non-deterministic kernel's (the work over all 108) = waves x 108 / blocks
    assert jobsettings.flash2_deterministic_factor(108, 32) == pytest.approx(2 * 108 / 128)
    assert jobsettings.flash2_deterministic_factor(108, 16) == pytest.approx(2 * 108 / 112)
    assert jobsettings.flash2_deterministic_factor(108, 4) == 1.0  # 27 x 4 = 108 blocks: one full wave
    assert jobsettings.flash2_deterministic_factor(108, 200) == pytest.approx(2 * 108 / 200)  # a block a pair
    arch = archs.Arch(name="tiny-gqa", hidden_size=1024, intermediate_size=2048, num_layers=1, num_heads=64,
                      num_kv_heads=8, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=64)
    on = _setup(deterministic=True)
    profile = analytic.analytic_profile(arch, Shape(seq_len=64, micro_batch_size=1, tp=2), gpu=archs.gpu("a100-80g"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    block = next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")
    # 32 heads a device, head dim 16, 64 tokens, causal half: the backward at FlashAttention-2's 63% of 312 TFLOP/s
    backward_ms = 2.5 * 4 * 64 * 64 * 16 * 32 / 2 / (312e12 * 0.63) * 1e3
    assert jobsettings.deterministic_attention_ms(block, 0, profile, on) == pytest.approx(backward_ms * (216 / 128 - 1))
    assert jobsettings.deterministic_attention_ms(block, 0, profile, _setup()) == 0.0


def test_blackwell_runs_flash2_where_the_attention_drops_and_cudnn_where_it_does_not():
    # TE v2.18's nvte_get_fused_attn_backend offers cuDNN's deterministic backward on sm100+ only without dropout:
    # a GPT block (attention dropout, Megatron's default 0.1) runs FlashAttention-2 on B200 and GB200, a LLaMA
    # block (no dropout) cuDNN; sm80 FlashAttention-2 either way, sm90 cuDNN either way
    b200, gb200, a100, h100 = (archs.gpu(name) for name in ("b200", "gb200", "a100-80g", "h100"))
    for gpu, drops, kernel in ((b200, True, "flash2"), (gb200, True, "flash2"), (b200, False, "cudnn"),
                               (gb200, False, "cudnn"), (a100, False, "flash2"), (a100, True, "flash2"),
                               (h100, True, "cudnn"), (h100, False, "cudnn")):
        assert jobsettings.deterministic_attention_kernel(gpu, drops_attention=drops) == kernel


def test_gpt_on_gb200_under_deterministic_mode_is_timed_as_flash2_in_place_of_cudnn_by_hand():
    arch = archs.Arch(name="tiny-gpt", style="gpt", hidden_size=256, intermediate_size=1024, num_layers=1,
                      num_heads=8, num_kv_heads=8, vocab_size=128, tie_word_embeddings=False,
                      max_position_embeddings=64)
    on = _setup(deterministic=True)
    profile = analytic.analytic_profile(arch, Shape(seq_len=64, micro_batch_size=4, tp=2), gpu=archs.gpu("gb200"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    block = next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")
    # per device: 4 heads, head dim 32, 64 tokens, 4 sequences; causal half; backward 2.5 x the forward
    forward = 4 * 64 * 64 * 32 * 4 * 4 / 2
    backward = 2.5 * forward
    peak = 2500e12
    # the profile timed cuDNN 9.22 on GB200 (2 x 64 heads, 8192 tokens, head dim 128: forward 1.397 ms, backward
    # 4.127 ms); FlashAttention-2 is torch SDPA's flash backend on B200 at 512 tokens (the nearest published:
    # 1 x 128 heads, head dim 128, forward 0.115 ms, backward 0.259 ms), as fractions of each GPU's peak
    cudnn_flops = 4 * 8192 * 8192 * 128 * 64 * 2 / 2
    cudnn = (cudnn_flops / 1.397e-3 / peak, 2.5 * cudnn_flops / 4.127e-3 / peak)
    sdpa_flops = 4 * 512 * 512 * 128 * 128 / 2
    flash = (sdpa_flops / 0.115e-3 / 2250e12, 2.5 * sdpa_flops / 0.259e-3 / 2250e12)
    # deterministic on GB200's 152 SMs: 4 x 4 = 16 (batch, head) pairs split ceil(152 / 16) = 10 ways: 160 blocks,
    # 2 waves of 152
    factor = 2 * 152 / 160
    expected = (forward / (peak * flash[0]) - forward / (peak * cudnn[0])
                + backward / (peak * flash[1]) * factor - backward / (peak * cudnn[1])) * 1e3
    assert jobsettings.deterministic_attention_ms(block, 0, profile, on) == pytest.approx(expected, rel=1e-9)
    assert expected > 0
    # a full recompute reruns the forward: its difference once more
    assert jobsettings.deterministic_attention_ms(block, 1, profile, on) == pytest.approx(
        expected + (forward / (peak * flash[0]) - forward / (peak * cudnn[0])) * 1e3, rel=1e-9)
    assert jobsettings.deterministic_attention_ms(block, 0, profile, _setup()) == 0.0
    # the same block without its attention dropout keeps cuDNN's deterministic backward (4.754 ms at 8192)
    dry = archs.Arch(**{**arch.__dict__, "attention_dropout": False})
    profile = analytic.analytic_profile(dry, Shape(seq_len=64, micro_batch_size=4, tp=2), gpu=archs.gpu("gb200"),
                                        model=FileRef(file="arch:test", sha256="0" * 64))
    block = next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")
    det = 2.5 * cudnn_flops / 4.754e-3 / peak
    assert jobsettings.deterministic_attention_ms(block, 0, profile, on) == pytest.approx(
        (backward / (peak * det) - backward / (peak * cudnn[1])) * 1e3, rel=1e-9)


def _rank(path, *extra) -> dict:
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(path), "--layers-per-stage", "4",
                                      "--ckpt-per-stage", "0", "--microbatches", "3", "--dp", "2", "--zero", "1",
                                      "--mem", "80GB", "--precision", "bf16-mixed", "--runtime", "megatron", "--json",
                                      *extra])
    assert result.exit_code == 0, result.output
    found, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{"):])
    return found["hand"]


def test_evaluate_charges_them_per_microbatch_and_per_step(tiny_path):
    plain = _rank(tiny_path)
    given = _rank(tiny_path, "--no-gradient-accumulation-fusion", "--log-params-norm", "--log-num-zeros-in-grad",
                  "--deterministic-mode")
    weights = 2 * BLOCK + HEAD  # the two blocks and the head; the embedding's gradient is not a GEMM's
    fill = 2 * ((3 * H + H + F + H + 3 * H) + (H + H + H + F + 5 * H)) * POS * 2 + 2 * BLOCK * 2  # two blocks' TE outputs
    fill += 2 * 1 * 4 * 64 * 64 * 2  # and each block's cuDNN dP workspace on sm90 (4 heads, 32 tokens padded to 64)
    # and Megatron's own cross-entropy's fp32 copy of the logits and the gradient's cast back (4 + 2 B a logit,
    # planner/cost/megatron_loss.py), NaN-filled first
    fill += POS * V * (4 + 2)
    elementwise = io.load_profile(tiny_path).assumptions["membound_tbps"]["by_class"]["elementwise"] * 1e12
    per_microbatch = weights * 4 / elementwise * 1e3 + fill / HBM * 1e3  # the hook's adds at the .grad add's rate
    per_step = (weights + (V * H + POS * H)) * 2 * 4 / 2 / HBM * 1e3  # the logging reads cover every parameter
    # the host's share (planner/cost/hosttime.py, tests/test_hosttime_step.py), the tiny passes host-bound on H100's
    # host: unfused, the DDP hook adds main_grad on the GEMMs' weights too (0.18 against 0.04 Linear forwards a
    # tensor); the logging loops a tensor (count_zeros 0.67, params norm 0.03) and their fixed calls (0.08 + 2.40)
    from planner.cost import hosttime
    profile = io.load_profile(tiny_path)
    setup = TrainSetup(stages=1, microbatches=3, micro_batch_size=1, mem_caps_bytes=[2**40], precision="bf16-mixed",
                       runtime="megatron")
    layers = layer_costs(profile)
    tensors = sum(hosttime.param_tensors(layer, profile, setup) for layer in layers)
    gemm_weights = 2 * 4 + (hosttime.param_tensors(layers[-1], profile, setup) - 2)  # the blocks' 4, the head's own
    per_microbatch += gemm_weights * (0.18 - 0.04) * 13.48e-3
    # the cross-entropy's NaN fills run inside the host-bound span of the head and loss: hidden under the host's time
    per_microbatch -= POS * V * (4 + 2) / HBM * 1e3
    per_step += (tensors * (0.67 + 0.03) + 0.08 + 2.40) * 13.48e-3
    # the step's scalar all-reduces the flags add (planner/cost/stepcomm.py): count_zeros over the world of the
    # distributed optimizer (2 ranks) and the params norm's four sums over DP 2, each at what NCCL's tuner picks
    # (Ring / LL: 6.6 + 2 x 0.6 µs; no launch here forces Ring / Simple); its model-parallel sum has one rank
    # (nothing), and the gradients' norm runs in both
    per_step += 5 * (6.6 + 2 * 0.6) * 1e-3
    grown = given["iteration_ms"] - plain["iteration_ms"]
    assert grown == pytest.approx(3 * per_microbatch + per_step)
    assert given["stages"][0]["time_ms"] - plain["stages"][0]["time_ms"] == pytest.approx(per_microbatch)
    assert given["stages"][0]["peak_bytes"] == plain["stages"][0]["peak_bytes"]  # time only


@pytest.mark.parametrize("flag", ["--no-gradient-accumulation-fusion", "--log-params-norm", "--log-num-zeros-in-grad",
                                  "--deterministic-mode"])
def test_other_runtimes_refuse_them_in_one_sentence(tiny_path, flag):
    result = CliRunner().invoke(cli, ["evaluate", "--profile", str(tiny_path), "--layers-per-stage", "4",
                                      "--ckpt-per-stage", "0", "--microbatches", "3", "--mem", "80GB",
                                      "--precision", "bf16-mixed", "--runtime", "torchtitan", flag])
    assert result.exit_code != 0
    assert flag in result.output and "--runtime megatron" in result.output
    assert "Traceback" not in result.output


MEGATRON_ARGS = """\
--num-layers 2 --hidden-size 64 --num-attention-heads 4 --ffn-hidden-size 256 --seq-length 32
--max-position-embeddings 32 --vocab-size 128 --micro-batch-size 1 --global-batch-size 4 --bf16
--untie-embeddings-and-output-weights --use-distributed-optimizer
--no-gradient-accumulation-fusion --log-params-norm --log-num-zeros-in-grad --deterministic-mode
"""


def test_the_megatron_reader_models_the_flags_and_lists_deterministic_mode(tmp_path):
    from planner.models.configs import megatron

    path = tmp_path / "args.sh"
    path.write_text("torchrun --nproc_per_node 2 pretrain_gpt.py " + MEGATRON_ARGS.replace("\n", " \\\n"))
    job = megatron.read(path)
    status = {s.name: s.status for s in job.settings}
    for flag in ("--no-gradient-accumulation-fusion", "--log-params-norm", "--log-num-zeros-in-grad",
                 "--deterministic-mode"):
        assert status[flag] == "modelled"
    assert (job.modelled.unfused_grad_accumulation, job.modelled.log_params_norm,
            job.modelled.log_num_zeros_in_grad, job.modelled.deterministic) == (True, True, True, True)
    # its attention backward is charged where cuDNN's deterministic rate is published (GB200) and not elsewhere:
    # said in the flag's sentence and a note, not dropped
    assert "where there is one (GB200)" in {s.name: s.what for s in job.settings}["--deterministic-mode"]
    assert any(note.startswith("--deterministic-mode: ") and "none published for H100" in note for note in job.notes)


def test_the_megatron_export_writes_them_and_reads_back_the_same_and_other_targets_refuse(tiny_path, tmp_path):
    from planner.models.configs import megatron

    plan = tmp_path / "plan.yaml"
    flags = ("--no-gradient-accumulation-fusion", "--log-params-norm", "--log-num-zeros-in-grad", "--deterministic-mode")
    solved = CliRunner().invoke(cli, ["solve", "--profile", str(tiny_path), "--stages", "1", "--microbatches", "2",
                                      "--mem", "80GB", "--precision", "bf16-mixed", "--runtime", "megatron", *flags,
                                      "--out", str(plan)])
    assert solved.exit_code == 0, solved.output
    out = tmp_path / "args.sh"
    exported = CliRunner().invoke(cli, ["export", str(plan), "--to", "megatron", "--out", str(out)])
    assert exported.exit_code == 0, exported.output
    text = out.read_text()
    assert all(flag in text for flag in flags) and "NVTE_ALLOW_NONDETERMINISTIC_ALGO=0" in text
    script = tmp_path / "train.sh"
    script.write_text(text + "\ntorchrun --nproc_per_node 1 pretrain_gpt.py --seq-length 32 --max-position-embeddings 32 "
                      "--vocab-size 128 --num-attention-heads 4 ${CKPLAN_MEGATRON_ARGS[@]}\n")
    job = megatron.read(script)
    assert (job.modelled.unfused_grad_accumulation, job.modelled.log_params_norm, job.modelled.log_num_zeros_in_grad,
            job.modelled.deterministic) == (True, True, True, True)
    refused = CliRunner().invoke(cli, ["export", str(plan), "--to", "deepspeed", "--out", str(tmp_path / "ds.json")])
    assert refused.exit_code != 0 and "--deterministic-mode" in refused.output and "Traceback" not in refused.output
    assert not (tmp_path / "ds.json").exists()


def test_cudnns_dp_workspace_is_filled_on_hopper_only_by_hand():
    # T15's attention on one device: 32 query heads (8 groups), 8,192 tokens, batch 1: 32 x 8192 x 8192 x 2 B = 4 GiB
    # (cudnn-frontend v1.22.0's b * h_q * s_q * s_kv * 2, lengths padded to 64); at TP 4 and batch 2 (T18): 8 heads
    on = _setup(deterministic=True)
    arch = archs.Arch(name="tiny-gqa", hidden_size=256, intermediate_size=1024, num_layers=1, num_heads=32,
                      num_kv_heads=8, vocab_size=128, tie_word_embeddings=False, max_position_embeddings=8192)

    def block_of(gpu, seq=8192, batch=1, tp=1, cp=1):
        profile = analytic.analytic_profile(arch, Shape(seq_len=seq, micro_batch_size=batch, tp=tp, cp=cp),
                                            gpu=archs.gpu(gpu), model=FileRef(file="arch:test", sha256="0" * 64))
        return profile, next(layer for layer in layer_costs(profile) if layer.kind == "decoder_block")

    profile, block = block_of("h100")
    assert jobsettings.dp_workspace_bytes(block, profile, on) == 32 * 8192 * 8192 * 2 == 4 * 2**30
    profile, block = block_of("h100", batch=2, tp=4)
    assert jobsettings.dp_workspace_bytes(block, profile, on) == 2 * 8 * 8192 * 8192 * 2
    profile, block = block_of("h100", seq=100)  # 100 tokens pad to 128
    assert jobsettings.dp_workspace_bytes(block, profile, on) == 32 * 128 * 128 * 2
    profile, block = block_of("h100")
    assert jobsettings.dp_workspace_bytes(block, profile, _setup()) == 0  # not deterministic
    # the A100 runs FlashAttention-2 under determinism, the GB200 and B200 another cuDNN kernel (or FlashAttention-2
    # under dropout): no dP workspace read; a context-parallel ring's calls are not read
    for gpu in ("a100-80g", "gb200", "b200"):
        profile, block = block_of(gpu)
        assert jobsettings.dp_workspace_bytes(block, profile, on) == 0
    profile, block = block_of("h100", cp=2)
    assert jobsettings.dp_workspace_bytes(block, profile, on) == 0
