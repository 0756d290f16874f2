"""A stage's layers as FSDP2's replays take them from the cost model's terms (planner/cost/reserve_fsdp2.py
for one stage a rank, fsdp2_chunks.py for several): each layer's parameter tensors, its shard, state, gathered
weights and gradients, its unit; the loss's largest tensor; how many microbatches a replay runs. Nothing here
reads a file or prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from planner.cost import (
    compiled_block,
    contextparallel,
    dataparallel,
    eager_norm,
    fsdpunits,
    gradtiming,
    head_scatter,
    runtimes,
)
from planner.cost.cpring import peak as ring_peak
from planner.cost.freshgrads import fresh_made_here
from planner.cost.fsdp2_events import Fsdp2Layer
from planner.cost.fsdp2_split import forward_parts, split_forward
from planner.cost.gathered import fsdp_unit_layer_bytes
from planner.cost.rules import in_flight
from planner.schema import OPTION_FULL, OPTION_NONE, LayerProfile, Profile, TrainSetup


def replayed_microbatches(pipeline, stage: int) -> int:
    """The microbatches the replay runs: 1F1B's steady state repeats one backward and one forward
    that free what the pair before made, so after its warm-up (min(P - s, M) forwards) two more
    pairs bring the cache to where the rest of the step keeps it; the replay's cost is then
    bounded by the stages (torch's schedule takes at least one microbatch a stage), not M.
    GPipe holds every microbatch at once: all M."""
    if pipeline.schedule == "GPipe":
        return pipeline.microbatches
    return min(pipeline.microbatches, max(pipeline.stages, in_flight(pipeline, stage) + 2))


def parameter_parts(layer, assumptions: dict) -> list[int]:
    """A layer's parameter tensors, in the order the module registers them (FSDP2 allocates, frees and
    reduces each one's unsharded storage apart): the profile's record where it lists several; for an
    analytic LLaMA-style block the tensors torchtitan's model makes, each of its elements on this
    tensor-parallel rank (9dec370 torchtitan/models/llama/model.py 158-165 wq, wk, wv, wo; 248-250 w1,
    w2, w3; 295-300 attention_norm, ffn_norm, replicated under TP; 374-378 norm, output); else one."""
    record = layer.alloc_records.get(OPTION_NONE)
    if record is not None and len(record.params) > 1:
        return list(record.params)
    model = assumptions.get("model")
    if not isinstance(model, dict) or model.get("style") != "llama":
        return list(record.params) if record is not None and record.params else [1]
    h, f, heads, kv = model["hidden_size"], model["intermediate_size"], model["num_heads"], model["num_kv_heads"]
    head_dim = model.get("head_dim") or h // heads
    tp = assumptions.get("tp", 1) if isinstance(assumptions.get("tp", 1), int) else 1
    if layer.kind == "decoder_block":
        q, kv_width = heads * head_dim // tp, kv * head_dim // tp
        return [h * q, h * kv_width, h * kv_width, q * h, h * f // tp, f // tp * h, h * f // tp, h, h]
    if layer.kind == "norm+lm_head":
        return [h, h * int(assumptions.get("vocab_per_device") or model["vocab_size"])]
    return [1]


def option_name(layer, option: int) -> str:
    """A LayerCost's option by its index (0 none, 1 full, then its selective options)."""
    return [OPTION_NONE, OPTION_FULL, *(o.name for o in layer.extra_options)][option]


def backward_program(known: LayerProfile, option: str, extra: int) -> tuple[int, ...]:
    """The layer's backward extra as its record's tensors (backward_hand's program, without what it hands on)."""
    return backward_hand(known, option, extra)[0]


def backward_hand(known: LayerProfile, option: str, extra: int) -> tuple[tuple[int, ...], int]:
    """The layer's backward extra (`extra` bytes: the cost model's, less what the replay makes itself) as the
    tensors its profile's record (`known`'s, for the option named `option`) makes, in order, coded as AllocRecord's events (n > 0
    allocates n bytes, the next id from 1; -k frees id k), those still alive freed by the replay at the layer's
    end; () where the layer has no record for the option (one block, as before); and the program's id of the
    gradient of the layer's input where the program makes it (0: it does not), which the replay hands on to the
    previous layer as its received gradient (autograd makes it once: fsdp2_events._Step.extra):
    - first the gradient of its output, received (its output's bytes): the transient counts it;
    - then what the cost model's extra counts beyond the record's tensors (a recomputed layer's tensor-parallel
      inputs gathered whole, Float8's, context parallelism's K/V buffers), one tensor alive to the end;
    - then the record's backward, allocation by allocation, with its frees of what the backward made (an
      analytic record: a full recompute's kept tensors again, the scratch's tensors, the input's gradient),
      up to the first allocation that would take the whole past `extra` (a block's input gradient where its
      scratch is alive to its end: its transient does not count it). Its peak is `extra`."""
    made = _record_part(known, option, extra)
    if made is None:
        return (), 0
    part, peak, grad, alive = made
    incoming = known.output_bytes
    residual = extra - incoming - peak
    head = [size for size in (incoming, residual) if size > 0]
    shift = len(head)
    hands = grad + shift if grad and alive else 0  # made, and alive at the program's end
    return (*head, *(code if code > 0 else code - shift for code in part)), hands


def _record_part(known: LayerProfile, option: str, extra: int) -> tuple[list[int], int, int, bool] | None:
    """backward_hand's record part: (its codes renumbered from 1, its peak, the id of the input's gradient
    in it (0: none), whether that is alive at its end); None where backward_hand plays one block."""
    record = known.alloc_records.get(option)
    incoming = known.output_bytes
    if record is None or extra <= 0 or incoming > extra:
        return None
    made = sum(1 for code in record.forward if code > 0)  # the backward's ids start after these
    part: list[int] = []  # the record's backward, renumbered from 1
    ids: dict[int, int] = {}
    live = peak = 0
    sizes: dict[int, int] = {}
    for code in record.backward:
        if code > 0:
            made += 1
            if incoming + live + code > extra:
                break
            ids[made] = len(ids) + 1
            sizes[ids[made]] = code
            part.append(code)
            live += code
            peak = max(peak, live)
        elif -code in ids and ids[-code] in sizes:
            part.append(-ids[-code])
            live -= sizes.pop(ids[-code])
    grad = ids.get(record.input_grad, 0) if record.input_grad else 0
    return part, peak, grad, bool(grad) and grad in sizes


def forward_program(known: LayerProfile, option: str, extra: int, parts: dict[str, int] | None = None) -> tuple[int, ...]:
    """The layer's forward's requests beyond the block the replay keeps for it (its kept bytes), coded as
    backward_hand's programs (n > 0 allocates, -k frees id k), the replay freeing what is left alive at the
    forward's end (fsdp2_events._Step.forward_scratch); () where nothing says them:
    - a record whose forward frees what it made (the measured and --fake profiles' records: allocseq.record_pass's
      recorder sees every storage and its free): its forward with the tensors alive at its end left out (its saved
      tensors and its output, which the kept block and the next layer's hold), in the record's order, renumbered;
    - an analytic record (its forward makes only what it keeps) under a recompute option, where it holds its
      checkpointed forward's lifetimes (`rerun_forward`: allocseq.synthesised from analytic_lifetimes.forward_last_uses,
      the block's code read term by term): torch.utils.checkpoint reruns the layer's own forward function (torch
      2.6.0 utils/checkpoint.py `_checkpoint_hook.__init__.unpack_hook` calls `recompute_fn`), so the forward
      makes the rerun's tensors (the record's backward where its terms are rerun) in its order, and its pack hook keeps
      none, so each is freed at its last use: those, first what the backward program holds beyond the record's
      tensors and the received gradient (a recomputed layer's tensor-parallel inputs gathered whole, Float8's,
      context parallelism's K/V buffers, repeat_kv's copies, and the record's own allocations before the rerun:
      Float8's casts; one tensor, whose parts the record does not name),
      alive to the forward's end (an upper bound on that one's overlap: each part dies with its sub-block);
      nothing where the record holds no lifetimes (a family not read) or its rerun is not the lifetimes' tensors.
    `extra`: the cost model's extra as backward_hand takes it. `parts` (forward_parts): that one tensor's parts
    the cost model names, each played on its own where the record holds the points its code makes and frees it
    at (`rerun_points`, analytic_lifetimes.LLAMA_FORWARD_POINTS): fsdp2_split.split_forward."""
    record = known.alloc_records.get(option)
    if record is None:
        return ()
    if any(code < 0 for code in record.forward):
        alive, made = set(), 0
        for code in record.forward:
            if code > 0:
                made += 1
                alive.add(made)
            else:
                alive.discard(-code)
        ids: dict[int, int] = {}
        program: list[int] = []
        made = 0
        for code in record.forward:
            if code > 0:
                made += 1
                if made not in alive:
                    ids[made] = len(ids) + 1
                    program.append(code)
            elif -code in ids:
                program.append(-ids[-code])
        return tuple(program)
    if option == OPTION_NONE:
        return ()
    found = _record_part(known, option, extra)
    if found is None or not record.rerun_forward:
        return ()
    part, peak, _, _ = found
    sizes = [code for code in record.rerun_forward if code > 0]
    at = next((at for at in range(len(part) - len(sizes) + 1) if part[at:at + len(sizes)] == sizes), None)
    if at is None or any(code < 0 for code in part[:at]):
        return ()
    # the record's allocations before its rerun (Float8's casts, float8.with_float8) are not the rerun's terms:
    # with the extra beyond the record, the one tensor
    residual = extra - known.output_bytes - peak + sum(part[:at])
    if parts and record.rerun_points:
        return split_forward(record.rerun_forward, record.rerun_points, residual, {**parts, "float8": sum(part[:at])})
    if residual <= 0:
        return tuple(record.rerun_forward)
    return (residual, *(code if code > 0 else code - 1 for code in record.rerun_forward))


def backward_hand_ring(known: LayerProfile, option: str, extra: int, ring: tuple[int, ...],
                       ring_extra: int) -> tuple[tuple[int, ...], int, frozenset[int]]:
    """backward_hand with context parallelism's ring played as the allocations it makes (`ring`: its program,
    contextparallel.ring_program; `ring_extra`: what the cost model's extra charges for it,
    contextparallel.extra_bytes) instead of inside the one tensor of what the record does not make: the rest of
    that tensor first as before, then the record's backward with the ring inserted where the record has
    rerun the layer's forward (the bytes its option does not keep: a full recompute's kept tensors again;
    none without a recompute), before its own scratch, beside one tensor of what the charge holds beyond the
    ring's own peak (0 where the ring's peak is the charge's). The cost model charges the ring beside the whole
    rerun and the received gradient (`extra_bytes`' backward + output over the transient), so the program's
    peak is `extra`, as backward_hand's. Returns the program, the id of the gradient it hands on, and the ids
    of the ring's tensors; backward_hand's (with no ids) where the record or the ring does not say."""
    made = _record_part(known, option, extra - ring_extra) if ring else None
    if made is None:
        return (*backward_hand(known, option, extra), frozenset())
    part, peak, grad, alive = made
    incoming = known.output_bytes
    residual = extra - ring_extra - incoming - peak
    at, live = _rerun_point(known, option, part)
    pad = max(0, peak + ring_extra - live - ring_peak(ring)) if ring_extra > 0 else 0
    piece = [pad, *(code if code > 0 else code - 1 for code in ring), -1] if pad else list(ring)
    head = [size for size in (incoming, residual) if size > 0]
    before = sum(1 for code in part[:at] if code > 0)
    inserted = sum(1 for code in piece if code > 0)

    def shifted(code: int) -> int:
        return code if code > 0 or -code <= before else code - inserted

    body = [*part[:at], *(code if code > 0 else code - before for code in piece), *(shifted(c) for c in part[at:])]
    shift = len(head)
    hands = (grad + (inserted if grad > before else 0) + shift) if grad and alive else 0
    ring_ids = frozenset(range(before + 1 + shift, before + inserted + 1 + shift))
    return (*head, *(code if code > 0 else code - shift for code in body)), hands, ring_ids


def _rerun_point(known: LayerProfile, option: str, part: list[int]) -> tuple[int, int]:
    """Where in the record's part the layer's forward has been rerun: after the allocations, before any free,
    that first reach the bytes the option does not keep of what no recompute keeps (the record's forwards);
    (the index, the bytes then alive)."""
    none, this = known.alloc_records.get(OPTION_NONE), known.alloc_records.get(option)
    rerun = 0
    if none is not None and this is not None and option != OPTION_NONE:
        rerun = sum(c for c in none.forward if c > 0) - sum(c for c in this.forward if c > 0)
    live = 0
    for at, code in enumerate(part):
        if live >= rerun or code < 0:
            return at, live
        live += code
    return len(part), live


# a LLaMA block's parameter tensors (parameter_parts' order: wq, wk, wv, wo, w1, w2, w3, attention_norm, ffn_norm) by
# the order its backward makes their gradients after SwiGLU's `mul`: w3's linear, then w1's (SiLU's node between),
# ffn_norm's, wo's, then wv's, wk's, wq's, attention_norm's (the engine runs the ready node made last in the forward first)
_BLOCK_W2, _BLOCK_AFTER_MUL = 5, (6, 4, 8, 3, 2, 1, 0, 7)
_HEAD_OUTPUT = 1  # the head's tensors: norm, output


def grads_order(kind: str, parts: int, program: tuple[int, ...], hands: int, *,
                input_grad_first: bool, skip: frozenset[int] = frozenset()) -> tuple[tuple[int, int], ...]:
    """Where autograd makes a layer's weights' gradients inside its backward program (backward_hand's, coded as
    there; `hands`: the id of the input gradient it makes): (the program's index of the code each is made before,
    its index among the layer's parameter tensors), in the order made; () where the program does not say (the
    gradients made after it, as before). Each linear's backward makes its weight's gradient and its input's:
    aten's `mm` the weight's first (framework-facts §63, measured), torchao's Float8 linear the input's first
    (`input_grad_first`: `matmul_with_hp_or_float8_args.backward` returns `grad_input` computed before
    `grad_weight`, §76); the gradient is the tensor the parameter's `.grad` then holds (AccumulateGrad takes it).
    - a LLaMA decoder block (9 tensors): w2's where its input's gradient is made (the first tensor the program
      frees before the block's input gradient: SwiGLU's product's gradient, which the `mul` consumes), the
      rest, in _BLOCK_AFTER_MUL's order, before the block's input gradient (the record counts none of the
      [tokens, h] gradients between, so they fall there);
    - the head (norm, output; the output linear never Float8: torchtitan converts all but `output`): the
      output's before the linear's input gradient (the tensor the program frees right after making the
      reduce-scatter's shard it hands on; without one, the handed tensor itself), the norm's after the program.
    `skip`: the ids of tensors not the record's (context parallelism's ring, backward_hand_ring), passed over."""
    allocs = [at for at, code in enumerate(program) if code > 0]  # allocs[n - 1]: the code that makes id n
    if not hands or hands > len(allocs):
        return ()
    grad_at = allocs[hands - 1]
    if kind == "decoder_block" and parts == 9:
        freed = next((code for code in program[:grad_at] if code < 0 and -code not in skip), None)
        if freed is None:
            return ()
        w2 = allocs[-freed - 1] + (1 if input_grad_first else 0)
        return ((w2, _BLOCK_W2), *((grad_at, j) for j in _BLOCK_AFTER_MUL))
    if kind == "norm+lm_head" and parts == 2:
        after = program[grad_at + 1] if grad_at + 1 < len(program) else 0
        whole = allocs[-after - 1] if after < 0 and -after < hands else grad_at
        return ((whole, _HEAD_OUTPUT),)
    return ()


def tensor_split(total: float, parts: Sequence[int]) -> tuple[int, ...]:
    """`total` bytes split over tensors in proportion to `parts` (a layer's parameters' bytes)."""
    whole = sum(parts)
    if not whole:
        return (int(round(total)),) if total else ()
    return tuple(int(round(total * part / whole)) for part in parts)


def gathered_parts(parts: Sequence[int], params: int, setup: TrainSetup, *, fp8_count: int) -> tuple[int, ...]:
    """Each parameter tensor's all-gathered bytes: FSDP2's copy-out allocates every parameter's own output,
    numel x world size in its all-gather input's dtype (torch 2.6.0 _fsdp_param.py 438-451
    `init_all_gather_outputs`), so under the float8 all-gather a Float8 linear's weight is 1 B an element and a
    norm's weight stays in the weights' dtype (torchao's `fsdp_pre_all_gather` casts only the converted linears,
    dataparallel.gathered_bytes). The converted weights are the largest tensors (torchao converts nn.Linear, never
    a 1-D norm weight): the largest parts whose elements add up to `fp8_count` exactly. Where no such parts are
    found (a measured record's tensors) or nothing is gathered in float8, the gathered bytes split in proportion."""
    total = dataparallel.gathered_bytes(params, setup, fp8_count=fp8_count)
    if not setup.training.fp8_all_gather or not fp8_count or sum(parts) != params:
        return tensor_split(total, parts)
    order = sorted(range(len(parts)), key=lambda i: -parts[i])
    counted, converted = 0, set()
    for i in order:
        if counted >= fp8_count:
            break
        counted += parts[i]
        converted.add(i)
    if counted != fp8_count:
        return tensor_split(total, parts)
    weights = dataparallel.param_bytes(setup).weights
    return tuple(int(part * (dataparallel.FP8_GATHERED_BYTES if i in converted else weights))
                 for i, part in enumerate(parts))


@dataclass(frozen=True)
class ChunkLayers:
    """A stage's layers as the replay runs them, and what the cost model charges for them."""

    layers: tuple[Fsdp2Layer, ...]
    root_units: frozenset[int]  # the root's units: the model's first and last layers' where the root holds them
    kept_bytes: int  # the layers' kept bytes (the stage's kept less its ends')
    static_bytes: float  # what static charges for their shards, states and gradients (and weights, piped)
    reduce_ratio: float


def chunk_layers(costs, options, *, profile: Profile, setup: TrainSetup, piped: bool,
                 scratch_per_param: float) -> ChunkLayers:
    """The stage's layers (`costs` under `options`) with their units: beside a pipeline torchtitan
    fully_shards each block and the stage's root (its embedding or its norm and head, never both:
    9dec370 parallelize_llama.py 324-339), a unit a layer; else the runtime's record's units."""
    from planner.cost.terms import Context, layer_value

    ctx = Context(profile, setup)
    record = runtimes.of(setup.training)
    units = fsdpunits.unit_of_layers(len(costs), "per-layer" if piped else record.fsdp_units)
    held = dataparallel.param_bytes(setup)
    k = dataparallel.shard_size(setup)
    profiles = {layer.name: layer for layer in profile.layers}
    # the root's unit, reduced first beside a pipeline: where the record's root holds the model's ends (torchtitan
    # 9dec370: each of model.layers, then the stage's model, its own unit tok_embeddings or norm and output), their
    # layers; where the ends are units of their own before the root (2c8b5947 on), none (§660-§662)
    ends = {profile.layers[0].name, profile.layers[-1].name} if record.fsdp_units == "root-ends" else set()
    ep = setup.data_parallel.ep
    layers, kept_sum, static_sum = [], 0, 0.0
    for layer, option, unit in zip(costs, options, units):
        known = profiles[layer.name]
        compiled = compiled_block.record(known, option_name(layer, option), setup)  # its own record where compiled
        known = known if compiled is None else compiled_block.as_layer_record(known, compiled)
        parts = parameter_parts(known, profile.assumptions)
        params = layer.param_count - layer.expert_param_count + layer.expert_param_count // ep
        fp8 = known.float8.param_count if known.float8 is not None else 0
        kept_f = layer_value("kept", layer, option, ctx)
        kept = int(round(kept_f))
        # less what the replay makes itself: FSDP2's moment, and beside a pipeline the layer's gradients
        extra = int(round(layer_value("extra", layer, option, ctx) - fsdp_unit_layer_bytes(layer, option, profile, setup,
                                                                                 lambda value=kept_f: value)
                          - gradtiming.layer_grad_in_flight_bytes(layer, setup) - fresh_made_here(layer, setup)))
        norm = eager_norm.elements(layer, profile, setup) if option == 0 else 0  # its requests played after the LM head's
        cat = head_scatter.extra_bytes(layer, option, profile, setup)  # the head's reduce-scatter cat, played below
        program, hands, ring_ids = backward_hand_ring(
            known, option_name(layer, option),
            max(0, extra - eager_norm.backward_extra_bytes(layer, option, profile, setup) - cat),
            *(((), 0) if compiled is not None else  # a compiled record holds its ring (compiled_block.py)
              (contextparallel.ring_program(layer, option, setup), contextparallel.extra_bytes(layer, setup, option))))
        program, hands = head_scatter.with_cat(program, hands, head_scatter.cat_bytes(layer, option, profile, setup),
                                               layer.input_bytes)
        grads_at = grads_order(known.kind, len(parts), program, hands, input_grad_first=_float8_linears(known, setup),
                               skip=ring_ids) if compiled is None else compiled_block.grads_at(compiled, program)
        kept_program = eager_norm.kept_program(layer, option, profile, setup, kept)  # the head's, where its norm is eager
        kept_frees = eager_norm.kept_frees(program, hands, kept_program if norm else ())
        program, hands = eager_norm.with_backward(program, hands, norm)
        forward = forward_program(known, option_name(layer, option), max(0, extra),
                                  forward_parts(layer, option, profile, setup))
        shard = tensor_split(params * held.shard_weights / k, parts)
        state = tensor_split(params * held.optim / k / 2, parts) * 2  # exp_avg, exp_avg_sq
        gathered = gathered_parts(parts, params, setup, fp8_count=fp8)
        layers.append(Fsdp2Layer(
            unit=unit, kept_bytes=kept, extra_bytes=max(0, extra), gathered=gathered,
            extra_program=program, hands=hands, grads_at=grads_at, forward_program=forward,
            kept_program=kept_program, kept_frees=kept_frees,
            grads=tensor_split(params * held.weights, parts), shard=shard, state=state,
            scratch=tensor_split(params * scratch_per_param, parts)))
        kept_sum += kept
        # what static charges for them: whole weights and gradients beside a pipeline, else the shards
        static_sum += sum(shard) + sum(state) + (sum(gathered) + params * held.grads if piped else params * held.grads / k)
    return ChunkLayers(tuple(layers), frozenset(u for u, c in zip(units, costs) if c.name in ends),
                       kept_sum, static_sum, held.grads / held.weights)


def _float8_linears(known: LayerProfile, setup: TrainSetup) -> bool:
    """The layer's linears run as torchao's Float8 linear (--float8 under a torchao runtime, the layer converted)."""
    float8 = known.float8
    return bool(setup.training.float8) and runtimes.of(setup.training).float8 == "torchao" \
        and float8 is not None and float8.param_count > 0


def loss_tensor_bytes(profile: Profile, setup: TrainSetup) -> int:
    """The loss region's largest tensor on an analytic bf16 profile: its logits in fp32 (torchtitan 9dec370
    train.py's cross_entropy(pred.flatten(0, 1).float(), ...): the fp32 copy, log_softmax's output and both
    backward gradients are each the logits' shape in fp32); 0 where the loss was measured (one block).
    Under chunked cross-entropy its largest tensor (planner/cost/chunkedloss.py): the fp32 hidden-gradient
    buffer, a chunk's fp32 logits, or the LM head's fp32 unsharded gradient."""
    from planner.cost.chunkedloss import setup_loss_bytes
    from planner.cost.rules import runtime_loss

    known = runtime_loss(profile, setup)
    chunked = None if known is None else setup_loss_bytes(profile, setup, known[1])
    if chunked is not None:
        return chunked.largest_tensor_bytes
    return 0 if known is None else int(known[0]) * 2


def loss_program(profile: Profile, setup: TrainSetup, extra: int) -> tuple[int, ...]:
    """The loss's scratch (`extra` bytes: the cost model's, made at the last stage's backward) as the requests
    torch's cross-entropy makes on torchtitan 9dec370's loss (train.py: `cross_entropy(pred.flatten(0, 1).float(),
    labels.flatten(0, 1))`), coded as backward_hand's programs (n > 0 allocates, -k frees id k), each tensor the
    fp32 logits' shape F (framework-facts §71): under tensor parallelism's loss_parallel (torch
    distributed/tensor/parallel/loss.py `_nll_loss_and_log_softmax_backward`: `grad_input = torch.zeros_like(x)`,
    then `(grad_input + torch.exp(x)) * grad_output`: the zeros, exp's, the sum's while both are alive, exp's
    freed once summed, the product's, then the zeros' and the sum's freed with the function's locals; the
    log_softmax backward handler only casts, fp32 to fp32, no copy): F, F, F, -2, F, -1, -3, -4; without (aten's
    nll_loss_backward makes the zero-filled gradient, _log_softmax_backward_data its output while that is
    alive): F, F, -1, -2. What `extra` holds beyond the program's peak first, one tensor alive to the end;
    () where the runtime's loss is another, or the program's peak passes `extra` (then its largest tensor,
    repeated: loss_tensor_bytes)."""
    kind = _titan_loss(profile, setup)
    if kind is None:
        return ()
    fp32 = kind[1]
    if kind[0] == "parallel":
        program, peak = (fp32, fp32, fp32, -2, fp32, -1, -3, -4), 3 * fp32
    else:
        program, peak = (fp32, fp32, -1, -2), 2 * fp32
    if peak > extra:
        return ()
    if extra == peak:
        return program
    return (extra - peak, *(code if code > 0 else code - 1 for code in program), -1)


def loss_forward_program(profile: Profile, setup: TrainSetup) -> tuple[int, ...]:
    """What the loss's forward makes at the last stage's forward (torch's pipelining computes the loss there, once
    forward_one_chunk has made the output: schedules.py _maybe_compute_loss), on torchtitan 9dec370's loss (§71,
    §118): the fp32 copy (`.float()`), then under loss_parallel (torch 2.6.0 distributed/tensor/parallel/loss.py
    127-151 `_log_softmax`: `shifted = x - x_max`, `torch.exp(shifted)` summed, then `result = shifted -
    shifted_logsumexp`) the shifted logits and exp's, exp's freed once summed, the result made while the copy and
    the shifted logits are alive, the shifted freed as `_log_softmax` returns, the copy when cross_entropy
    returns: F, F, F, -3, F, -2, -1; without (aten's log_softmax writes its result from the copy): F, F, -1. The
    result (log_softmax's saved `result`, nll_loss's `self`) is left alive: the loss keeps it to its backward
    (program_kept_bytes). () where the runtime's loss is another."""
    kind = _titan_loss(profile, setup)
    if kind is None:
        return ()
    fp32 = kind[1]
    return (fp32, fp32, fp32, -3, fp32, -2, -1) if kind[0] == "parallel" else (fp32, fp32, -1)


def program_kept_bytes(program: tuple[int, ...]) -> int:
    """The bytes a coded program (n > 0 allocates n bytes, the next id from 1; -k frees id k) leaves alive."""
    made = [code for code in program if code > 0]
    freed = {-code for code in program if code < 0}
    return sum(size for ident, size in enumerate(made, 1) if ident not in freed)


def _titan_loss(profile: Profile, setup: TrainSetup) -> tuple[str, int] | None:
    """("parallel" or "plain", the fp32 logits' bytes) where the record's loss is eager cross-entropy (torchtitan 9dec370's plain
    one, RuntimeFacts.loss_requests_eager_ce) on an analytic bf16 profile (under TP on vocab-parallel logits, loss_parallel's); else None."""
    from planner.cost.rules import profile_tp, runtime_facts, runtime_loss

    known, record = runtime_loss(profile, setup), runtime_facts(setup)
    if known is None or not record.loss_requests_eager_ce or record.chunked_loss:
        return None
    fp32 = int(known[0]) * 2
    if profile_tp(profile) > 1 and known[1] == record.loss_vocab_parallel:
        return "parallel", fp32
    if profile_tp(profile) == 1 and known[1] == record.loss:
        return "plain", fp32
    return None
