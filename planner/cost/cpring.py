"""torch's all-gather context-parallel ring as the allocations it makes, in order, for the caching allocator's
replay (planner/cost/fsdp2_layers.py plays them inside a block's backward).

Read in torch 2.6.0 (git 2236df17, the release nearest the CP rows' torch 1963fc8, docs/framework-facts.md §28,
§91): `torch/distributed/tensor/experimental/_attention.py`, `_templated_ring_attention` 358-528 (the forward,
which a full recompute reruns inside the backward), `_partial_update` 95-117, `_SDPAMerger` 120-193,
`_AllToAllRotater` 282-298, `_AllGatherRotater` 301-330, `_templated_ring_attention_backward` 606-772. Sizes on the busiest rank, cp - 1 (every
step after the first is `i <= rank`: all its queries against the first half of the received K/V, never the
`partial` branch), from the exchange as the runtime hands it to attention (contextparallel.as_exchanged): Q (and
the output O) `q` bytes, K with V `kv` bytes, bf16. Programs are coded as fsdp2_layers' (n > 0 allocates n bytes,
the next id from 1; -k frees id k); every tensor is freed by the program's end, so the ring leaves nothing behind
(its outputs become the tensors the block's record counts: the attention's output in the forward, its input
gradients in the backward). The lse (one fp32 a head and token: 1 / head_dim of O) is left out; flash's
backward's fp32 dQ accumulator is played (_flash_scratch), its softmax_d (one fp32 a head and query) is not.

- forward (462-528, 120-193): K and V `.contiguous()` (torchtitan's repeated K/V are transposed views: copies);
  step 0 concatenates them (`torch.cat`) and all-gathers the concatenation once (`ft_c.all_gather_tensor`, a
  cp x kv output; the input is held until the collective is waited, at step 1); step 0's output (O), cast to
  fp32 as the merger's running output (2 O). At step 1 the wait frees the concatenation and the K/V views
  into the gathered buffer free the copies. Every later step but the last concatenates again (freed at once:
  `next_kv = rotater.exchange_buffers(next_kv)` is None); its output (O) is made while the previous one is
  alive; the merger casts it (2 O), makes `out - block_out` (2 O), the product with the sigmoid (2 O, the
  difference freed), the new running output (2 O, the product freed), frees the old one and the cast. The end:
  the merged output back to bf16 is the attention's output (the record's), the rest freed when the function
  returns.
- backward (606-772): fp32 zeros for dQ (2 Q), dK and dV (kv each, fp32), K and V `.contiguous()` again; step 0
  concatenates and all-gathers as the forward (not where a compiled, fully recomputed block's backward reuses
  its rerun's gather, contextparallel.reuses_recomputed_gather: the rerun's gathered buffer is held to here);
  each step's flash backward makes dq, dk, dv (Q, and K's shape twice: kv / 2 at step 0, kv / 4 at later steps
  on half the received keys) while the previous step's are alive, and inside the call its fp32 dQ accumulator
  (2 Q, FlashAttention-2's mha_bwd dq_accum, freed when it returns: _flash_scratch); step 0 adds into the zeros in place,
  concatenates dK, dV in fp32 (2 kv) and passes it on (`_AllToAllRotater`: `permute_tensor`, a 2 kv output,
  the input held until its wait); a later step waits for the received buffer (the sent one freed; dK, dV become
  views of it, the previous dK, dV freed), `_partial_update` adds into its first half in place and concatenates
  each whole (kv, kv), concatenates both to send (2 kv) and passes it on (the rotater drops the received buffer
  when it holds the next, `self._buffer`, 294); the K/V concatenation of every step but the last is held by
  `next_kv` until the next (654); dQ `+=` in place. The end: dQ to bf16 (Q; the fp32 freed), the last received dK/dV waited (the last sent freed) and cast
  to bf16 (kv), every local freed at the return; the bf16 gradients are the block's (freed here: its record
  counts what its backward makes).
- compiled (torchtitan 9dec370 compiles each block whole, fullgraph: the ring is traced into the block's graph):
  the pointwise chains fuse into one kernel each, as inductor's own kernels were read for
  contextparallel.ring_bytes (scripts/cp_ring_bytes.py at torch 2.6.0): K/V's contiguous copies and their
  concatenation are repeat_kv's one copy, the concatenations after step 0 are dead; each merge is one kernel
  writing the new fp32 running output from the old one (step 0's bf16 output at step 1) and the step's output;
  the backward's zeros and step 0's in-place adds are step 0's kernels writing fp32 dQ and the fp32 send buffer;
  each later step's partial update and concatenation one kernel writing the next send buffer from the received
  one and the step's dK, dV; dQ's `+=` a kernel writing a new fp32 dQ (functionalised: out of place); the casts
  to bf16 at the end write the bf16 outputs. Each buffer freed after its last use in the graph's order. Inductor's
  in-place reuse of a dying input's buffer (config.inplace_buffers) is not applied: not read in a generated graph
  here (no torch 2.6.0 for Linux on this machine).
"""

from __future__ import annotations


class _Program:
    """A program built from named tensors: alloc(name, bytes), free(name); coded at the end."""

    def __init__(self) -> None:
        self.codes: list[int] = []
        self.ids: dict[str, int] = {}
        self.made = 0

    def alloc(self, name: str, size: int) -> None:
        assert name not in self.ids, name
        self.made += 1
        self.ids[name] = self.made
        self.codes.append(int(size))

    def free(self, *names: str) -> None:
        for name in names:
            self.codes.append(-self.ids.pop(name))

    def has(self, name: str) -> bool:
        return name in self.ids

    def free_all(self) -> None:
        self.free(*sorted(self.ids, key=self.ids.get))


def forward_program(cp: int, q: int, kv: int, *, compiled: bool) -> tuple[int, ...]:
    """The ring's forward on rank cp - 1, every tensor freed by its end."""
    p = _Program()
    _forward(p, cp, q, kv, compiled=compiled)
    p.free_all()
    return tuple(p.codes)


def _forward(p: _Program, cp: int, q: int, kv: int, *, compiled: bool) -> None:
    if not compiled:
        p.alloc("k", kv // 2)
        p.alloc("v", kv // 2)
    p.alloc("cat", kv)
    p.alloc("gathered", cp * kv)
    p.alloc("out", q)  # step 0's output
    if not compiled:
        p.alloc("running", 2 * q)  # cast to fp32: the merger's running output
    for i in range(1, cp):
        if i == 1:  # the gather waited: its input freed; K, V now views into the gathered buffer
            p.free("cat")
            if not compiled:
                p.free("k", "v")
        if not compiled and i < cp - 1:  # concatenated again, dropped at once
            p.alloc("cat", kv)
            p.free("cat")
        p.alloc("step_out", q)
        if compiled:  # one kernel: the new running output from the old (step 0's output at step 1) and this one,
            p.alloc("merged", 2 * q)  # both dead after it
            p.free("step_out", "out" if i == 1 else "running")
        else:
            p.free("out")
            p.alloc("cast", 2 * q)
            p.alloc("diff", 2 * q)
            p.alloc("prod", 2 * q)
            p.free("diff")
            p.alloc("merged", 2 * q)
            p.free("prod", "running", "cast")
            _rename(p, "step_out", "out")
        _rename(p, "merged", "running")


def _rename(p: _Program, old: str, new: str) -> None:
    p.ids[new] = p.ids.pop(old)


def backward_program(cp: int, q: int, kv: int, *, compiled: bool, rerun: bool, reuse_gather: bool) -> tuple[int, ...]:
    """The ring's part of a block's backward on rank cp - 1: the rerun's forward first where the block is
    recomputed whole (`rerun`), its gathered K/V kept for the backward where that reuses it (`reuse_gather`),
    then the backward's ring. Every tensor freed by the end."""
    p = _Program()
    reused = rerun and reuse_gather
    if rerun:
        _forward(p, cp, q, kv, compiled=compiled)
        gathered = p.ids.pop("gathered")
        p.free_all()
        p.ids["gathered"] = gathered
        if not reused:
            p.free("gathered")
    _backward(p, cp, q, kv, compiled=compiled)
    p.free_all()
    return tuple(p.codes)


def _backward(p: _Program, cp: int, q: int, kv: int, *, compiled: bool) -> None:
    if not compiled:  # the fp32 zeros, K and V contiguous
        p.alloc("dq", 2 * q)
        p.alloc("dk", kv)
        p.alloc("dv", kv)
        p.alloc("k", kv // 2)
        p.alloc("v", kv // 2)
    if not p.has("gathered"):
        p.alloc("cat", kv)
        p.alloc("gathered", cp * kv)
    for i in range(cp):
        if i == 1:  # the gather waited (eager: its input still held by `next_kv` until the next concatenation)
            if compiled and p.has("cat"):
                p.free("cat")
            if not compiled:
                p.free("k", "v")
        if not compiled and 0 < i < cp - 1:  # the K/V concatenation again, held until the next one
            p.alloc("cat_new", kv)
            if p.has("cat"):
                p.free("cat")
            _rename(p, "cat_new", "cat")
        width = kv // 2 if i == 0 else kv // 4  # dK, dV: the local keys at step 0, half the received after
        if compiled:
            _compiled_step(p, i, cp, q, kv, width)
            continue
        for name, size in (("g_q", q), ("g_k", width), ("g_v", width)):  # bound until the next step's replace them
            p.alloc(name + "_new", size)
        _flash_scratch(p, q)
        for name in ("g_q", "g_k", "g_v"):
            if p.has(name):
                p.free(name)
            _rename(p, name + "_new", name)
        if i == 0:  # in-place adds into the zeros; the fp32 concatenation sent, permute_tensor's output
            p.alloc("send", 2 * kv)
            p.alloc("recv", 2 * kv)
            continue
        p.free("send")  # the received buffer waited: the sent one freed
        p.free("dk", "dv")  # dK, dV now views of the received buffer
        p.alloc("dk", kv)  # _partial_update's concatenations
        p.alloc("dv", kv)
        p.alloc("send", 2 * kv)
        p.alloc("recv_new", 2 * kv)  # the rotater drops the received buffer when it holds the next
        p.free("recv")
        _rename(p, "recv_new", "recv")
    p.alloc("dq_bf16", q)
    p.free("dq")
    p.free("send")  # the last pass waited
    p.alloc("dkv_bf16", kv)
    p.free("recv")


def _compiled_step(p: _Program, i: int, cp: int, q: int, kv: int, width: int) -> None:
    """Step i of the compiled backward ring: the flash call's dq, dk, dv (the gathered K/V's last use at the last
    step), each dead after the step's kernels that read it: step 0's write fp32 dQ and the send buffer, a later
    step's the next send buffer from the received one (after the sent one's wait) and a new fp32 dQ."""
    p.alloc("g_q", q)
    p.alloc("g_k", width)
    p.alloc("g_v", width)
    _flash_scratch(p, q)
    if i == cp - 1:
        p.free("gathered")
    if i == 0:
        p.alloc("dq", 2 * q)
        p.free("g_q")
        p.alloc("send", 2 * kv)
        p.free("g_k", "g_v")
        p.alloc("recv", 2 * kv)
        return
    p.free("send")
    p.alloc("send", 2 * kv)
    p.free("recv", "g_k", "g_v")
    p.alloc("recv", 2 * kv)
    p.alloc("dq_new", 2 * q)
    p.free("dq", "g_q")
    _rename(p, "dq_new", "dq")


def _flash_scratch(p: _Program, q: int) -> None:
    """The flash backward's own fp32 dQ accumulator, made after its dq, dk, dv and dropped when the call returns:
    FlashAttention-2's `mha_bwd` (as torch vendors it, aten/src/ATen/native/transformers/cuda/flash_attn/
    flash_api.cpp, read at pytorch/pytorch 03b7c19; `loop = true` always) allocates `dq_accum` [batch,
    seqlen_q rounded up to 128, heads, head_dim rounded up to 32] fp32 outside deterministic mode: twice the
    call's Q bytes (every call on rank cp - 1 takes all its queries; the sequence lengths and head dims here are
    multiples of the roundings)."""
    p.alloc("dq_accum", 2 * q)
    p.free("dq_accum")


def peak(program, *, made: int = 0, live: int = 0) -> int:
    """The largest bytes a program holds at once (a code > 0 makes the next id, -id frees it), from `live` bytes, its
    first allocation id `made` + 1; a free of an id made before the program (<= `made`) is outside what it counts."""
    sizes: dict[int, int] = {}
    before, top = made, live
    for code in program:
        if code > 0:
            made += 1
            sizes[made] = code
            live += code
            top = max(top, live)
        elif -code > before:
            live -= sizes.pop(-code)
    return top
