"""The copies transformers' latent attention makes around its GEMMs, rotary and attention kernel, per device and
microbatch (T tokens, n = heads / t, d_qk = nope + rope): bytes the eager count (analytic_time._projections)
charges beside rotary and the latent norms. Read at transformers 5.24.0, models/deepseek_v3/modeling_deepseek_v3.py
`DeepseekV3Attention.forward` and `expand_kv` (deepseek_v2's are the same code), integrations/sdpa_attention.py,
and traced op by op under the fake profile (tests/test_mla_copies.py; docs/framework-facts.md §117):

forward, in the attention module:
- `torch.cat((q_pass, q_rot), dim=-1)`: the query rebuilt, Q read and written (4·T·n·d_qk);
- `expand_kv`: `key_states = new_empty(...)` (no traffic), then `key_states[..., :nope].copy_(k_nope)` and
  `key_states[..., nope:].copy_(k_rot)` (k_rot expanded over the heads: read per element written): the key read
  and written (4·T·n·d_qk);
- sdpa_attention_forward's `attn_output.transpose(1, 2).contiguous()`: the output copied to token-major
  (4·T·n·v; the `reshape(...).contiguous()` after it is a view).
backward (autograd's nodes for those ops):
- kv_b_proj's output: `view(...).transpose(1, 2)`'s ViewBackward copies the transposed gradient (4·T·n·(nope + v))
  and torch.split's SplitWithSizesBackward concatenates dK_nope and dV (4·T·n·(nope + v));
- kv_a_proj_with_mqa's output split into the latent and k_rot: its SplitWithSizesBackward (4·T·(kv_rank + rope));
- the key's two CopySlices: each copies the whole key gradient (4·T·n·d_qk each), clones its slice for the source's
  gradient (4·T·n·nope, 4·T·n·rope), and the rope slice's is zero-filled and copied back (zeros_like, a write,
  2·T·n·rope; the copy 4·T·n·rope); k_rot's expand summed over the heads (reads 2·T·n·rope, writes 2·T·rope);
- the query's split and view: SplitWithSizesBackward's cat and ViewBackward's copy (4·T·n·d_qk each).
The query's cat and the output's copy have view-only gradients (slices, an identity).

Op classes (membound.OP_CLASSES) as the fake profile's module tracker puts them (fake.OpBytes._class): the
forward's and the kv side's backward in `attention`, the query side's backward in `elementwise` (it runs after
the attention module's backward hooks, where the tracker has q_proj / q_b_proj innermost).

Where the fake profile counts more, by its convention for in-place ops and fills (fake._moved_bytes: every
input and output): an in-place copy_'s destination is counted read as well as written, zeros_like's input read.
These counts are the kernels' (read the source, write the destination); the difference is `fake_only_bytes`.

Megatron-core on Transformer Engine runs none of these (te_mla.py: the fused MLA rotary writes the key and value,
rotates the query in place, and TE's attention takes and gives sbhd tensors); its record replaces them.
"""

from __future__ import annotations

from collections import Counter


def _widths(arch, shape) -> tuple[int, int, int, int, int]:
    heads = arch.num_heads // shape.tp
    return (heads, arch.qk_nope_head_dim + arch.qk_rope_head_dim, arch.qk_nope_head_dim, arch.qk_rope_head_dim,
            arch.v_head_dim)


def up_bytes(arch, shape) -> int:
    """The forward's query cat and key build (what follows the up projections and rotary, before the kernel)."""
    if not arch.mla:
        return 0
    n, d_qk, _, _, _ = _widths(arch, shape)
    return 4 * shape.tokens * n * d_qk * 2


def forward_bytes(arch, shape) -> Counter:
    """The forward's copies by op class: the query's cat, the key's two slice copies, the output's."""
    if not arch.mla:
        return Counter()
    n, _, _, _, v = _widths(arch, shape)
    return Counter(attention=up_bytes(arch, shape) + 4 * shape.tokens * n * v)


def backward_bytes(arch, shape) -> Counter:
    """The backward's copies, concatenations and sums by op class (the module docstring)."""
    if not arch.mla:
        return Counter()
    T = shape.tokens
    n, d_qk, nope, rope, v = _widths(arch, shape)
    kv_side = (4 * T * n * (nope + v) * 2  # ViewBackward's copy, SplitWithSizesBackward's cat
               + 4 * T * (arch.kv_lora_rank + rope)  # the latent / k_rot split's cat
               + 2 * 4 * T * n * d_qk  # each CopySlices copies the whole key gradient
               + 4 * T * n * nope + 4 * T * n * rope  # the slices' gradients cloned
               + 2 * T * n * rope + 4 * T * n * rope  # the rope slice zero-filled, copied back
               + 2 * T * n * rope + 2 * T * rope)  # k_rot's expand summed over the heads
    q_side = 4 * T * n * d_qk * 2  # the query's split (cat) and view (copy)
    return Counter(attention=kv_side, elementwise=q_side)


def fake_only_bytes(arch, shape) -> tuple[int, int]:
    """(forward, backward) bytes the fake profile's op count adds to these: the in-place copies' destinations read
    (forward the key, 2·T·n·d_qk; backward the two whole-key copies and the rope slice's, 2·2·T·n·d_qk +
    2·T·n·rope) and zeros_like's input (2·T·n·rope)."""
    if not arch.mla:
        return 0, 0
    T = shape.tokens
    n, d_qk, _, rope, _ = _widths(arch, shape)
    return 2 * T * n * d_qk, 2 * 2 * T * n * d_qk + 2 * T * n * rope + 2 * T * n * rope
