"""A layer's backward extra in FSDP2's replay as the tensors its record makes (fsdp2_layers.backward_program,
fsdp2_events._Step.extra): counted by hand on hand-made records, by the allocator's rules where the tensors reuse
cached blocks one block would not, and carried from a record the profiler takes of a tiny LLaMA block."""



from fixtures import llama_style as llama
from fixtures.fake_records import llama_block_records

from planner.cost import allocator
from planner.cost.allocator import Alloc, Free
from planner.cost.fsdp2_events import DEFAULT, Fsdp2Layer, Fsdp2Stage, _PipelineStep, step_events
from planner.cost.fsdp2_layers import backward_hand, backward_program
from planner.profiler.allocseq import synthesised
from planner.schema import AllocRecord, LayerProfile

MIB = 2**20


def _layer(**update) -> LayerProfile:
    fields = dict(name="b", kind="block", fwd_ms=1, bwd_ms=2, fwd_ms_min=1, fwd_ms_max=1, bwd_ms_min=2, bwd_ms_max=2,
                  act_bytes=700, input_bytes=100, output_bytes=100, input_in_act_bytes=100, param_count=10,
                  param_bytes=20, transient_bytes=400)
    return LayerProfile(**{**fields, **update})


def test_an_analytic_blocks_program_by_hand():
    # kept: the input (100, the previous layer's), 200, 400; output 100; transient 400 = the incoming
    # gradient 100 + a scratch of two 150s; the input's gradient (100) is the previous layer's incoming one
    layer = synthesised(_layer(), [100, 200, 400], scratch_terms=[150, 150])
    assert layer.alloc_records["none"].backward == [150, 150, 100, -5, -4, -2, -1]
    # none, extra = the transient: incoming, the two scratch tensors; the input's gradient would pass it
    assert backward_program(layer, "none", 400) == (100, 150, 150)
    # 50 more counted beyond the record (e.g. tensor parallelism's gathered inputs): one tensor after the incoming
    assert backward_program(layer, "none", 450) == (100, 50, 150, 150)
    # full, extra = transient + the recompute (700 - 100): the kept tensors again, then the scratch
    assert backward_program(layer, "full", 1000) == (100, 200, 400, 150, 150)
    # no record for the option, or an extra below the incoming gradient: one block
    assert backward_program(layer, "core-attn", 1000) == () and backward_program(layer, "none", 99) == ()


def test_a_records_frees_inside_the_backward_are_played_renumbered():
    # forward: the output (id 1); backward: 30 (2), 20 (3), free 2, 40 (4), free 3, 10 (5): peak 60 after 40
    record = AllocRecord(forward=[50], backward=[30, 20, -2, 40, -3, 10, -1], output=1, input_grad=5)
    layer = _layer(output_bytes=50, alloc_records={"full": record})
    # incoming 50 + residual 10 + the record's peak 60 = 120; its ids 2..5 become 3..6 after those two
    assert backward_program(layer, "full", 120) == (50, 10, 30, 20, -3, 40, -4, 10)
    # its events: the frees inside, the rest alive to the layer's end
    step = _PipelineStep(_stage((Fsdp2Layer(**{**_empty().__dict__, "extra_bytes": 120,
                                                "extra_program": backward_program(layer, "full", 120)}),)), [])
    alive = step.extra(0, step.stage.layers[0])
    keys = [(type(e).__name__, e.key[2]) for e in step.events]
    assert keys == [("Alloc", 1), ("Alloc", 2), ("Alloc", 3), ("Alloc", 4), ("Free", 3), ("Alloc", 5), ("Free", 4),
                    ("Alloc", 6)] and alive == [("extra", 0, n) for n in (1, 2, 5, 6)]


def _empty() -> Fsdp2Layer:
    return Fsdp2Layer(unit=0, kept_bytes=0, extra_bytes=0, gathered=(), grads=(), shard=(), state=(), scratch=())


def _stage(layers, **update) -> Fsdp2Stage:
    fields = dict(layers=layers, kept_from_forward=frozenset({0}), shard_group=2, reduce_ratio=2.0, buffer_bytes=0,
                  loss_kept_bytes=0, loss_extra_bytes=0, actions=(("F", 0), ("B", 0)))
    return Fsdp2Stage(**{**fields, **update})


def test_the_backwards_tensors_reuse_the_losss_cached_blocks_where_one_block_takes_a_segment():
    """One step, one layer beside a pipeline, nothing but the loss's scratch and the layer's extra. The loss makes
    two 12 MiB tensors (its largest 12 MiB): each >= 10 MiB, a segment of its own (24 MiB reserved), both freed.
    The layer's extra, 24 MiB: as one block no cached block fits it (two 12 MiB segments never merge), a third
    segment: 48 MiB; as its two 12 MiB tensors each best-fits a cached segment whole: 24 MiB. Allocated: 24 both."""
    one = Fsdp2Layer(**{**_empty().__dict__, "extra_bytes": 24 * MIB})
    cut = Fsdp2Layer(**{**one.__dict__, "extra_program": (12 * MIB, 12 * MIB)})
    got = {}
    for name, layer in (("one", one), ("cut", cut)):
        stage = _stage((layer,), loss_extra_bytes=24 * MIB, loss_tensor_bytes=12 * MIB)
        replayed = allocator.replay(step_events(stage, steps=1))
        got[name] = (replayed.reserved_peak_bytes // MIB, replayed.allocated_peak_bytes // MIB, replayed.segments)
    assert got == {"one": (48, 24, 3), "cut": (24, 24, 2)}


def test_a_tiny_llama_blocks_record_is_carried_into_the_replay_tensor_by_tensor():
    """The record the profiler takes of a LLaMA block's backward (allocseq.layer_records, the fake profiler's
    recorder, under FakeTensorMode as `ckplan profile --fake` runs it) played as the layer's extra: its
    allocations in the record's order and sizes after the incoming gradient, its frees inside the backward
    where the record has them, and the replay's allocated peak the record's own."""
    record = llama_block_records()["none"]
    incoming = llama.SEQ * llama.DIM * 2
    made = [code for code in record.backward if code > 0]
    # the record's running peak over what its backward makes (its frees of the forward's tensors aside)
    first = sum(1 for code in record.forward if code > 0)
    live, peak, sizes = 0, 0, {}
    for code in record.backward:
        if code > 0:
            first += 1
            sizes[first] = code
            live += code
            peak = max(peak, live)
        elif -code in sizes:
            live -= sizes.pop(-code)
    layer = _layer(output_bytes=incoming, alloc_records={"none": record})
    program = backward_program(layer, "none", incoming + peak)
    assert [code for code in program if code > 0] == [incoming, *made]
    assert any(code < 0 for code in program[: len(program) - 1])  # freed inside the backward
    # SwiGLU's backward: the two gradients f wide (SiLU's and the up projection's) alive at once, as the
    # analytic block's scratch counts them (analytic.block_scratch_terms)
    wide = llama.SEQ * llama.HIDDEN * 2
    assert [code for code in program if code > 0].count(wide) >= 2
    step = _PipelineStep(_stage((Fsdp2Layer(**{**_empty().__dict__, "extra_bytes": incoming + peak,
                                                "extra_program": program}),)), [])
    alive = step.extra(0, step.stage.layers[0])
    events = step.events + [Free(("extra", 0, n)) for n in alive]
    assert allocator.replay(events).allocated_peak_bytes == allocator.replay(
        [Alloc("in", incoming, DEFAULT), *_record_events(record)]).allocated_peak_bytes


def _record_events(record: AllocRecord):
    """The record's backward as allocator events, on its own ids (frees of the forward's tensors dropped)."""
    ident, events, made = sum(1 for code in record.forward if code > 0), [], set()
    for code in record.backward:
        if code > 0:
            ident += 1
            made.add(ident)
            events.append(Alloc(ident, code, DEFAULT))
        elif -code in made:
            events.append(Free(-code))
    return events


def _swiglu_like() -> LayerProfile:
    # kept: the input (100), 200; output 100; transient 550 = the incoming 100 + SwiGLU-like scratch 3 x 150, the
    # first freed once the other two are made; then the input's gradient (100)
    return synthesised(_layer(transient_bytes=550), [100, 200], scratch_terms=[150, 150, 150], scratch_freed_early=1)


def test_the_input_gradient_made_within_the_extra_is_handed_on():
    layer = _swiglu_like()
    # forward: 200 (id 1), the output (2); backward: 150 (3), 150 (4), 150 (5), free 3, the gradient (6), ...
    assert layer.alloc_records["none"].backward == [150, 150, 150, -3, 100, -5, -4, -1]
    # incoming 100 + 450 = 550; after the first's free, 100 + 300 + the gradient 100 = 500: it fits, id 5; the
    # mul's two freed after it; the incoming and the gradient alive at the end
    assert backward_hand(layer, "none", 550) == ((100, 150, 150, 150, -2, 100, -4, -3), 5)
    # where the extra holds less than the record's peak, the cut comes first: nothing handed
    assert backward_hand(layer, "none", 400) == ((100, 150, 150), 0)


def test_one_gradient_goes_from_a_layer_to_the_one_before_and_is_freed_at_its_end():
    """Two layers beside a pipeline (units 0 and 1), one microbatch. Layer 1 makes its input's gradient (100) and
    keeps it through its weights' gradient (200) and its post-backward's upcast (200, reduce ratio 1); layer 0 takes
    it as its received gradient (no 100 made for it) and frees it at its end; layer 0's own input gradient is freed
    at the stage's end, after its post-backward."""
    layer = _swiglu_like()
    program, hands = backward_hand(layer, "none", 550)
    fsdp = [Fsdp2Layer(**{**_empty().__dict__, "unit": u, "extra_bytes": 550, "extra_program": program,
                          "hands": hands, "grads": (200,)}) for u in (0, 1)]
    stage = _stage(tuple(fsdp), reduce_ratio=1.0)
    step = _PipelineStep(stage, [])
    step.begin()
    step.forward_mb(0)
    step.backward_mb(0)
    made = [(e.key, e.nbytes) for e in step.events if isinstance(e, Alloc) and e.key[0] == "extra"]
    # layer 1: 100 (received from the loss), 150 x 3, its input gradient 100; layer 0: the 150s and its gradient
    assert [size for _, size in made] == [100, 150, 150, 150, 100, 150, 150, 150, 100]
    order = [(type(e).__name__, e.key) for e in step.events]
    handed = ("Free", ("extra", 1, 5))
    # layer 1's gradient outlives its post-backward's upcast and is freed at layer 0's end, before layer 0's upcast
    assert order.index(("Alloc", ("acc", 1, 0))) < order.index(("Alloc", ("extra", 0, 2))) < order.index(handed) \
        < order.index(("Alloc", ("acc", 0, 0))) < order.index(("Free", ("extra", 0, 5))) == len(order) - 1
    assert ("Alloc", ("extra", 0, 1)) not in order and order.count(handed) == 1
    # allocated, by hand: at layer 0's extra's peak, layer 1's upcast 200, the received 100 and the three 150s, each
    # request rounded up to 512 B (the caching allocator's smallest block): five
    assert allocator.replay(step.events).allocated_peak_bytes == 5 * 512


def test_the_losss_requests_are_torchs_cross_entropys_at_the_forward_and_the_backward():
    """torchtitan 9dec370's loss, F its fp32 logits: on vocab-parallel logits (TP 2) the backward's scratch is
    loss_parallel's zeros, exp, sum, product (peak 3F), the forward's the copy, the shifted logits and exp; on whole
    ones aten's zeros and log_softmax's gradient (peak 2F) and the copy; each forward leaves its result alive. What the cost model's scratch holds beyond
    the peak comes first, one tensor; where it holds less, no program (tensors of the largest size, as before)."""
    from test_bridge_memory import profile, setup

    from planner.cost.fsdp2_layers import loss_forward_program, loss_program

    for tp in (2, 1):
        tiny, run = profile(tp=tp, sp=tp > 1), setup(runtime="torchtitan", runtime_version="9dec370", tp=tp)
        f = tiny.layers[-1].output_bytes * 2  # the bf16 logits' bytes, twice
        if tp == 2:
            assert loss_program(tiny, run, 3 * f) == (f, f, f, -2, f, -1, -3, -4)
            assert loss_program(tiny, run, 3 * f + 10) == (10, f, f, f, -3, f, -2, -4, -5, -1)
            assert loss_forward_program(tiny, run) == (f, f, f, -3, f, -2, -1)  # the result (id 4) kept
        else:
            assert loss_program(tiny, run, 2 * f) == (f, f, -1, -2)
            assert loss_forward_program(tiny, run) == (f, f, -1)  # the result (id 2) kept
        assert loss_program(tiny, run, f) == ()
    megatron = setup(tp=2)
    assert loss_program(profile(tp=2, sp=True), megatron, 10**9) == () == loss_forward_program(profile(), setup())


def test_the_losss_product_reuses_exps_freed_block():
    """Played: the loss's backward scratch as loss_parallel makes it, 12 MiB tensors (each >= 10 MiB: a segment of its
    own); its product best-fits exp's freed segment: three segments, 36 MiB reserved, not four."""
    f = 12 * MIB
    program = (f, f, f, -2, f, -1, -3, -4)
    stage = _stage((_empty(),), loss_extra_bytes=3 * f, loss_tensor_bytes=f, loss_program=program)
    step = _PipelineStep(stage, [])
    step.loss_scratch()
    keys = [(type(e).__name__, e.key) for e in step.events]
    assert keys == [("Alloc", ("loss_extra", 1)), ("Alloc", ("loss_extra", 2)), ("Alloc", ("loss_extra", 3)),
                    ("Free", ("loss_extra", 2)), ("Alloc", ("loss_extra", 4)), ("Free", ("loss_extra", 1)),
                    ("Free", ("loss_extra", 3)), ("Free", ("loss_extra", 4))]
    replayed = allocator.replay(step.events)
    assert (replayed.allocated_peak_bytes, replayed.reserved_peak_bytes) == (3 * f, 3 * f) and replayed.segments == 3
