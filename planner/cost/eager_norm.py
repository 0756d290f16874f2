"""The final norm as torchtitan 9dec370 runs it: torchtitan's own `RMSNorm` (norm_type "rmsnorm", its default and the
405B toml's) outside the compiled blocks, in eager fp32 (docs/framework-facts.md §205-§206). The analytic head
record counts a fused norm's tensors (its bf16 input, 1/rms a token); torch's eager ops make these instead, with E
the norm's elements on this rank (tokens / sp x hidden):

forward (torchtitan/models/norms.py `RMSNorm.forward`: `self._norm(x.float()).type_as(x) * self.weight`,
`_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)`):
  A = x.float() 4E (saved by `pow` and by the product), B = A.pow(2) 4E (freed once `mean` has run: MeanBackward
  saves sizes only), 1/rms a token (saved), F = A * rsqrt 4E (freed once `type_as` has made G), G 2E (bf16, saved
  by `* weight`), H = G * weight 2E (the output: alive to the stage's forward end, the LM head's input).
  Kept beyond the record: A in place of the bf16 x (which nothing saves) and G: 4E + 2E - 2E = 4E.
backward (torch's derivatives.yaml formulas in the engine's order, the last node made first; as ckplan's AllocRecorder
records torchtitan's RMSNorm on the installed torch, tests/test_finalnorm.py, framework-facts §206):
  `* weight`: the weight's dH x G 2E (summed to [h], then freed), dG = dH x w 2E; dH freed, G released;
  `type_as`: dF = dG.float() 4E, dG freed; `A * rsqrt`: d(rsqrt) = dF x A 4E (summed to a token's, then freed),
  dA = dF x rsqrt 4E, dF freed; `mean`: dB = grad.expand / h 4E; `pow`: pow_backward's `grad * (2 * A.pow(1))`,
  one C++ expression whose temporaries live to its end: A.pow(1) 4E, 2 x it 4E, the product 4E, then the two
  temporaries and dB freed, A released; the two gradients of A summed into a new tensor 4E (InputBuffer's
  accumulate, not in place), both freed; `x.float()`: dx = that.to(bf16) 2E, the sum freed; dx handed to the last
  block. Its peak beyond the kept: dA, dB and pow_backward's three at once, 20E. The per-token (4 B a token) and
  [h] tensors between are not played (the small pool's).
All in `ROWS`' terms and the FSDP2 replay's programs (kept_program, with_backward), only where the runtime's
record says so (RuntimeFacts.final_norm_eager_fp32) on an analytic LLaMA-style head (a measured or --fake profile
ran the norm's own ops)."""

from __future__ import annotations

from planner.cost import head_scatter
from planner.cost.layers import LayerCost
from planner.cost.rules import layer_extra_bytes, runtime_facts
from planner.cost.tpgathered import tp_gathered_kept_bytes
from planner.schema import Profile, TrainSetup
from planner.units import DTYPE_BYTES

FP32 = 4
HEAD_KIND = "norm+lm_head"
BACKWARD_PEAK = 20  # bytes an element alive beyond the kept at pow's backward: dA, dB, A.pow(1), 2 x it, the product


def elements(layer: LayerCost, profile: Profile, setup: TrainSetup) -> int:
    """E: the final norm's elements on this rank (its input's bytes over the activations' dtype) where the runtime runs
    it as eager fp32 ops on an analytic LLaMA-style head; 0 elsewhere."""
    model = profile.assumptions.get("model")
    if (
        layer.kind != HEAD_KIND
        or profile.source != "analytic"
        or not isinstance(model, dict)
        or model.get("style") != "llama"
        or not runtime_facts(setup).final_norm_eager_fp32
    ):
        return 0
    return layer.input_bytes // DTYPE_BYTES.get(profile.dtype, 2)


def kept_extra_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """What the eager norm keeps beyond the record's fused norm: A's fp32 copy (4E) in place of the bf16 input, and
    the bf16 normalised tensor `* weight` saves beside the output the LM head keeps: 4E. The head keeps its
    activations (none); under a recompute option its record's input alone, as before."""
    return FP32 * elements(layer, profile, setup) if option == 0 else 0


def backward_extra_bytes(layer: LayerCost, option: int, profile: Profile, setup: TrainSetup) -> int:
    """The norm's backward peak beyond what the head keeps (20E), over the head's own transient (the logits'
    gradient, the linear's input gradient) and its reduce-scatter's cat (head_scatter.extra_bytes): the larger, as
    the LM head's backward ends before the norm's starts (0 at every published size: the linear's is larger)."""
    peak = BACKWARD_PEAK * elements(layer, profile, setup) if option == 0 else 0
    return max(0, peak - layer_extra_bytes(layer, option) - head_scatter.extra_bytes(layer, option, profile, setup))


def kept_program(
    layer: LayerCost, option: int, profile: Profile, setup: TrainSetup, kept: int
) -> tuple[int, ...]:
    """The head's forward as torch makes its tensors where the norm runs eager (`kept`: the head's kept bytes, which
    the replay otherwise makes as one block), coded as the replay's programs (n > 0 allocates, -k frees id k), in
    torch's order with the forward's transients between; what it leaves alive is what the head keeps, freed at its
    backward's end:
      A = x.float() 4E, B = pow 4E, B freed (by mean), 1/rms 4 B a token, F 4E, G 2E, F freed, H 2E;
      under TP + SP the LM head's input gathered (torch 2.6.0 _functional_collectives.py 210-215, all_gather_tensor
      on the sequence dimension: all_gather_into_tensor's output, then torch.cat of its chunks, the LM head's saved
      input; the first freed, then H, which nothing saves); without, H is the LM head's saved input;
      what else the head's kept counts, one block last.
    The mean's and eps's per-token temporaries are not played (16 KiB at the 405B rows: the small pool's).
    () where there is no norm to play or its tensors would exceed `kept` (one block, as before)."""
    count = elements(layer, profile, setup) if option == 0 else 0
    if not count:
        return ()
    hidden = profile.assumptions["model"]["hidden_size"]
    two, four, rstd = 2 * count, FP32 * count, FP32 * (count // hidden)
    gathered = tp_gathered_kept_bytes(layer, option, profile, setup) + layer.input_bytes
    program = (four, four, -2, rstd, four, two, -4, two)  # A, B, 1/rms, F, G, H
    if gathered > two:
        program += (
            gathered,
            gathered,
            -7,
            -6,
        )  # the all-gather's output, its cat; both freed but the cat
    rest = kept - (four + rstd + two + gathered)
    if rest < 0:
        return ()
    return program + ((rest,) if rest else ())


def with_backward(program: tuple[int, ...], hands: int, count: int) -> tuple[tuple[int, ...], int]:
    """The head's backward program (fsdp2_layers.backward_hand's: the logits' gradient received first, then the LM
    head's) followed by the norm's requests in torch's order; `hands`: the id of the gradient the LM head's part
    hands on (dH: the reduce-scatter's shard under SP), which the norm's backward consumes. The logits' gradient is
    freed first (the engine drops a node's input once it has run). Returns the program and the id of dx, the
    gradient it now hands on; as given where there is no norm to play or no dH."""
    if not count or not hands or not program:
        return program, hands
    made = sum(1 for code in program if code > 0)
    names = ("dW", "dG", "dF", "dS", "dA", "dB", "p1", "p2", "p3", "sum", "dx")
    ids = {name: made + n for n, name in enumerate(names, 1)}
    two, four = 2 * count, FP32 * count
    # fmt: off
    norm = (-1, two, two, -ids["dW"], -hands,  # the logits' gradient; `* weight`'s two, dH
            four, -ids["dG"],  # type_as's dF
            four, four, -ids["dS"], -ids["dF"],  # the product's d(rsqrt) and dA
            four, four, four, four, -ids["p2"], -ids["p1"], -ids["dB"],  # mean's dB; pow's three
            four, -ids["dA"], -ids["p3"],  # A's two gradients summed
            two, -ids["sum"])  # dx
    # fmt: on
    if hands == 1 or -1 in program:  # no separate received gradient (dH is the first tensor), or freed already
        norm = norm[1:]
    return (*program, *norm), ids["dx"]


def kept_frees(
    program: tuple[int, ...], hands: int, kept: tuple[int, ...]
) -> tuple[tuple[int, int], ...]:
    """Where the head's backward releases what kept_program (`kept`) left alive, as (the index of the code in
    with_backward's program it is freed before, the kept program's id). The engine releases a node's saved tensors
    once the node has run (torch/csrc/autograd/engine.cpp evaluate_function: call_function, then
    fn.release_variables() unless the graph is kept); the recorder on the installed torch frees them there
    (docs/framework-facts.md §212):
      the LM head's input (the cat under SP, else H) once its linear's node has made the input's gradient (the
      program's second tensor, after the logits' gradient received), before the reduce-scatter's dH;
      G once `* weight`'s has (before dH is freed); 1/rms once rsqrt's has, after the product's (dF freed) and
      before mean's dB; A once pow's has (before A's two gradients are summed).
    `program`, `hands`: the head's program and hands before with_backward. () where there is no kept program or no
    norm's part (all freed at the head's end, as before)."""
    if not kept or not hands or not program:
        return ()
    start = len(program) - (
        hands == 1 or -1 in program
    )  # where the norm's part's index 0 would be (dropped at hands 1, or where the head freed the logits' gradient)
    allocs = [at for at, code in enumerate(program) if code > 0]
    linear_done = allocs[1] + 1 if len(allocs) > 1 else len(program)
    if linear_done < len(program) and program[linear_done] == -1:  # the node's inputs go before its saved tensors
        linear_done += 1
    lm_input = 8 if -7 in kept else 6
    return ((linear_done, lm_input), (start + 4, 5), (start + 11, 3), (start + 18, 1))


ROWS = (
    (
        "the final norm's eager fp32 tensors beyond the record's fused norm (torchtitan's RMSNorm)",
        "kept",
        "layer",
        lambda layer, ckpt, ctx: kept_extra_bytes(layer, int(ckpt), ctx.profile, ctx.setup),
        "the runtime's record (final_norm_eager_fp32): torchtitan 9dec370 torchtitan/models/norms.py RMSNorm, outside "
        "the compiled blocks (parallelize_llama.py 297-306); x.float() and the bf16 normalised tensor saved: 4 B an "
        "element (planner/cost/eager_norm.py)",
    ),
    (
        "the final norm's eager fp32 backward beyond the head's own",
        "extra",
        "layer",
        lambda layer, ckpt, ctx: backward_extra_bytes(layer, int(ckpt), ctx.profile, ctx.setup),
        "as above; torch's derivatives.yaml (pow, mean, mul, _to_copy) as recorded: 20 B an element at pow's backward",
    ),
)
