"""Each layer's forward requests in FSDP2's replay (fsdp2_layers.forward_program, fsdp2_events._Step.forward_scratch)
and each microbatch's output made before its loss on a pipeline's last stage (fsdp2_chunks._ChunkedStep.run, torch
2.6.0 stage.py 703 then schedules.py _maybe_compute_loss): by hand on hand-made records, and on the record the fake
profiler's recorder takes of a tiny LLaMA block under full checkpointing."""



from fixtures import llama_style as llama
from fixtures.fake_records import llama_block_records

from planner.cost import allocator
from planner.cost.allocator import Alloc, Free
from planner.cost.float8 import with_float8
from planner.cost.fsdp2_chunks import Fsdp2Rank, _ChunkedStep
from planner.cost.fsdp2_events import DEFAULT, Fsdp2Layer, Fsdp2Stage, _PipelineStep, _Step
from planner.cost.fsdp2_layers import backward_program, forward_program, program_kept_bytes
from planner.profiler.allocseq import synthesised
from planner.schema import AllocRecord, LayerProfile

MIB = 2**20


def _layer(**update) -> LayerProfile:
    fields = dict(name="b", kind="block", fwd_ms=1, bwd_ms=2, fwd_ms_min=1, fwd_ms_max=1, bwd_ms_min=2, bwd_ms_max=2,
                  act_bytes=700, input_bytes=100, output_bytes=100, input_in_act_bytes=100, param_count=10,
                  param_bytes=20, transient_bytes=400)
    return LayerProfile(**{**fields, **update})


def _empty(**update) -> Fsdp2Layer:
    fields = dict(unit=0, kept_bytes=0, extra_bytes=0, gathered=(), grads=(), shard=(), state=(), scratch=())
    return Fsdp2Layer(**{**fields, **update})


def test_a_checkpointed_analytic_blocks_forward_is_its_rerun_freed_at_each_last_use_by_hand():
    # kept under none: the input (100, the previous layer's), 200, 400, 300; output 100; transient 400 = the
    # incoming gradient 100 + two 150s. Full's backward reruns 200, 400, 300 before its scratch (extra 1000 + 300).
    # Last uses: the input to the end, 200 once 400 is made, 400 as made, 300 to the end
    layer = synthesised(_layer(act_bytes=1000), [100, 200, 400, 300], scratch_terms=[150, 150],
                        last_uses=(None, 2, 2, None))
    assert layer.alloc_records["full"].rerun_forward == [200, 400, -1, -2, 300]
    assert backward_program(layer, "full", 1300) == (100, 200, 400, 300, 150, 150)
    assert forward_program(layer, "full", 1300) == (200, 400, -1, -2, 300)
    # 50 the extra counts beyond the record (tensor parallelism's gathered inputs, Float8's casts, repeat_kv's
    # copies): made first, alive to the forward's end, the record's ids after it
    assert backward_program(layer, "full", 1350) == (100, 50, 200, 400, 300, 150, 150)
    assert forward_program(layer, "full", 1350) == (50, 200, 400, -2, -3, 300)
    # none keeps what its forward makes: nothing beyond the kept block; no record for the option: nothing
    assert forward_program(layer, "none", 400) == () and forward_program(layer, "core-attn", 1300) == ()
    # Float8's casts, made first in the record's backward (float8.with_float8): not the rerun's terms, so in the
    # one tensor with what the extra counts beyond the record
    cast = layer.model_copy(update={"alloc_records": {
        name: with_float8(record, kept=0, transient=70) for name, record in layer.alloc_records.items()}})
    assert backward_program(cast, "full", 1420) == (100, 50, 70, 200, 400, 300, 150, 150)
    assert forward_program(cast, "full", 1420) == (120, 200, 400, -2, -3, 300)
    # no lifetimes read (a family analytic_lifetimes.forward_last_uses does not name): nothing, not a bound
    bare = synthesised(_layer(act_bytes=1000), [100, 200, 400, 300], scratch_terms=[150, 150])
    assert bare.alloc_records["full"].rerun_forward == [] and forward_program(bare, "full", 1350) == ()


def test_an_analytic_tiny_llama_blocks_checkpointed_forward_peaks_where_its_fake_record_does():
    """The analytic block of tests/fixtures/llama_style.py's shapes (flash attention): its checkpointed forward,
    each term freed at the last use analytic_lifetimes.forward_last_uses reads from torchtitan's code, peaks at the
    fake recorder's record of the real block under torch.utils.checkpoint to the byte (10.25x the block's input,
    the allocator's 512-byte rounding in both: the residual stream, the MLP's input, SiLU's output, the up
    projection's and the product); held to the forward's end, the same tensors would take 16.9x."""
    from planner.models import archs
    from planner.profiler import analytic
    from planner.profiler.formulas import Shape

    arch = archs.Arch(name="tiny", hidden_size=llama.DIM, intermediate_size=llama.HIDDEN, num_layers=2,
                      num_heads=llama.HEADS, num_kv_heads=llama.KV_HEADS, vocab_size=llama.VOCAB,
                      tie_word_embeddings=False, max_position_embeddings=llama.SEQ)
    layer = analytic.block_layer(0, arch, Shape(seq_len=llama.SEQ, micro_batch_size=1), archs.gpu("h100"))
    analytic_forward = layer.alloc_records["full"].rerun_forward
    fake = llama_block_records()["full"]
    x_bytes = llama.SEQ * llama.DIM * 2
    assert _peak(analytic_forward) == _peak(fake.forward) == 41 * x_bytes // 4
    assert sum(code for code in analytic_forward if code > 0) == 271 * x_bytes // 16
    # SwiGLU's gate dies once SiLU has made its output; SiLU's and the up projection's once the product is made,
    # the product once w2 has run, and the MLP's input (feed_forward's argument) after it, as the fake record frees
    # them (tests/test_f8cast2.py)
    gate = 11008
    assert analytic_forward[-9:] == [gate, gate, -11, gate, gate, -12, -13, -14, -10]
    # eager attention (its scores' lifetimes not read): none held
    eager = analytic.block_layer(0, arch, Shape(seq_len=llama.SEQ, micro_batch_size=1, attention="eager"),
                                 archs.gpu("h100"))
    assert eager.alloc_records["full"].rerun_forward == []


def _peak(codes):
    return allocator.replay(_events(codes)).allocated_peak_bytes


def test_a_records_own_forward_transients_are_played_renumbered_without_what_it_keeps():
    # 10 (id 1) freed, 20 (2) kept, 30 (3) freed, 40 (4) the output: the transients 10 and 30, renumbered 1, 2
    record = AllocRecord(forward=[10, 20, -1, 30, 40, -3], backward=[], output=4)
    layer = _layer(alloc_records={"full": record})
    assert forward_program(layer, "full", 0) == (10, -1, 30, -2)


def test_the_forward_program_is_played_after_the_kept_block_and_freed_by_the_forwards_end():
    layer = _empty(kept_bytes=100 * MIB, forward_program=(50 * MIB, 60 * MIB, -1, 70 * MIB))
    stage = Fsdp2Stage(layers=(layer,), kept_from_forward=frozenset({0}), shard_group=1, reduce_ratio=2.0,
                       buffer_bytes=0, loss_kept_bytes=0, loss_extra_bytes=0, actions=(("F", 0), ("B", 0)))
    step = _PipelineStep(stage, [])
    step.begin()
    step.forward_layers(3)
    assert [(type(e).__name__, e.key) for e in step.events if e.key[0] in ("kept", "forward")] == [
        ("Alloc", ("kept", 3, 0)), ("Alloc", ("forward", 3, 0, 1)), ("Alloc", ("forward", 3, 0, 2)),
        ("Free", ("forward", 3, 0, 1)), ("Alloc", ("forward", 3, 0, 3)),
        ("Free", ("forward", 3, 0, 2)), ("Free", ("forward", 3, 0, 3))]
    # peak: the kept 100 + 60 + 70 MiB (the 50 freed before the 70)
    assert allocator.replay(step.events).allocated_peak_bytes == 230 * MIB
    # the same without a pipeline, keyed by the layer alone
    one = _Step(stage, [])
    one.forward()
    assert [e.key for e in one.events if e.key[0] == "forward"] == [("forward", 0, n) for n in (1, 2, 1, 3, 2, 3)]


def test_the_last_stages_output_is_made_between_its_layers_and_its_loss():
    layer = _empty(kept_bytes=100)
    stage = Fsdp2Stage(layers=(layer,), kept_from_forward=frozenset({0}), shard_group=1, reduce_ratio=2.0,
                       buffer_bytes=0, loss_kept_bytes=0, loss_extra_bytes=0, loss_forward=(40, 40, -1))
    rank = Fsdp2Rank(chunks=(stage,), actions=((0, "F", 0), (0, "B", 0)), num_microbatches=1, buffer_bytes=0,
                     output_bytes=(20,), merged_bytes=20)
    events: list = []
    _ChunkedStep(rank, events, makes_state=True).run()
    keys = [e.key[2] if e.key[0] == "chunk" else e.key for e in events if isinstance(e, Alloc)]
    made = [key for key in keys if key[0] in ("kept", "output", "loss_forward")]
    assert made[:4] == [("kept", 0, 0), ("output", 0, 0), ("loss_forward", 0, 1), ("loss_forward", 0, 2)]
    assert Alloc(("merged",), 20, DEFAULT) in events and Free(("merged",)) in events


def test_a_tiny_llama_blocks_checkpointed_forward_is_its_records_transients():
    """The fake profiler's recorder (allocseq.layer_records under FakeTensorMode, as `ckplan profile --fake` runs it)
    on a tiny LLaMA block under torch.utils.checkpoint: its forward frees what no saved tensor holds; the program
    is every request of it but the output (alive at its end), in order, each freed inside the program; its peak
    above what the forward keeps is the record's."""
    record = llama_block_records()["full"]
    program = forward_program(_layer(output_bytes=llama.SEQ * llama.DIM * 2, alloc_records={"full": record}),
                              "full", 0)
    made = [code for code in record.forward if code > 0]
    output = made[record.output - 1]
    assert [code for code in program if code > 0] == made[:record.output - 1] + made[record.output:]
    assert program_kept_bytes(program) == 0 and program_kept_bytes(tuple(record.forward)) == output
    assert any(code < 0 for code in program[:-1])  # freed as it goes, not at the end

    def peak(codes):
        return allocator.replay(_events(codes)).allocated_peak_bytes

    assert peak(program) + output >= peak(tuple(record.forward)) >= peak(program)


def _events(program):
    events, made = [], 0
    for code in program:
        if code > 0:
            made += 1
            events.append(Alloc(made, code, DEFAULT))
        else:
            events.append(Free(-code))
    return events
