"""A chunked schedule's rows in the MILP (planner/solve/milp.py): each rank's memory over its chunks
at every moment torch's order reaches, and the schedule's linear time."""

from __future__ import annotations

from functools import partial

import pulp

from planner.cost import costmodel, schedules, stagesends
from planner.solve.milp_rows import (
    MIB,
    Problem,
    _const,
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
        pending = [[_run_sum(problem, "wgrad", k, n)
                    - costmodel.loss_freed_at_input_pass_bytes(problem.profile, k, problem.setup) / MIB] if run else []
                   for k, run in zip(stages, passes)]
        weight_pass = [_weight_pass_bound(problem, k, n, closes) if run else memory.transient if split else 0
                       for k, run, memory in zip(stages, passes, memories)]
        # the input pass's peak (costmodel.input_pass_peak_bytes), bounded above: the largest layer's
        # input peak on top of what every layer of the stage leaves for the weight pass
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


def _run_sum(problem: Problem, quantity: str, k: int, n):
    """`quantity` of all of stage k's layers, each under its option, in MiB."""
    return pulp.lpSum(_run_bytes(problem, quantity, k, g, n) / MIB for g in range(len(problem.runs)))


def _input_pass_bound(problem: Problem, k: int, n):
    """U_k ≥ the input peak of every run present in stage k (under any of its options), plus what
    all of the stage's layers leave for the weight pass: at least costmodel.input_pass_peak_bytes.
    On the pipeline's last stage the gradient of its output (the logits) stays through the pass
    (assembly.stage_sums), on top of every layer's input peak; the loss's backward is its own."""
    last = problem.runs[-1].layer.output_bytes if k == problem.setup.pipeline.stages - 1 else 0
    bound = pulp.LpVariable(f"U_{k}", lowBound=max(_const(problem, ("extra",), k), last) / MIB)
    for g, run in enumerate(problem.runs):
        peaks = [_layer(problem, ("ipeak",), run.layer, o) for o in (0, *problem.order[g])]
        if max(peaks) > 0:
            present = _presence(problem, f"u_{k}_{g}", n(k, g), run.size)
            problem.lp += bound >= (max(peaks) + last) / MIB * present, f"input_pass_{k}_{g}"
    return bound + _run_sum(problem, "wgrad", k, n)


def _weight_pass_bound(problem: Problem, k: int, n, closes):
    """W_k ≥ max(V_k, F_k + C_k): V_k ≥ the weight-pass peak of every (run, option) present in stage k, the
    run's layers under no option included: the largest layer's, as evaluate() takes it (assembly.stage_sums);
    F_k ≥ the first parameter group's peak of any present (wgroups.weight_pass_first_peak_bytes, at most its
    layer's peak), the moment a layer's first group runs beside what the layer before leaves; C_k ≥ the largest
    carry (the weight gradients torch's stage_backward_weight keeps from one layer while the next layer's run:
    wgroups.py) of any present but the stage's last layer's, where that is its run's one layer in the stage
    (_last_alone); plus every present layer's reruns left to the pass's end (the wleft rows, §890). Above
    evaluate's where the largest carry is not before the largest first group (V_k + C_k
    charged a whole peak on the carry: 8.5% slower plans on a 6-layer ZBV case, docs/published-runs.md
    §67.review66)."""
    bound = pulp.LpVariable(f"V_{k}", lowBound=0)
    first = pulp.LpVariable(f"F_{k}", lowBound=0)
    carry = pulp.LpVariable(f"C_{k}", lowBound=0)
    carried = False
    for g, run in enumerate(problem.runs):
        order = problem.order[g]
        counts = [(0, n(k, g) - pulp.lpSum(problem.r[k, g, o] for o in order))]
        counts += [(o, problem.r[k, g, o]) for o in order]
        alone = None
        for o, count in counts:
            peak, held = _layer(problem, ("wpeak",), run.layer, o), _layer(problem, ("wcarry",), run.layer, o)
            if peak <= 0 and held <= 0:
                continue
            present = _presence(problem, f"v_{k}_{g}_{o}", count, run.size)
            if peak > 0:
                problem.lp += bound >= peak / MIB * present, f"weight_pass_{k}_{g}_{o}"
                problem.lp += first >= _layer(problem, ("wfirst",), run.layer, o) / MIB * present, \
                    f"weight_first_{k}_{g}_{o}"
            if held > 0:
                if alone is None:
                    alone = _last_alone(problem, k, g, n, closes)
                problem.lp += carry >= held / MIB * (present - alone), f"weight_carry_{k}_{g}_{o}"
                carried = True
    left = _run_sum(problem, "wleft", k, n)  # every present layer's reruns to the pass's end (wgroups.py): above
    if not carried:                          # evaluate's, which leaves out the stage's last layer's
        return bound + left
    whole = pulp.LpVariable(f"W_{k}", lowBound=0)
    problem.lp += whole >= bound, f"weight_whole_{k}"
    problem.lp += whole >= first + carry, f"weight_first_carry_{k}"
    return whole + left


def _last_alone(problem: Problem, k: int, g: int, n, closes):
    """z ≤ [run g holds stage k's last layer and no other of the stage]: its carry has no later layer of the
    stage to run beside (a stage of one layer among them); 0 where it cannot be."""
    last = closes(k, g)
    if isinstance(last, int) and last == 0:
        return 0
    size = problem.runs[g].size
    z = pulp.LpVariable(f"z_{k}_{g}", cat="Binary")
    problem.lp += z <= last, f"weight_last_{k}_{g}"
    if size > 1:
        problem.lp += n(k, g) <= 1 + size * (1 - z), f"weight_alone_{k}_{g}"
    return z


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
