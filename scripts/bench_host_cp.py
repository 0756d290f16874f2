"""The host's time for Megatron-core's TE-spec dense block under context parallelism 2 (Transformer Engine's
AttnFuncWithCPAndKVP2P, `--cp-comm-type p2p`), as multiples of one torch Linear forward on the machine this runs on,
the same way scripts/bench_host.py times the block without it (CPU tensors, tiny shapes: dispatch, not arithmetic).

The replica is AttnFuncWithCPAndKVP2P's forward and backward for cp_size 2, causal, sbhd, bf16, the fused-attention
backend (TransformerEngine f8a01cd5, v2.16.0, transformer_engine/pytorch/attention/dot_product_attention/
context_parallel.py 1407-2990, with cp_p2p_fwd_prepare_qkv 742-860, cp_p2p_bwd_prepare_qkv 1103-1168,
cp_p2p_bwd_fused_attn 1169-1307), each rank's path as the code branches on it (rank 0 takes the upper triangle at
step 1, rank 1 the lower):
- forward: q, k, v made contiguous (FusedAttention.forward under CP, backends.py 2117-2119) and viewed as two
  chunks; K and V flattened and concatenated (the first p2p buffer); per step an
  empty receive buffer (step 0), K and V sliced and viewed from the buffer, the section's views or halves, one
  fused-attention call (tex.fused_attn_fwd: here one CPU flash-attention op returning the output and its logsumexp,
  beside the permutes the stand-in needs), the logsumexp cloned (step 1) or corrected (step 2: the compiled
  flash_attn_fwd_softmax_lse_correction, or its second-half version); then the outputs merged (the compiled
  flash_attn_fwd_out_correction_init, then flash_attn_fwd_out_correction or its second-half version), viewed, cast;
- backward: the second half's logsumexp (view, slice, contiguous, unsqueeze_), the logsumexp's unsqueeze_, dq's
  buffer and the two p2p buffer pairs (empty, empty, copy_ of K/V in), dout and out viewed; per step the send and
  receive buffers picked, K and V sliced and viewed, the section's views or halves (and .contiguous() where
  cp_p2p_bwd_fused_attn makes them), one fused-attention backward call (tex.fused_attn_bwd: here one CPU
  flash-attention backward op), dq, dk and dv written or added into their buffers by the section's halves; the
  three gradients viewed back to sbhd.
Not replicated: the p2p sends and receives and their waits (collectives), the two CUDA streams and the correction
event (record_event, wait_event, wait_stream: no CPU counterpart), TE's Python wrapper around each tex call (the
replica calls the op directly, as bench_host.py's TE modules are one torch call each).

Prints the ring block's forward and backward per rank next to the block without CP. Run:
    PYTHONPATH=$PWD python scripts/bench_host_cp.py [--repeats 9] [--calls 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_host as bh  # noqa: E402  (the block replica and its timing)

CP = 2


def _flash_fwd(q, k, v, causal: bool):  # sbhd in; out sbhd, lse [b, h, s]: one op stands for tex.fused_attn_fwd
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.permute(1, 2, 0, 3), k.permute(1, 2, 0, 3), v.permute(1, 2, 0, 3), 0.0, causal)
    return out.permute(2, 0, 1, 3), lse


def _flash_bwd(dout, q, k, v, out, lse, causal: bool):  # one op stands for tex.fused_attn_bwd
    p = [t.permute(1, 2, 0, 3) for t in (dout, q, k, v, out)]
    dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
        p[0], p[1], p[2], p[3], p[4], lse, 0.0, causal)
    return dq.permute(2, 0, 1, 3), dk.permute(2, 0, 1, 3), dv.permute(2, 0, 1, 3)


def _lse_correction(lse, lse_step):  # context_parallel.py flash_attn_fwd_softmax_lse_correction (jit_fuser)
    max_scale = torch.max(lse, lse_step)
    min_scale = torch.min(lse, lse_step)
    lse.copy_(max_scale + torch.log1p(torch.exp(min_scale - max_scale)))


def _second_half_lse_correction(lse, lse_step):
    lse_ = lse[..., 1, :]
    max_scale = torch.max(lse_, lse_step)
    min_scale = torch.min(lse_, lse_step)
    lse_.copy_(max_scale + torch.log1p(torch.exp(min_scale - max_scale)))


def _out_correction_init(out_step, lse, lse_step, seq_dim: int):
    exp = torch.exp(lse_step - lse).movedim(2, seq_dim).unsqueeze(-1)
    return (out_step * exp).to(out_step.dtype)


def _out_correction(out, out_step, lse, lse_step, seq_dim: int):
    exp = torch.exp(lse_step - lse).movedim(2, seq_dim).unsqueeze(-1)
    out.add_(out_step * exp)


def _second_half_out_correction(out, out_step, lse, lse_step, seq_dim: int):
    out_ = out.select(seq_dim, 1)
    lse_ = lse.view(*lse.shape[:-1], 2, -1)[..., 1, :]
    exp = torch.exp(lse_step - lse_).movedim(2, seq_dim).unsqueeze(-1)
    out_.add_(out_step * exp)


FUSED = {"lse": _lse_correction, "lse2": _second_half_lse_correction, "init": _out_correction_init,
         "out": _out_correction, "out2": _second_half_out_correction}


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, rank: int):
        q, k, v = (x.view(2, x.shape[0] // 2, *x.shape[1:]) for x in (q, k, v))
        k_shape, v_shape, n = k.shape, v.shape, k.numel()
        buffers = [torch.cat((k.view(-1), v.view(-1)), dim=-1), None]
        outs, lses, halves = [None] * CP, [None] * CP, [None] * CP
        lse = None
        for i in range(CP + 1):
            if i < CP:
                if i < CP - 1:
                    buffers[i + 1] = torch.empty_like(buffers[i])
                kv = buffers[i % 2] if i == 0 else buffers[0]  # the received copy: the same shape here
                k_part, v_part = kv[:n].view(*k_shape), kv[n:].view(*v_shape)
                if i == 0:  # diagonal
                    qp, kp, vp = (x.view(-1, *x.shape[-3:]) for x in (q, k_part, v_part))
                    outs[i], lses[i] = _flash_fwd(qp, kp, vp, True)
                elif i <= rank:  # lower triangle
                    qp, kp, vp = q.view(-1, *q.shape[-3:]), k_part[0], v_part[0]
                    outs[i], lses[i] = _flash_fwd(qp, kp, vp, False)
                else:  # upper triangle
                    qp, kp, vp = q[1], k_part.view(-1, *k_shape[-3:]), v_part.view(-1, *v_shape[-3:])
                    outs[i], lses[i] = _flash_fwd(qp, kp, vp, False)
                    halves[i] = True
            if i > 0:
                if i == 1:
                    lse = torch.clone(lses[0])
                elif (i - 1) <= rank:
                    FUSED["lse"](lse, lses[i - 1])
                else:
                    FUSED["lse2"](lse.view(*lse.shape[:-1], 2, -1), lses[i - 1])
        out = None
        for i in range(CP):
            if i <= rank:
                if i == 0:
                    out = FUSED["init"](outs[0], lse, lses[0], 0).view(-1, *outs[0].shape[1:])
                else:
                    FUSED["out"](out.view(*outs[i].shape), outs[i], lse, lses[i], 0)
            else:
                FUSED["out2"](out.view(2, -1, *out.shape[1:]), outs[i], lse, lses[i], 0)
        out = out.view(-1, *out.shape[-3:])
        out_ret = out.to(q.dtype)
        ctx.save_for_backward(q, buffers[-1], out, lse)
        ctx.rank, ctx.shapes, ctx.n = rank, (k_shape, v_shape), n
        return out_ret

    @staticmethod
    def backward(ctx, dout):
        q, kv, out, lse = ctx.saved_tensors
        rank, (k_shape, v_shape), n = ctx.rank, ctx.shapes, ctx.n
        lse_ = None
        if rank < CP - 1:  # causal, the second half's logsumexp (second_half_lse_seqlen set)
            lse_ = lse.view(*lse.shape[:-1], 2, -1)[..., 1, :].contiguous()
            lse_.unsqueeze_(-1)
        lse = lse.unsqueeze(-1)  # unsqueeze_ on the saved tensor in TE
        dq_buffer = torch.empty_like(q)
        buffers = [torch.empty((2, *kv.shape), dtype=kv.dtype), torch.empty((2, *kv.shape), dtype=kv.dtype)]
        buffers[0][0].copy_(kv)
        dout = dout.view(*q.shape)
        out = out.view(*q.shape)
        dk = dv = None
        for i in range(CP):
            send, recv = buffers[i % 2], buffers[(i + 1) % 2]
            send, recv = (send[0], recv[0]) if i == 0 else (send[1], recv[1])
            kv_i = buffers[i % 2][0]
            k_part, v_part = kv_i[:n].view(*k_shape), kv_i[n:].view(*v_shape)
            if i == CP - 1:  # diagonal
                parts = [x.view(-1, *x.shape[-3:]) for x in (q, k_part, v_part, out, dout)]
                dq_, dk_, dv_ = _flash_bwd(parts[4], *parts[:4], lse.squeeze(-1), True)
            elif i >= CP - rank - 1:  # lower triangle
                qp, op, dp = (x.view(-1, *x.shape[-3:]) for x in (q, out, dout))
                kp, vp = k_part[0].contiguous(), v_part[0].contiguous()
                dq_, dk_, dv_ = _flash_bwd(dp, qp, kp, vp, op, lse.squeeze(-1), False)
            else:  # upper triangle
                qp, op, dp = (x.contiguous() for x in (q[1], out[1], dout[1]))
                kp, vp = (x.view(-1, *x.shape[-3:]) for x in (k_part, v_part))
                dq_, dk_, dv_ = _flash_bwd(dp, qp, kp, vp, op, lse_.squeeze(-1), False)
            dq = dq_buffer
            if i >= CP - rank - 1:
                dq_ = dq_.view(*dq.shape)
                if i == 0:
                    dq.copy_(dq_)
                elif i == CP - rank - 1:
                    dq[0].copy_(dq_[0])
                    dq[1].add_(dq_[1])
                else:
                    dq.add_(dq_)
            elif i == 0:
                dq[0].fill_(0)
                dq[1].copy_(dq_)
            else:
                dq[1].add_(dq_)
            dkv = buffers[(i + 1) % 2][1]
            dk, dv = dkv[:n].view(*k_shape), dkv[n:].view(*v_shape)
            if i < CP - rank - 1 or i == CP - 1:
                dk_, dv_ = dk_.view(*k_shape), dv_.view(*v_shape)
            if i == 0:
                if rank == CP - 1:
                    dk[0].copy_(dk_)
                    dv[0].copy_(dv_)
                else:
                    dk.copy_(dk_)
                    dv.copy_(dv_)
            elif i == CP - 1:
                dk[0].add_(dk_[0])
                dk[1].copy_(dk_[1])
                dv[0].add_(dv_[0])
                dv[1].copy_(dv_[1])
            del send, recv
        dq, dk, dv = (x.view(-1, *x.shape[2:]) for x in (dq_buffer, dk, dv))
        return dq, dk, dv, None


class RingAttention(nn.Module):
    """TEDotProductAttention's core under CP 2, p2p (one rank's path), sbhd in and out."""

    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def forward(self, q, k, v):
        q, k, v = (x.contiguous() for x in (q, k, v))  # FusedAttention.forward under CP (backends.py 2117-2119)
        out = _RingAttention.apply(q, k, v, self.rank)
        return out.reshape(out.shape[0], out.shape[1], -1)


def parts():
    torch.manual_seed(0)
    lin = nn.Linear(bh.H, bh.H)

    def x_in():
        return torch.randn(bh.S, bh.B, bh.H, requires_grad=True)

    return [("torch Linear (the unit)", lin, x_in),
            ("dense block (TE spec replica)", bh.Block(), x_in)] + [
        (f"dense block, CP 2 ring (rank {rank})", bh.Block(RingAttention(rank)), x_in) for rank in range(CP)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--calls", type=int, default=200)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    rows = parts()
    for table in (bh.FUSED, FUSED):  # Megatron's jit_fuser and TE's: torch.compile on torch >= 2.2 / 2.0
        for name in list(table):
            table[name] = torch.compile(table[name])
    samples = {name: [] for name, _, _ in rows}
    for _ in range(args.repeats):
        for name, fwd, make in rows:
            samples[name].append(bh.measure(fwd, make, args.calls))
    unit = min(f for f, _ in samples[rows[0][0]])
    print(f"torch {torch.__version__}, {args.repeats} repeats x {args.calls} calls, S={bh.S} B={bh.B} H={bh.H}")
    print("| part | fwd µs, least (median) | bwd µs, least (median) | fwd / Linear fwd | bwd / Linear fwd |")
    print("|---|---|---|---|---|")
    for name, _, _ in rows:
        fs = [f for f, _ in samples[name]]
        bs = [b for _, b in samples[name]]
        print(f"| {name} | {min(fs):.1f} ({statistics.median(fs):.1f}) | {min(bs):.1f} ({statistics.median(bs):.1f}) "
              f"| {min(fs) / unit:.2f} | {min(bs) / unit:.2f} |")


if __name__ == "__main__":
    main()
