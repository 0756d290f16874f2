"""Where FSDP2's replay makes a layer's weights' gradients: inside its backward program, where autograd makes each
(fsdp2_layers.grads_order, fsdp2_events._Step.extra), counted by hand on a LLaMA block's analytic record and on
the LM head's program, and played as events on a two-linear block."""

from planner.cost import allocator
from planner.cost.allocator import Alloc, Free
from planner.cost.fsdp2_events import Fsdp2Layer, Fsdp2Stage, _PipelineStep
from planner.cost.fsdp2_layers import backward_hand, grads_order
from planner.profiler.allocseq import synthesised
from planner.schema import LayerProfile

MIB = 2**20


def _block() -> LayerProfile:
    # kept: the input (100, the previous layer's), 200, 400; output 100; transient 550 = the incoming gradient 100
    # + SwiGLU's three f-wide gradients of 150 (w2's input gradient first, freed once the `mul` made the other two)
    fields = dict(name="b", kind="decoder_block", fwd_ms=1, bwd_ms=2, fwd_ms_min=1, fwd_ms_max=1, bwd_ms_min=2,
                  bwd_ms_max=2, act_bytes=700, input_bytes=100, output_bytes=100, input_in_act_bytes=100,
                  param_count=10, param_bytes=20, transient_bytes=550)
    return synthesised(LayerProfile(**fields), [100, 200, 400], scratch_terms=[150, 150, 150], scratch_freed_early=1)


def test_a_llama_blocks_weights_gradients_fall_where_each_linear_makes_them():
    program, hands = backward_hand(_block(), "full", 1150)
    # incoming 100; the recompute 200, 400 (ids 2, 3); w2's input gradient 150 (id 4), the mul's two (5, 6);
    # w2's input gradient freed; the block's input gradient 100 (id 7, handed on); the two and the recompute freed
    assert program == (100, 200, 400, 150, 150, 150, -4, 100, -6, -5, -3, -2) and hands == 7
    # aten's mm: w2's gradient (tensor 5) before its input's (code 3); then w3, w1, ffn_norm, wo, wv, wk, wq,
    # attention_norm before the block's input gradient (code 7)
    after_mul = ((7, 6), (7, 4), (7, 8), (7, 3), (7, 2), (7, 1), (7, 0), (7, 7))
    assert grads_order("decoder_block", 9, program, hands, input_grad_first=False) == ((3, 5), *after_mul)
    # torchao's Float8 linear: w2's input gradient first, its weight's next (before the mul's first, code 4)
    assert grads_order("decoder_block", 9, program, hands, input_grad_first=True) == ((4, 5), *after_mul)
    # not a 9-tensor block, or no input gradient in the program: the program does not say
    assert grads_order("decoder_block", 1, program, hands, input_grad_first=False) == ()
    assert grads_order("decoder_block", 9, program, 0, input_grad_first=False) == ()


def test_the_heads_output_gradient_before_its_linears_input_gradient():
    # under SP: the logits' gradient received (id 1), the input's gradient whole (2), the reduce-scatter's shard
    # (3, handed on), the whole freed: the output's gradient (tensor 1) before code 1
    assert grads_order("norm+lm_head", 2, (1002, 1024, 128, -2), 3, input_grad_first=False) == ((1, 1),)
    # a residual first: the whole input gradient is code 4 (id 5), freed right after the handed shard (id 6)
    program = (1002, 896, 1, 128, 1024, 128, -5, -4, -3)
    assert grads_order("norm+lm_head", 2, program, 6, input_grad_first=False) == ((4, 1),)
    # without SP the input's gradient is the handed tensor itself
    assert grads_order("norm+lm_head", 2, (1002, 1024), 2, input_grad_first=False) == ((1, 1),)


def _two_linears(grads_at) -> Fsdp2Layer:
    """A block y = w2(w1(x)) beside a pipeline: received gradient 4 MiB, w2's input gradient 12 MiB, the block's
    input gradient 4 MiB (handed on); w1's gradient 6 MiB, w2's 8 MiB."""
    return Fsdp2Layer(unit=0, kept_bytes=0, extra_bytes=20 * MIB, gathered=(), grads=(6 * MIB, 8 * MIB), shard=(),
                      state=(), scratch=(), extra_program=(4 * MIB, 12 * MIB, 4 * MIB, -2), hands=3, grads_at=grads_at)


def _stage(layer) -> Fsdp2Stage:
    return Fsdp2Stage(layers=(layer,), kept_from_forward=frozenset({0}), shard_group=2, reduce_ratio=2.0,
                      buffer_bytes=0, loss_kept_bytes=0, loss_extra_bytes=0, actions=(("F", 0), ("B", 0)))


def test_a_two_linear_blocks_backward_event_by_event():
    # aten's order: w2's weight gradient, w2's input gradient, w1's weight gradient, w1's input gradient
    layer = _two_linears(((1, 1), (2, 0)))
    step = _PipelineStep(_stage(layer), [])
    step.begin()
    handed = step.backward_layer(0, layer, None, [("kept", 0, 0)])
    assert [(type(e).__name__, e.key, getattr(e, "nbytes", 0) // MIB) for e in step.events] == [
        ("Free", ("sharded_grad", 0), 0),
        ("Alloc", ("extra", 0, 1), 4), ("Alloc", ("grad", 0, 1), 8), ("Alloc", ("extra", 0, 2), 12),
        ("Alloc", ("grad", 0, 0), 6), ("Alloc", ("extra", 0, 3), 4), ("Free", ("extra", 0, 2), 0),
        ("Free", ("extra", 0, 1), 0), ("Free", ("kept", 0, 0), 0)]
    assert handed == (("extra", 0, 3), 4 * MIB)
    # as before (grads_at empty): the weights' gradients after the program, in the parameters' order
    before = _PipelineStep(_stage(_two_linears(())), [])
    before.begin()
    before.backward_layer(0, before.stage.layers[0], None, [("kept", 0, 0)])
    assert [e.key for e in before.events if isinstance(e, Alloc)] == [
        ("extra", 0, 1), ("extra", 0, 2), ("extra", 0, 3), ("grad", 0, 0), ("grad", 0, 1)]
    assert [e.key for e in before.events if isinstance(e, Free)][1:3] == [("extra", 0, 2), ("extra", 0, 1)]


def test_where_the_gradients_are_made_moves_the_layers_allocated_peak_by_hand():
    # received 4, w2's input gradient 12, the block's input gradient 4, the 12 freed once w1's backward used it
    # - aten's order (w2's 8 before code 1, w1's 6 before code 2): 4, 12, 24, 30, 34, then 22: peak 34;
    # - as before (after the program, in the parameters' order): 4, 16, 20, the free 8, then 14, 22: peak 22
    #   (the program's own free comes before the gradients: they never meet w2's input gradient)
    peaks = {}
    for name, grads_at in (("aten", ((1, 1), (2, 0))), ("before", ())):
        step = _PipelineStep(_stage(_two_linears(grads_at)), [])
        step.backward_layer(0, step.stage.layers[0], None, [("kept", 0, 0)])
        events = [Alloc(("kept", 0, 0), 0, 0), *step.events, Free(("extra", 0, 3))]
        peaks[name] = allocator.replay(events).allocated_peak_bytes // MIB
    assert peaks == {"aten": 34, "before": 22}
