"""What Transformer Engine's userbuffers hold on a rank under Megatron-LM's --tp-comm-overlap (framework-facts §158).

TE's initialize_ub (transformer_engine/pytorch/module/base.py 102-478, TransformerEngine 4220403e, the TE
Megatron-LM 4828d651's uv.lock pinned when the golden values of row G10 were written; the same at 4329ff84,
pinned at d98e8a64) makes one communicator per GEMM it overlaps. Two kinds of memory come of it:

- the communication buffers themselves, one per GEMM: CommOverlapBase / CommOverlapP2PBase::initialize
  (common/comm_gemm_overlap/comm_gemm_overlap.cpp 311-326, 680-712) take them from
  register_user_buffer_collective (userbuffers/userbuffers-host.cpp 514-680: cuMemCreate with multicast, or
  cudaMalloc), never from torch's caching allocator: not in torch.cuda.memory_stats()'s allocated bytes, which
  is what Megatron-LM logs; not charged (their sizes: framework-facts §158);
- a cuBLAS workspace for the overlapped GEMMs: general_gemm (cpp_extensions/gemm.py 133) takes
  get_cublas_workspace(device, ub is not None, ...), lru-cached per (device, ub): with a communicator it is one
  torch.empty of _NUM_MAX_UB_STREAMS (3) x TE's workspace (gemm.py 31, 43-52), made at the first overlapped GEMM
  and kept. The plain workspace stays beside it: a row-parallel linear's weight-gradient GEMM runs without a
  communicator (module/linear.py 771-797: ub_obj_wgrad only under ub_bulk_wgrad, which Megatron-core sets on the
  column-parallel linears alone), so both are allocated. That is `workspace_bytes`, charged where the record
  says (RuntimeFacts.te_ub_workspaces) and the setup runs TE's userbuffers.
"""

from __future__ import annotations

from planner.cost import runtimes
from planner.schema import CommSetup


def runs_userbuffers(comm: CommSetup | None, training) -> bool:
    """Whether the setup runs TE's userbuffers: --tp-comm-overlap at TP > 1 under a record that has them."""
    if comm is None or comm.tp <= 1 or comm.tp_overlap != "tp-comm-overlap":
        return False
    return runtimes.of(training).tp_overlap == "tp-comm-overlap"


def workspace_bytes(te_workspace: int, comm: CommSetup | None, training) -> int:
    """The overlapped GEMMs' cuBLAS workspace, one allocation of the record's te_ub_workspaces x TE's workspace
    (`te_workspace`, afterstep.te_workspaces' size for the GPU), where the setup runs TE's userbuffers; else 0."""
    if not runs_userbuffers(comm, training):
        return 0
    return runtimes.of(training).te_ub_workspaces * te_workspace

