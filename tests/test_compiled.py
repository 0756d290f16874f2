"""torch.compile's memory from the compiler's own decisions: the compiled loss read from inductor's
generated code (planner/profiler/inductor_buffers.py) and a compiled block's saved tensors from
AOTAutograd's partition (planner/profiler/compiled.py)."""

import functools
from pathlib import Path

import torch.nn.functional as F
from click.testing import CliRunner
from fixtures.aot_graphs import graph_keeping_backend

from planner.profiler import inductor_buffers
from planner.profiler.compiled import partition_llama_block

# torchtitan's compiled loss as inductor 2.13 wrote it for 64 tokens x 128 vocab (CPU), abridged to
# the wrapper's call(): forward then backward
_FORWARD = '''
    def call(self, args):
        primals_1, primals_2 = args
        args.clear()
        assert_size_stride(primals_1, (1, 64, 128), (8192, 128, 1), 'input')
        buf0 = empty_strided_cpu((64, 1), (1, 1), torch.float32)
        buf1 = empty_strided_cpu((64, 1), (1, 64), torch.float32)
        buf2 = reinterpret_tensor(buf1, (64, 1), (1, 1), 0); del buf1  # reuse
        buf3 = empty_strided_cpu((), (), torch.int64)
        buf5 = empty_strided_cpu((), (), torch.float32)
        buf4 = empty_strided_cpu((), (), torch.float32)
        buf6 = buf5; del buf5  # reuse
        cpp_fused__log_softmax__to_copy_nll_loss_forward_view_0(buf2, buf6, primals_1, primals_2, buf0, buf3, buf4)
        return (buf6, primals_1, primals_2, buf0, buf2, buf4, )
'''
_BACKWARD = '''
    def call(self, args):
        primals_1, primals_2, amax, log, convert_element_type_1, tangents_1 = args
        args.clear()
        buf0 = empty_strided_cpu((64, 1), (1, 64), torch.float32)
        buf1 = empty_strided_cpu((64, 128), (128, 1), torch.bfloat16)
        cpp_fused__log_softmax__log_softmax_backward_data_0(primals_2, tangents_1, convert_element_type_1, primals_1, amax, log, buf0, buf1)
        del amax
        del buf0
        del convert_element_type_1
        del log
        del primals_1
        del primals_2
        del tangents_1
        return (reinterpret_tensor(buf1, (1, 64, 128), (8192, 128, 1), 0), None, )
'''
LOGITS = 64 * 128 * 2
# kept: the bf16 logits (saved as primals_1), the fp32 max and log-sum-exp per token, one fp32 scalar
KEPT = LOGITS + 64 * 4 + 64 * 4 + 4
# the backward's peak: what is kept, the scalar gradient of the loss, a per-token fp32 scratch and
# the logits' bf16 gradient
PEAK = KEPT + 4 + 64 * 4 + LOGITS


def test_the_compiled_losss_wrappers_are_replayed_to_its_kept_and_peak_bytes():
    found = inductor_buffers.loss_bytes(_FORWARD, _BACKWARD, logits_bytes=LOGITS)
    assert (found.kept_bytes, found.peak_bytes) == (KEPT, PEAK)
    assert (round(found.kept_x, 4), round(found.peak_x, 4)) == (1.0315, 2.0474)


def test_torchtitans_loss_compiled_now_keeps_its_logits_and_peaks_at_their_gradient():
    def titan(pred, labels):  # torchtitan bbb1b616 train.py loss_fn
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    found, _ = inductor_buffers.compiled_loss(titan, tokens=64, vocab=128)
    assert (found.kept_bytes, found.peak_bytes) == (KEPT, PEAK)


def test_a_wrapper_statement_not_known_is_refused_not_skipped():
    import pytest

    odd = _FORWARD.replace("buf3 = empty_strided_cpu((), (), torch.int64)", "buf3 = torch.empty(8)")
    with pytest.raises(ValueError, match="does not know"):
        inductor_buffers.run_call(odd, {"primals_1": LOGITS, "primals_2": 0})


# A tiny torchtitan LLaMA block: 16 tokens, hidden 64, 4 heads of 16 (2 K/V heads), SwiGLU 128, bf16.
TOKENS, H, Q, KV, F_, HEADS = 16, 64, 64, 32, 128, 4


@functools.cache
def _partition(policy):
    return partition_llama_block(batch=1, seq=TOKENS, hidden=H, heads=HEADS, kv_heads=2, ffn=F_, policy=policy)


def test_a_compiled_block_saves_what_the_partitioner_chose_counted_by_hand():
    # no recompute: the input, the attention norm's 1/rms (fp32) and output, Q and the K and V repeated
    # to every head (sdpa's inputs), the logsumexp (fp32 per head), sdpa's output, wo's output (the
    # residual sum is recomputed from it and the input), the MLP norm's 1/rms and output, the gate,
    # the up projection and their product; SiLU's output and both norms' fp32 casts are recomputed
    per_token = 2 * (H + H + Q + Q + Q + Q + H + H + 3 * F_) + 4 + 4 + 4 * HEADS
    none = _partition("none")
    assert none.saved_bytes == TOKENS * per_token
    assert "mm_3" in none.saved and "rsqrt" in none.saved


def test_op_level_sac_compiled_drops_the_mlp_output_the_eager_policy_caches():
    # torchtitan's policy saves wq's, wv's and w1's outputs (mms 1, 3, 5), sdpa's output and
    # logsumexp; w2's (mm 7) is marked saved but the backward never reads it, so the partition
    # does not keep it (eager SAC caches it: planner/profiler/opsac.py counts it)
    per_token = 2 * (H + Q + KV + Q + F_) + 4 * HEADS
    assert _partition("op-sac").saved_bytes == TOKENS * per_token


def test_a_whole_block_checkpoint_compiled_keeps_only_its_input():
    assert _partition("full").saved == ("primals_1",)
    assert _partition("full").saved_bytes == TOKENS * 2 * H


# ---------------------------------------------------------------- the analytic formula and --compile

def test_the_analytic_formula_is_the_partitioners_on_the_tiny_block():
    from planner.models import archs
    from planner.profiler.analytic import Shape
    from planner.profiler.compiled_kept import compiled_kept_bytes

    arch = archs.Arch(name="tiny", hidden_size=H, intermediate_size=F_, num_layers=1, num_heads=HEADS,
                      num_kv_heads=2, vocab_size=128, tie_word_embeddings=False)
    found = compiled_kept_bytes(arch, Shape(seq_len=TOKENS, micro_batch_size=1), moe=False)
    assert found == {policy: _partition(policy).saved_bytes for policy in ("none", "full", "op-sac")}
    # not checked against the partitioner: not recorded
    assert compiled_kept_bytes(arch, Shape(seq_len=TOKENS, micro_batch_size=1, tp=2, sp=True), moe=False) == {}


def _tiny_profile(tmp_path, *, compiled):
    from fixtures.tiny_compiled import tiny_profile

    return tiny_profile(tmp_path, compiled=compiled)


def _evaluate(path, *extra):
    from fixtures.tiny_compiled import evaluate_hand

    hand, said = evaluate_hand(path, *extra)
    return hand["stages"][0]["peak_bytes"], said


def test_compile_charges_the_blocks_what_the_profile_recorded_under_compile(tmp_path):
    profile, path = _tiny_profile(tmp_path, compiled=True)
    blocks = [layer for layer in profile.layers if layer.compiled_kept_bytes]
    assert len(blocks) == 2
    eager, _ = _evaluate(path)
    compiled, said = _evaluate(path, "--compile")
    # both blocks keep their activations (no recompute) to the backward: each keeps less by the difference,
    # less the K and V repeated to 4 heads from 2 that the partition counts in its figures and eager charges
    # beside the profile's (planner/cost/repeatedkv.py: 2 x 8,192 tokens x 2 heads x 16 x 2 B a block)
    repeated = 2 * 8 * 1024 * 2 * 16 * 2
    assert eager - compiled == sum(b.act_bytes - b.compiled_kept_bytes["none"] + repeated for b in blocks) > 0
    assert "2 of 4 layers keep what the profile recorded under compile" in said


def test_compile_on_a_profile_without_compiled_figures_changes_no_layer_and_says_so(tmp_path):
    _, path = _tiny_profile(tmp_path, compiled=False)
    assert _evaluate(path)[0] == _evaluate(path, "--compile")[0]  # 9dec370: the loss is not compiled either
    assert "the profile recorded no layer's kept bytes under compile" in _evaluate(path, "--compile")[1]


def test_profile_compiled_records_the_blocks_figures_and_only_for_arch_profiles(tmp_path):
    from click.testing import CliRunner

    from planner import io
    from planner.cli import cli

    out = tmp_path / "l8.json"
    result = CliRunner().invoke(cli, ["profile", "--arch", "llama3-8b", "--seq-len", "128", "--micro-batch-size", "1",
                                      "--compiled", "--out", str(out)])
    assert result.exit_code == 0, result.output
    layers = io.load_profile(out).layers
    assert [bool(layer.compiled_kept_bytes) for layer in layers] == [False] + [True] * 32 + [False]
    # 128 tokens x (2 B x (4 x 4096 + 4 x 4096 + 3 x 14336) + 8 + 4 x 32 heads): compiled_kept.py's formula
    assert layers[1].compiled_kept_bytes["none"] == 128 * (2 * (8 * 4096 + 3 * 14336) + 8 + 128)
    refused = CliRunner().invoke(cli, ["profile", "model.py", "--compiled"])
    assert refused.exit_code != 0 and "--arch" in refused.output and "Traceback" not in refused.output
    # where the formula does not hold (TP), the profile is written and says that no block got figures
    tp = CliRunner().invoke(cli, ["profile", "--arch", "llama3-8b", "--seq-len", "128", "--micro-batch-size", "1",
                                  "--tp", "2", "--compiled", "--out", str(tmp_path / "tp.json")])
    assert tp.exit_code == 0 and "no block of llama3-8b got compiled figures" in tp.output
    assert not any(layer.compiled_kept_bytes for layer in io.load_profile(tmp_path / "tp.json").layers)


def test_a_fake_profile_compiled_records_each_layers_partition(tmp_path):
    from planner import io
    from planner.cli import cli

    out = tmp_path / "f.json"
    # llama_style.py with one decoder block, not two: the partition is taken once per layer kind
    # (profile_fake._with_compiled), so a second block adds only its fake run (about a third of the
    # test's CPU time), nothing read here
    source = (Path(__file__).parent / "fixtures" / "llama_style.py").read_text()
    assert "\nLAYERS = 2\n" in source
    model = tmp_path / "llama_style.py"
    model.write_text(source.replace("\nLAYERS = 2\n", "\nLAYERS = 1\n"))
    result = CliRunner().invoke(cli, ["profile", str(model), "--fake", "--compiled", "--device", "cpu", "--dtype",
                                      "float32", "--micro-batch-size", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    layers = io.load_profile(out).layers
    assert [layer.name for layer in layers] == ["0", "1", "2", "3"]  # embedding, block, final norm, head
    tokens, x = 2 * 32, 2 * 32 * 64 * 4  # the fixture's sequences of 32, width 64, fp32
    assert [layer.compiled_kept_bytes for layer in (layers[0], layers[2])] == [
        {"none": tokens * 8, "full": tokens * 8},  # the embedding keeps its int64 token ids
        {"none": x + tokens * 4, "full": x},  # the final RMSNorm: its input and 1/rms (fp32); its output recomputed
    ]
    assert layers[3].compiled_kept_bytes == {"none": x, "full": x}  # the head keeps its input
    block = layers[1]  # compiled keeps less than eager: the partition recomputes its pointwise ops
    assert block.input_bytes == block.compiled_kept_bytes["full"] < block.compiled_kept_bytes["none"] < block.act_bytes


def test_torch_compile_of_torchtitans_checkpoint_wrappers_saves_what_the_tagged_partition_saves():
    """dynamo traces torch.utils.checkpoint (and a selective checkpoint's policy) into the tags
    compiled._tag sets by hand: compiled through dynamo the tiny block saves the same bytes."""
    from collections import defaultdict

    import torch
    from torch.utils.checkpoint import (
        CheckpointPolicy,
        checkpoint,
        create_selective_checkpoint_contexts,
    )

    from planner.profiler import compiled

    backend, graphs = graph_keeping_backend()
    block = functools.partial(compiled.llama_block, heads=HEADS, kv_heads=2)
    saved_ops = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    def op_sac():  # torchtitan's _get_custom_policy: every second mm recomputed, per pass
        counts = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            counts[mode] += func == torch.ops.aten.mm.default
            save = func in saved_ops and not (func == torch.ops.aten.mm.default and counts[mode] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)

    wrapped = {"none": block, "full": lambda *a: checkpoint(block, *a, use_reentrant=False),
               "op-sac": lambda *a: checkpoint(block, *a, use_reentrant=False, context_fn=op_sac)}
    for policy, fn in wrapped.items():
        torch._dynamo.reset()
        inputs = compiled.llama_block_inputs(batch=1, seq=TOKENS, hidden=H, heads=HEADS, kv_heads=2, ffn=F_)
        torch.compile(fn, backend=backend)(*inputs).sum().backward()
        found = compiled._read(graphs["fw"], graphs["bw"], num_outputs=1, activation_inputs=(0,))
        assert (found.saved_bytes, found.saved) == (_partition(policy).saved_bytes, _partition(policy).saved), policy
