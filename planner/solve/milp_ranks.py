"""A chunked schedule's rows in the MILP (planner/solve/milp.py): each rank's memory over its chunks
at every moment torch's order reaches, and the schedule's linear time."""

from __future__ import annotations

from functools import partial

import pulp

from planner.cost import costmodel, schedules, stagesends
from planner.cost.loss_records import input_pass_retained_bytes
from planner.solve import milp_order
from planner.solve.milp_rows import (
    MIB,
    Problem,
    _const,
    _edge,
    _late_grad_mib,
    _layer,
    _presence,
    _run_bytes,
    _stage_memory_parts,
    _step_and_host_rows,
    _step_end_row,
)


def _rank_rows(problem: Problem, n, opens, closes) -> None:
    """A chunked schedule's memory, per rank over its chunks (costmodel.evaluate):
    held + live(v) ≤ cap_r for every vector v of counts per chunk the rank passes through in
    torch's order (live microbatches × kept, outputs and input gradients its sends hold ×
    their bytes, microbatches between I and W × what I leaves for W, each chunk's late gradients
    while it holds them), and
    held + live(v) + T_c ≤ cap_r for every vector where chunk c's B or I starts (its transient on
    top; W's own, the weight pass's peak, where its W starts); vectors below another (of the same
    chunk and pass) are dropped.
    Then the optimizer step's, the step's end's and the host's rows over all its chunks."""
    order, lp, setup = problem.schedule, problem.lp, problem.outer
    split = order.splits_backward
    for rank in range(order.num_ranks):
        if problem.deadline is not None:
            problem.deadline.check()
        stages = order.stages_of(rank)
        memories = [_stage_memory_parts(problem, k, n, opens, closes) for k in stages]
        sent_output, sent_grad, unsent = [], [], []
        for k in stages:
            sends = [costmodel.sends_held_bytes(run.layer, run.layer, stage=k, order=order, training=setup.training) for run in problem.runs]
            sent_output.append(pulp.lpSum(out / MIB * closes(k, g) for g, (out, _) in enumerate(sends) if out))
            sent_grad.append(pulp.lpSum(grad / MIB * opens(k, g) for g, (_, grad) in enumerate(sends) if grad))
            unsent.append(-sent_grad[-1])  # the single-stage buffers' input gradient being sent, counted here
        # tied copies on one rank counted once (costmodel.rank_tied_once_bytes): here those of the
        # first and last layers, whose stages are fixed; any other holder's copy stays charged (over)
        names = [layer.name for layer in problem.profile.layers]
        pinned = ([{names[0]}] if 0 in stages else []) + ([{names[-1]}] if order.num_stages - 1 in stages else [])
        unsent.append(costmodel.rank_tied_once_bytes(problem.profile, pinned, setup) / MIB)
        held = [term for memory in memories for term in memory.held] + unsent
        # the whole gradients the runtime allocates at a chunk's first backward and frees after its
        # last (gradtiming; static charges them): out of what is held, counted by the moments that
        # hold them, as evaluate() counts them (schedules.rank_peak, ChunkBytes.late_grad)
        late = [_late_grad_mib(problem, [k], n) for k in stages]
        moments_held = held + [-term for terms in late for term in terms]
        # the split passes run past the pipeline's first stage; on it I runs nothing and W the whole
        # backward, with B's transient (score.chunk_bytes)
        passes = [split and k > 0 for k in stages]
        # (less, on the last stage, the loss's saved tensors its input pass frees: score.chunk_bytes)
        pending = [[_left_for_weight_pass(problem, k, n, opens, closes)
                    - costmodel.loss_freed_at_input_pass_bytes(problem.profile, k, problem.setup) / MIB] if run else []
                   for k, run in zip(stages, passes)]
        weight_pass = [_weight_pass_bound(problem, k, n) if run else memory.transient if split else 0
                       for k, run, memory in zip(stages, passes, memories)]
        # the input pass's peak (costmodel.input_pass_peak_bytes): each layer's input peak on top of what
        # the stage's later layers leave for the weight pass
        input_pass = [_input_pass_bound(problem, k, n) if run else 0 for k, run in zip(stages, passes)]
        per_count = ([memory.kept for memory in memories] + [[out] for out in sent_output]
                     + [[g] for g in sent_grad] + pending + late)
        cap = _rank_cap_mib(problem, rank)
        live = partial(_weighted, per_count=per_count)
        after = schedules.live_counts(order, rank, until_weight_grad=split)
        for idx, vector in enumerate(_top(after)):
            lp += pulp.lpSum(moments_held) + live(vector) <= cap, f"live_{rank}_{idx}"
        moments = schedules.backward_moments(order, rank, until_weight_grad=split)
        for chunk, memory in enumerate(memories):
            for kind, extra in (("B", memory.transient), ("I", input_pass[chunk]), ("W", weight_pass[chunk])):
                vectors = _top([vector for vector, c, k in moments if c == chunk and k == kind])
                for idx, vector in enumerate(vectors):
                    lp += pulp.lpSum(moments_held) + live(vector) + extra <= cap, f"pass_{kind}_{rank}_{chunk}_{idx}"
        # the optimizer step's scratch meets no whole gradient allocated at a first backward
        _step_and_host_rows(problem, f"r{rank}", memories, cap, unsent + [-term for terms in late for term in terms])
        _step_end_row(problem, f"r{rank}", stages, held, n, opens, closes, cap)


def _left_for_weight_pass(problem: Problem, k: int, n, opens, closes):
    """What stage k's input pass leaves for its weight pass, per microbatch (StageSums.weight_grad_bytes, the
    "wgrad" quantity), in MiB: every layer's under its option, and the stage's first layer's edge (its input
    gradient is sent back, not handed on: ChunkBytes.sent_input_grad counts it). Without the edge the rows
    charged that gradient twice for every microbatch between I and W (10.1 MiB on a 6-layer ZBV case, a plan
    3.0% slower than brute force's: docs/published-runs.md §67.milpexact)."""
    total = [_const(problem, ("wgrad",), k) / MIB]
    for g, run in enumerate(problem.runs):
        total += [_run_bytes(problem, "wgrad", k, g, n) / MIB,
                  _edge(problem, ("wgrad",), "open", run.layer, k) / MIB * opens(k, g),
                  _edge(problem, ("wgrad",), "close", run.layer, k) / MIB * closes(k, g)]
    return pulp.lpSum(total)


def _slots(problem: Problem, k: int, n) -> list[tuple[int, object, object]]:
    """Stage k's layers in their order, as (run, option, count) slots: each run's layers under its options in
    problem.order, r[k,g,o] of each, then the rest under none (0), as extract_plan places them; where the MILP
    chooses the run's order (milp_order.positions), one slot per position, (run, {option: x}, its presence), and
    where only its first layer is one, the rest after it in milp_order.input_order. A run
    the stage cannot hold (its count fixed at 0 by the windows) has none."""
    slots = []
    for g in range(len(problem.runs)):
        if isinstance(n(k, g), int) and n(k, g) == 0:
            continue
        chosen = milp_order.positions(problem, k, g, n)
        if chosen is not None:
            slots += [(g, position, pulp.lpSum(position.values())) for position in chosen]
            if len(chosen) == 1:  # the run's first layer alone (milp_order._first_only): the rest in input_order
                counts = {o: problem.r[k, g, o] for o in problem.order[g]}
                counts[0] = n(k, g) - pulp.lpSum(counts.values())
                slots += [(g, o, counts[o] - chosen[0][o]) for o in milp_order.input_order(problem, g)]
            continue
        order = problem.order[g]
        slots += [(g, o, problem.r[k, g, o]) for o in order]
        slots.append((g, 0, n(k, g) - pulp.lpSum(problem.r[k, g, o] for o in order)))
    return slots


def _slot_presence(problem: Problem, k: int, b: int, count, size: int):
    """p = [slot b of stage k holds a layer], exactly (_presence, held down by the count too: a slot taken
    present with no layer would pass on its own carry), one binary per slot shared by the input and weight
    pass's rows; the count itself where the run has one layer."""
    if (k, b) not in problem.slots_present:
        present = _presence(problem, f"v_{k}_{b}", count, size)
        if size > 1:
            problem.lp += present <= count, f"v_{k}_{b}_none"
        problem.slots_present[k, b] = present
    return problem.slots_present[k, b]


def _input_pass_bound(problem: Problem, k: int, n):
    """U_k = costmodel.input_pass_peak_bytes, exact: the pass runs the stage's layers last to first, each layer's
    input peak on top of what the layers after it in the stage leave for the weight pass. Per slot b of stage
    k's layers in order (_slots): with p_b = [slot b's layers present] and L_b what the slots after it leave
    (L_b = L_{b+1} + count_{b+1}·wgrad_{b+1}, a linear sum),
        U_k ≥ (ipeak_b + last)·p_b + wgrad_b·(count_b - p_b) + L_b - M_b·(1 - p_b)
    the slot's first layer (the most after it), M_b ≥ L_b (vacuous where the slot is absent). On the pipeline's
    last stage the gradient of its output (the logits), `last`, stays through the pass (assembly.stage_sums), on
    top; the loss's backward is its own (U_k's floor). Bounding it by the largest input peak on top of all the
    stage's wgrad charged the wgrad of the layers up to the largest peak's on it: plans up to 5.0% slower than
    brute force's on 6-layer ZBV cases (tests/test_milp_exact.py; docs/published-runs.md §67.milpexact)."""
    last = problem.runs[-1].layer.output_bytes if k == problem.setup.pipeline.stages - 1 else 0
    # the loss's backward with its saved tensors retained through the pass (loss_records.input_pass_retained_bytes)
    retained = input_pass_retained_bytes(problem.profile, problem.setup) if k == problem.setup.pipeline.stages - 1 else 0
    bound = pulp.LpVariable(f"U_{k}", lowBound=max(_const(problem, ("extra",), k) + retained, last) / MIB)
    after, most = 0, 0.0  # L_b (MiB) and M_b, from the stage's last slot back
    for b, (g, o, count) in reversed(list(enumerate(_slots(problem, k, n)))):
        run = problem.runs[g]
        if isinstance(o, dict):  # a position of a run whose order the MILP chooses: its option's figures
            after, most = _input_pass_position(problem, k, b, run.layer, o, bound, last, after, most)
            continue
        peak, held = _layer(problem, ("ipeak",), run.layer, o) / MIB, _layer(problem, ("wgrad",), run.layer, o) / MIB
        if peak + last <= 0 and held <= 0 and most <= 0:
            continue  # U_k ≥ 0
        present = _slot_presence(problem, k, b, count, run.size)
        problem.lp += (bound >= (peak + last / MIB) * present + held * (count - present) + after - most * (1 - present),
                       f"input_pass_{k}_{b}")
        if held > 0:
            total = pulp.LpVariable(f"L_{k}_{b}", lowBound=0)
            problem.lp += total == after + held * count, f"input_left_{k}_{b}"
            after, most = total, most + held * run.size
    return bound


def _input_pass_position(problem: Problem, k: int, b: int, layer, position: dict, bound, last: float, after, most):
    """_input_pass_bound's row for one position (milp_order): its option's input peak on what the later slots
    leave, U_k ≥ Σ_o (ipeak_o + last)·x_o + L_b - M_b·(1 - Σ_o x_o); returns L and M with the position's own."""
    peak = {o: _layer(problem, ("ipeak",), layer, o) / MIB for o in position}
    held = {o: _layer(problem, ("wgrad",), layer, o) / MIB for o in position}
    if all(peak[o] + last <= 0 and held[o] <= 0 for o in position) and most <= 0:
        return after, most  # U_k ≥ 0
    present = pulp.lpSum(position.values())
    problem.lp += (bound >= pulp.lpSum((peak[o] + last / MIB) * x for o, x in position.items()) + after
                   - most * (1 - present), f"input_pass_{k}_{b}")
    if max(held.values()) <= 0:
        return after, most
    total = pulp.LpVariable(f"L_{k}_{b}", lowBound=0)
    problem.lp += total == after + pulp.lpSum(held[o] * x for o, x in position.items()), f"input_left_{k}_{b}"
    return total, most + max(held.values())


def _weight_pass_bound(problem: Problem, k: int, n):
    """W_k = wgroups.weight_pass_peak_bytes, exact: every present layer's weight-pass peak, and its first parameter
    group's on top of what the last earlier layer of the stage with a weight pass carries into it (the weight
    gradients torch's stage_backward_weight keeps bound while the next layer's first group runs: wgroups.py). Per
    slot b of stage k's layers in order (_slots) with a weight pass, p_b = [present] exactly:
        W_k ≥ max(wpeak_b, wfirst_b)·p_b,   W_k ≥ (wfirst_b + wcarry_b)·d_b  (d_b ≥ [count_b ≥ 2]: two of the slot's layers
        in a row),   W_k ≥ wfirst_b·p_b + C_b - M_b·(1 - p_b),
    C_b the carry into slot b from the last present slot before it, a chain: C_{b+1} ≥ wcarry_b·p_b (slot b
    present carries its own), C_{b+1} ≥ C_b - M_b·p_b (absent: what came into it), C at the stage's first slot
    0; a slot with no weight pass passes it on (evaluate skips it), and M_b the largest carry before b. The chain's
    least values are the carries evaluate reads, so the rows are evaluate's maximum. Bounding it by the largest
    first group plus the largest carry charged a carry that does not precede the largest first group: a 6-layer
    ZBV plan 4.0% slower than brute force's (docs/published-runs.md §67.milpexact).
    What a layer leaves to the pass's end (wleft, s_b = min(wleft_b, wcarry_b): a checkpointed region's reruns,
    §890) is under every later layer's rows: L_b = Σ_{b' < b} s_b'·count_b' (a linear sum) and, within the slot,
    the layers before its last, (count_b - p_b)·s_b, each row held off by ML_b (L_b's most) where the slot is
    absent; the carry the chain hands on is wcarry_b - s_b, the rest being left (wgroups.weight_pass_peak_bytes)."""
    whole = pulp.LpVariable(f"W_{k}", lowBound=0)
    carry, most = 0, 0.0  # C_b (MiB) and the largest carry before b
    lefts, left_most = [], 0.0  # L_b's terms (MiB) and its most
    for b, (g, o, count) in enumerate(_slots(problem, k, n)):
        run = problem.runs[g]
        if isinstance(o, dict):  # a position of a run whose order the MILP chooses: its option's figures
            carry, most, left_most = _weight_pass_position(problem, k, b, run.layer, o, whole, carry, most, lefts,
                                                           left_most)
            continue
        peak = _layer(problem, ("wpeak",), run.layer, o) / MIB
        if peak <= 0:
            continue
        first = _layer(problem, ("wfirst",), run.layer, o) / MIB
        held = _layer(problem, ("wcarry",), run.layer, o) / MIB
        stays = min(_layer(problem, ("wleft",), run.layer, o) / MIB, held)
        held -= stays  # the carry the next layer's first group meets; `stays` is left to the pass's end
        present = _slot_presence(problem, k, b, count, run.size)
        # what the earlier layers left, under the slot's last layer (its layers before it too); off where absent
        under = pulp.lpSum(lefts) + stays * (count - present) - left_most * (1 - present) if left_most or stays else 0
        # (a first group above its layer's peak, which only a hand-edited profile has, charged on nothing too)
        peak = max(peak, first)
        problem.lp += whole >= peak * present + under, f"weight_pass_{k}_{b}"
        if most > 0 and first + most > peak:
            problem.lp += (whole >= first * present + carry + pulp.lpSum(lefts) - (most + left_most) * (1 - present),
                           f"weight_first_{k}_{b}")
        if run.size > 1 and first + held > peak:
            twice = pulp.LpVariable(f"d_{k}_{b}", cat="Binary")
            problem.lp += count <= 1 + (run.size - 1) * twice, f"weight_twice_{k}_{b}"
            problem.lp += whole >= (first + held) * twice + under, f"weight_pair_{k}_{b}"
        if held > 0 or most > 0:
            into = pulp.LpVariable(f"C_{k}_{b}", lowBound=0)
            problem.lp += into >= held * present, f"weight_carry_{k}_{b}"
            if most > 0:
                problem.lp += into >= carry - most * present, f"weight_carried_{k}_{b}"
            carry, most = into, max(most, held)
        if stays > 0:
            lefts.append(stays * count)
            left_most += stays * run.size
    return whole


def _weight_pass_position(problem: Problem, k: int, b: int, layer, position: dict, whole, carry, most: float,
                          lefts: list, left_most: float):
    """_weight_pass_bound's rows for one position (milp_order), q = Σ_o x_o over the options with a weight pass
    (none of them: the position passes the carry on, as evaluate skips it):
        W_k ≥ Σ_o max(wpeak_o, wfirst_o)·x_o + L_b - ML_b·(1 - q),
        W_k ≥ Σ_o wfirst_o·x_o + C_b + L_b - (M_b + ML_b)·(1 - q),
        C_{b+1} ≥ Σ_o wcarry_o·x_o,   C_{b+1} ≥ C_b - M_b·q,   L_{b+1} = L_b + Σ_o s_o·x_o,
    two layers of one option in a row being two positions, no d rows. Returns C, M and ML (`lefts` grows)."""
    figures = {}
    for o, x in position.items():
        peak = _layer(problem, ("wpeak",), layer, o) / MIB
        if peak > 0:
            first, held = _layer(problem, ("wfirst",), layer, o) / MIB, _layer(problem, ("wcarry",), layer, o) / MIB
            stays = min(_layer(problem, ("wleft",), layer, o) / MIB, held)
            figures[o] = (max(peak, first), first, held - stays, stays, x)
    if not figures:
        return carry, most, left_most
    on = pulp.lpSum(x for *_, x in figures.values())
    under = pulp.lpSum(lefts) - left_most * (1 - on) if left_most else 0
    problem.lp += whole >= pulp.lpSum(peak * x for peak, *_, x in figures.values()) + under, f"weight_pass_{k}_{b}"
    if most > 0 and any(first + most > peak for peak, first, *_ in figures.values()):
        problem.lp += (whole >= pulp.lpSum(first * x for _, first, *_, x in figures.values()) + carry + pulp.lpSum(lefts)
                       - (most + left_most) * (1 - on), f"weight_first_{k}_{b}")
    largest = max(held for _, _, held, *_ in figures.values())
    if largest > 0 or most > 0:
        into = pulp.LpVariable(f"C_{k}_{b}", lowBound=0)
        problem.lp += into >= pulp.lpSum(held * x for _, _, held, _, x in figures.values()), f"weight_carry_{k}_{b}"
        if most > 0:
            problem.lp += into >= carry - most * on, f"weight_carried_{k}_{b}"
        carry, most = into, max(most, largest)
    staying = max(stays for *_, stays, _ in figures.values())
    if staying > 0:
        lefts.append(pulp.lpSum(stays * x for *_, stays, x in figures.values()))
        left_most += staying
    return carry, most, left_most


def _weighted(vector: tuple[int, ...], per_count: list[list]):
    """Σ_i vector_i · Σ per_count_i: a vector of counts (schedules.live_counts) in MiB."""
    return pulp.lpSum(count * term for count, terms in zip(vector, per_count) for term in terms if count)


def _top(vectors: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """The vectors no other vector is at least as large as in every count, in their order. A
    vector is only ever below one of larger sum, and then below a maximal one: the distinct
    vectors by falling sum, each against the maximal ones found so far (a few), not all (a
    schedule of 1,000 microbatches has thousands)."""
    maximal: list[tuple[int, ...]] = []
    for v in sorted(set(vectors), key=sum, reverse=True):
        if not any(all(a <= b for a, b in zip(v, w)) for w in maximal):
            maximal.append(v)
    keep = set(maximal)
    return [v for v in vectors if v in keep]


def _chunked_time(problem: Problem, stage_times: list, tau, n, opens, closes):
    """A chunked schedule's iteration, linear (costmodel.chunked_linear_ms, which the search holds it to):
    T ≥ M·Σ_{k on r} (busy_k - beside_k) + Σ_{k on r} w_{r,k}·out_k + (P - 1)·τ + σ for every rank r.
    beside_k = out_k + back_k, the stage's sends its runtime runs beside the compute (stagesends: its
    last layer's output send, out_k = Σ_g out(g)·close[k,g], and its first layer's input gradient's,
    back_k = Σ_g back(g)·open[k,g]), which the rank does not wait for, but for its warm-up forwards'
    (w_{r,k} of stage k's forwards in rank r's warm-up send to another rank: stagesends.warmup_sends),
    which it does; so the rank's own work for every microbatch is exact, what the simulation runs on
    its compute stream. Plus the fill and drain: P - 1 stage times, τ a stage's busy with its sends
    (the fill crosses one at every rank boundary), the interleaved schedule's bubble (P - 1)·(t_f +
    t_b)/V per rank, Narayanan et al. 2021, exact for equal stages; σ the slowest rank's optimizer
    step. The plan is then scored by the simulated schedule (costmodel.evaluate), which the search
    reports."""
    order, lp, runs = problem.schedule, problem.lp, problem.runs
    t_iter = pulp.LpVariable("T_iter", lowBound=0)
    step_of = {g: _layer(problem, ("step",), run.layer) for g, run in enumerate(runs)}
    slowest_step = pulp.LpVariable("sigma", lowBound=0)
    micro = problem.outer.pipeline.microbatches
    out = [pulp.lpSum(stagesends.output_beside_ms(run.layer, k, order, problem.setup) * closes(k, g)
                      for g, run in enumerate(runs)) for k in range(order.num_stages)]
    back = [pulp.lpSum(stagesends.input_grad_beside_ms(run.layer, k, order, problem.setup) * opens(k, g)
                       for g, run in enumerate(runs)) for k in range(order.num_stages)]
    held = stagesends.warmup_sends(order)
    for rank in range(order.num_ranks):
        mine = order.stages_of(rank)
        lp += pulp.lpSum(step_of[g] * n(k, g) for k in mine for g in range(len(runs))) <= slowest_step, f"step_r{rank}"
        work = pulp.lpSum(stage_times[k] - out[k] - back[k] for k in mine)
        warm = pulp.lpSum(count * out[k] for k, count in held[rank].items())
        lp += (t_iter >= micro * work + warm + (order.num_ranks - 1) * tau + slowest_step), f"rank_path_{rank}"
    return t_iter


def _rank_cap_mib(problem: Problem, rank: int):
    """limit_r - margin for the rank (the setup as given), scaled for the memory objective."""
    cap = costmodel.limit_bytes(rank, costmodel.Context(problem.profile, problem.outer)) / MIB
    if problem.scale is not None:
        cap = cap * problem.scale
    return cap - costmodel.FIT_MARGIN_BYTES / MIB
