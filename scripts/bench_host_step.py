"""The host's time for the rest of a Megatron-LM step, outside the transformer blocks (scripts/bench_host.py times
the blocks), as multiples of one torch Linear forward on the machine this runs on (CPU tensors, tiny shapes: each
op's time is its dispatch, not its arithmetic); the cost model carries each ratio to the GPU's host at its published
Linear forward (GPU.host_call_us: TransformerEngine#2053).

Replicas, Megatron-LM d98e8a64 (the G rows' configs):
- the embedding (megatron/core/models/common/embeddings/language_model_embedding.py `forward`: word embeddings
  (VocabParallelEmbedding at TP 1: F.embedding), position embeddings, the add, transpose(0, 1).contiguous(),
  the embedding dropout), forward and backward;
- the output layer (gpt_model.py `_postprocess`: the final TENorm, here a torch LayerNorm module; output_layer, a
  ColumnParallelLinear, here a torch Linear; no bias);
- the loss (language_module.py `compute_language_model_loss`: labels transposed, tensor_parallel
  vocab_parallel_cross_entropy's autograd Function as tensor_parallel/cross_entropy.py writes it, its three
  all-reduces over the TP group left out (collectives: not run here), the loss transposed back; pretrain_gpt.py
  `loss_func` 254-259: view, float, mul, sum, the token count and the report's cat; its two validate_result
  checks, torch.isnan and torch.isinf read as Python bools (rerun_state_machine.py: the host waits for the device
  there, a sync on a GPU)), forward and backward;
- the optimizer's step per parameter tensor (megatron/core/optimizer/optimizer.py MixedPrecisionOptimizer.step
  816-845 and distrib_optimizer.py): the gradients' shards handed to the main parameters (a view, a slice, .grad
  set), the grads-for-norm filter, count_zeros_fp32 (clip_grads.py 234-258: count_nonzero, numel - it, the running
  add), the fused Adam's per-tensor list building (TE FusedAdam.step: state lookup, four appends), the main
  parameters copied back into the bf16 shard (a view, a slice, copy_), and calc_params_l2_norm's loop
  (training/utils: the TP-duplicate filter, the main parameter appended);
- the step's fixed calls: the two multi-tensor l2 norms (gradients, parameters) and the clip's scale, TE's Adam
  (one multi-tensor call per dtype list: each one op here, as each is one kernel launch from C++), the norm's pow
  and the `.item()`s the step reads (count_zeros, the params norm, the loss scale, training_log's losses: each
  a device-to-host copy, a sync on a GPU). The all-reduces' and the tensorboard writer's host time are left out.

Run: PYTHONPATH=$PWD python scripts/bench_host_step.py [--repeats 7] [--calls 200] [--tensors 64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

S, B, H, V = 8, 2, 32, 256  # tiny: dispatch, not arithmetic


class Embedding(nn.Module):  # LanguageModelEmbedding, learned absolute positions, TP 1
    def __init__(self):
        super().__init__()
        self.word = nn.Embedding(V, H)
        self.position = nn.Embedding(S, H)

    def forward(self, tokens, position_ids):
        x = self.word(tokens) + self.position(position_ids)
        x = x.transpose(0, 1).contiguous()
        return F.dropout(x, p=0.1, training=True)


class _VocabParallelCE(torch.autograd.Function):
    """tensor_parallel/cross_entropy.py VocabParallelCrossEntropy + _VocabParallelCrossEntropy (d98e8a64), one
    TP rank holding the whole vocabulary; the all-reduces (max, predicted logits, sum of exps) not run."""

    @staticmethod
    def forward(ctx, logits, target):
        logits = logits.float()
        logits_max = torch.max(logits, dim=-1)[0]
        logits = logits - logits_max.unsqueeze(dim=-1)
        start, end = 0, logits.size(-1)
        target_mask = (target < start) | (target >= end)
        masked_target = target.clone() - start
        masked_target[target_mask] = 0
        partition = logits.size(-1)
        logits_2d = logits.view(-1, partition)
        masked_target_1d = masked_target.view(-1)
        arange_1d = torch.arange(start=0, end=logits_2d.size(0), device=logits_2d.device)
        predicted_1d = logits_2d[arange_1d, masked_target_1d]
        predicted_1d = predicted_1d.clone().contiguous()
        predicted = predicted_1d.view_as(target)
        predicted[target_mask] = 0.0
        exp_logits = logits
        torch.exp(logits, out=exp_logits)
        sum_exp = exp_logits.sum(dim=-1)
        loss = torch.log(sum_exp) - predicted
        exp_logits.div_(sum_exp.unsqueeze(dim=-1))
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_input = softmax
        partition = softmax.size()[-1]
        grad_2d = grad_input.view(-1, partition)
        arange_1d = torch.arange(start=0, end=grad_2d.size(0), device=grad_2d.device)
        softmax_update = 1.0 - target_mask.view(-1).float()
        grad_2d[arange_1d, masked_target_1d] -= softmax_update
        grad_input.mul_(grad_output.unsqueeze(dim=-1))
        return grad_input, None


class Output(nn.Module):
    """gpt_model.py _postprocess: the final norm and the output layer."""

    def __init__(self):
        super().__init__()
        self.final_norm = nn.LayerNorm(H)
        self.output_layer = nn.Linear(H, V, bias=False)

    def forward(self, hidden):
        return self.output_layer(self.final_norm(hidden))


class Loss(nn.Module):
    """language_module.py compute_language_model_loss, then pretrain_gpt.py loss_func."""

    def forward(self, logits, labels, loss_mask):
        labels = labels.transpose(0, 1).contiguous()
        loss = _VocabParallelCE.apply(logits, labels).transpose(0, 1).contiguous()
        losses = loss.view(-1).float()  # loss_func
        mask = loss_mask.view(-1).float()
        total = torch.sum(losses * mask)
        num_tokens = mask.sum().clone().detach().to(torch.int)
        report = torch.cat([total.clone().detach().view(1), num_tokens.view(1)])
        if bool(torch.isnan(total)) or bool(torch.isinf(total)):  # validate_result x2: a sync each on a GPU
            raise RuntimeError("found NaN or Inf in local forward loss calculation")
        del report
        return total


class _Range:  # distrib_optimizer's param range map entry
    def __init__(self, start, end):
        self.start, self.end, self.size = start, end, end - start


class Model:
    """`tensors` bf16 parameters as Megatron's DDP and optimizers hold them: each with its fp32 main_grad (a view
    of the grad buffer), its fp32 main parameter (the distributed optimizer's shard), the attributes the loops
    read (tensor_model_parallel, allreduce; no `shared`), and Adam's two states on the main parameter."""

    def __init__(self, tensors: int, numel: int = 4 * H):
        self.params = [nn.Parameter(torch.zeros(numel)) for _ in range(tensors)]
        self.mains = [torch.zeros(numel // 2) for _ in range(tensors)]
        self.ranges = {}
        for i, (p, m) in enumerate(zip(self.params, self.mains)):
            p.tensor_model_parallel = bool(i % 2)
            p.allreduce = True
            p.main_grad = torch.randn(numel)
            p.main_param = m
            p.main_param_sharded = True
            p.grad_added_to_main_grad = False
            self.ranges[p] = {"param": _Range(0, numel // 2)}
        self.state = {m: {"exp_avg": torch.zeros_like(m), "exp_avg_sq": torch.zeros_like(m)} for m in self.mains}


def grad_hook(model: Model, add: bool):
    """DDP's backward post-hook, per parameter per microbatch (distributed_data_parallel.py 560-584, d98e8a64):
    the main_grad add where the weight-gradient GEMM did not accumulate into it (grad_added_to_main_grad False:
    --no-gradient-accumulation-fusion, and every bias and norm weight), .grad dropped, register_grad_ready's
    membership test (the last microbatch's: a set add and a length check)."""
    bucket = set()
    for p in model.params:
        p.grad = p.main_grad if add else None  # autograd's .grad as the hook finds it (a stand-in tensor)
        if p in model.ranges:
            if p.grad is not None and not p.grad_added_to_main_grad:
                p.main_grad.add_(p.grad.data)
            p.grad = None
            bucket.add(p)
            if len(bucket) == len(model.params) + 1:  # start_grad_sync: not reached here
                raise AssertionError


def _not_tp_duplicate(p):  # tensor_parallel/layers.py 95-111 (a TP group's rank 0)
    if hasattr(p, "tensor_model_parallel") and p.tensor_model_parallel:
        return True
    return True


def _not_shared(p):  # transformer/module.py 26
    return not hasattr(p, "shared") or not p.shared


def step_loops(model: Model):
    """The optimizer step's per-tensor loops before its inner step (optimizer.py 743-845, distrib_optimizer.py
    2756-2800, d98e8a64): zero_grad's .grad = None, get_parameters, _copy_model_grads_to_main_grads (range map,
    view, slice, .float()), _filter_grads_for_norm (the filter, not shared, not a TP duplicate), clip_grad_by_total
    _norm_fp32's list (the grad's type() string asserted, detach)."""
    for m in model.mains:  # zero_grad(set_to_none=True)
        m.grad = None
    params = [p for p in model.params]  # get_parameters
    for p, m in zip(params, model.mains):
        rng = model.ranges[p]["param"]
        assert rng.size == m.nelement()
        m.grad = p.main_grad.view(-1)[rng.start:rng.end].float()
    grads = []
    for p, m in zip(params, model.mains):  # the distributed optimizer's main shards
        if m.grad is not None and _not_shared(p) and _not_tp_duplicate(p):
            grads.append(m.grad)
    clip = ([], [])
    for m in model.mains:
        if m.grad is not None:
            assert m.grad.type() == "torch.FloatTensor"  # 'torch.cuda.FloatTensor' on a GPU
            clip[0].append(m)
            clip[1].append(m.grad.detach())
    return grads, clip


def adam_loops(model: Model):
    """The loops of step_with_ready_grads (optimizer.py 777-813, distrib_optimizer.py 2802-2850): TE FusedAdam.step's
    lists (state lookup, four appends), _copy_main_params_to_model_params (view, slice, copy_ into the bf16
    parameter). Under --log-num-zeros-in-grad they run after count_zeros' .item()."""
    lists = ([], [], [], [])
    for m in model.mains:
        if m.grad is None:
            continue
        state = model.state[m]
        lists[0].append(m.grad)
        lists[1].append(m)
        lists[2].append(state["exp_avg"])
        lists[3].append(state["exp_avg_sq"])
    for p, m in zip(model.params, model.mains):
        rng = model.ranges[p]["param"]
        p.data.view(-1)[rng.start:rng.end].copy_(m)
    return lists


def count_zeros_loop(model: Model):
    """count_zeros_fp32's loop (clip_grads.py 234-258): per tensor its filters, count_nonzero, numel less it, the
    running add (--log-num-zeros-in-grad)."""
    total = torch.zeros(1, dtype=torch.int64)
    for p, m in zip(model.params, model.mains):
        grad_not_none = hasattr(m, "grad") and m.grad is not None
        if getattr(m, "__fsdp_param__", False) and grad_not_none:
            raise AssertionError
        if grad_not_none and _not_shared(p) and _not_tp_duplicate(p) and not getattr(p, "is_gtp_weight_remat", False):
            grad = m.grad.detach()
            total = grad.numel() - torch.count_nonzero(grad) + total
    return total


def params_norm_loop(model: Model):
    """calc_params_l2_norm's loop (training/utils/common_utils.py 80-168, d98e8a64): per tensor its GTP and TP
    filters, the expert test, _get_param_data's main parameter, the bucket append (--log-params-norm)."""
    buckets = ([], [])
    for p in model.params:
        is_gtp = getattr(p, "is_gtp_weight_remat", False)
        if not is_gtp and not _not_tp_duplicate(p):
            continue
        is_expert = not getattr(p, "allreduce", True)
        if not is_expert and _not_shared(p):
            if hasattr(p, "main_param"):
                sharded = getattr(p, "main_param_sharded", False)
                (buckets[1] if sharded else buckets[0]).append(p.main_param)
    return buckets


def fixed_step(flat_g, flat_p, loss_report, zeros: bool, params_norm: bool):
    """The step's per-call work (module docstring): the gradients' multi-tensor l2 norm (one op), its pow and
    TE's multi_tensor_scale_tensor clip (clip_grads.py 113-138, 177-188: no .item()), TE FusedAdam's kernel (one
    op), the loss's .item() in training_log (3312); with --log-num-zeros-in-grad count_zeros' .item(); with
    --log-params-norm calc_params_l2_norm's eight buckets (_compute_norm_2: an l2 norm and its square, or zeros),
    their sums and its .item()."""
    norm = torch.linalg.vector_norm(flat_g)
    total = (norm ** 2.0).pow(1.0 / 2.0)
    coeff = 1.0 / (total + 1.0e-6)
    coeff.clamp_max_(1.0)
    flat_g.mul_(coeff)
    flat_p.add_(flat_g, alpha=-1e-4)
    lm_loss = loss_report.float().sum().item()
    if zeros:
        torch.zeros(1, dtype=torch.int64).item()
    if params_norm:
        dense = torch.linalg.vector_norm(flat_p)
        sharded = torch.linalg.vector_norm(flat_p)
        parts = [dense * dense, sharded * sharded] + [torch.zeros(1) for _ in range(6)]
        norm_2 = parts[0] + parts[1] + parts[2] + parts[3]
        moe_gtp = parts[6] + parts[7]
        moe = parts[4] + parts[5] + moe_gtp
        norm_2 += moe
        norm_2.item() ** 0.5
    return lm_loss


def _time(fn, calls: int) -> float:
    return statistics.median(fn() for _ in range(calls)) * 1e6


def measure(fwd, make, calls: int, backward: bool = True) -> tuple[float, float]:
    def one_fwd():
        args = make()
        t0 = time.perf_counter()
        fwd(*args)
        return time.perf_counter() - t0

    def one_bwd():
        out = fwd(*make())
        grad = torch.ones_like(out)
        t0 = time.perf_counter()
        out.backward(grad)
        return time.perf_counter() - t0

    for _ in range(20):
        one_fwd()
        if backward:
            one_bwd()
    return _time(one_fwd, calls), (_time(one_bwd, calls) if backward else 0.0)


def parts(tensors: int):
    torch.manual_seed(0)
    lin = nn.Linear(H, H)
    emb = Embedding()
    out, loss = Output(), Loss()
    model = Model(tensors)
    flat_g, flat_p = torch.randn(tensors * H), torch.randn(tensors * H)
    report = torch.ones(2)

    def x_in():
        return (torch.randn(S, B, H, requires_grad=True),)

    def tokens():
        return torch.randint(0, V, (B, S)), torch.arange(S).unsqueeze(0).expand(B, S)

    def loss_in():
        return torch.randn(S, B, V, requires_grad=True), torch.randint(0, V, (B, S)), torch.ones(B, S)

    per = f" x {tensors} tensors"
    return [
        ("torch Linear (the unit)", lin, x_in, True),
        ("embedding (word + position, transpose, dropout)", emb, tokens, True),
        ("output layer (final norm + Linear)", out, x_in, True),
        ("loss (vocab-parallel CE + loss_func, its NaN/Inf checks)", loss, loss_in, True),
        ("DDP grad hook with main_grad.add_" + per, lambda: grad_hook(model, True), tuple, False),
        ("DDP grad hook, gradient accumulated by the GEMM" + per, lambda: grad_hook(model, False), tuple, False),
        ("optimizer step's loops before its inner step" + per, lambda: step_loops(model), tuple, False),
        ("inner step's and copy-back loops" + per, lambda: adam_loops(model), tuple, False),
        ("count_zeros loop" + per, lambda: count_zeros_loop(model), tuple, False),
        ("params norm loop" + per, lambda: params_norm_loop(model), tuple, False),
        ("step's fixed calls", lambda: fixed_step(flat_g, flat_p, report, False, False), tuple, False),
        ("step's fixed calls, count_zeros' .item()",
         lambda: fixed_step(flat_g, flat_p, report, True, False), tuple, False),
        ("step's fixed calls, params norm", lambda: fixed_step(flat_g, flat_p, report, False, True), tuple, False),
    ]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--tensors", type=int, default=64, help="parameter tensors in the per-tensor loops")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = parts(args.tensors)
    samples = {name: [] for name, *_ in rows}
    for _ in range(args.repeats):  # interleaved: drift on a shared machine spreads over every part
        for name, fwd, make, bwd in rows:
            samples[name].append(measure(fwd, make, args.calls, bwd))
    unit = min(f for f, _ in samples[rows[0][0]])
    print(f"torch {torch.__version__}, {args.repeats} repeats x {args.calls} calls, S={S} B={B} H={H} V={V}")
    print("| part | fwd µs, least (median) | bwd µs, least (median) | fwd / Linear fwd | bwd / Linear fwd |")
    print("|---|---|---|---|---|")
    for name, *_ in rows:
        fs = [f for f, _ in samples[name]]
        bs = [b for _, b in samples[name]]
        per = args.tensors if name.endswith(" tensors") else 1
        print(f"| {name} | {min(fs):.1f} ({statistics.median(fs):.1f}) | {min(bs):.1f} ({statistics.median(bs):.1f}) "
              f"| {min(fs) / unit / per:.2f}{' a tensor' if per > 1 else ''} | {min(bs) / unit:.2f} |")


if __name__ == "__main__":
    main()
