"""What Transformer Engine's userbuffers hold on a rank under Megatron-LM's --tp-comm-overlap (framework-facts §158).

TE's initialize_ub (transformer_engine/pytorch/module/base.py 102-478, TransformerEngine 4220403e, the TE
Megatron-LM 4828d651's uv.lock pinned when the golden values of row G10 were written; the same at 4329ff84,
pinned at d98e8a64) makes one communicator per GEMM it overlaps. Two kinds of memory come of it:

- the communication buffers themselves, one per GEMM: CommOverlapBase / CommOverlapP2PBase::initialize
  (common/comm_gemm_overlap/comm_gemm_overlap.cpp 311-326, 680-712) take them from
  register_user_buffer_collective (userbuffers/userbuffers-host.cpp 514-680: cuMemCreate with multicast, or
  cudaMalloc), never from torch's caching allocator: not in torch.cuda.memory_stats()'s allocated bytes, which
  is what Megatron-LM logs, but taken from the device beside it, so off what the allocator may reserve:
  `buffer_bytes`, charged with NCCL's buffers (assembly.workspace_bytes; framework-facts §158, §160);
- a cuBLAS workspace for the overlapped GEMMs: general_gemm (cpp_extensions/gemm.py 133) takes
  get_cublas_workspace(device, ub is not None, ...), lru-cached per (device, ub): with a communicator it is one
  torch.empty of _NUM_MAX_UB_STREAMS (3) x TE's workspace (gemm.py 31, 43-52), made at the first overlapped GEMM
  and kept. The plain workspace stays beside it: a row-parallel linear's weight-gradient GEMM runs without a
  communicator (module/linear.py 771-797: ub_obj_wgrad only under ub_bulk_wgrad, which Megatron-core sets on the
  column-parallel linears alone), so both are allocated. That is `workspace_bytes`, charged where the record
  says (RuntimeFacts.te_ub_workspaces) and the setup runs TE's userbuffers.
"""

from __future__ import annotations

from planner.cost import runtimes, ub_sms
from planner.errors import UserError
from planner.schema import CommSetup

# initialize_ub's communicators (TE v2.9 = 70f53666 and 4220403e, module/base.py 289-311 / 275-297): one per GEMM of
# its methods' lists, the row-parallel weight gradients' "external" ones too; the all-gathers' buffers FP8 (1 B)
# under an FP8 recipe (fp8_buf, 296-298 and 475-477), the others in initialize_ub's dtype, bf16 (Megatron passes
# none); a ring-exchange reduce-scatter keeps 2 tp - 1 chunks of shape / tp (comm_gemm_overlap.cpp 671-677), every
# other communicator one buffer of the shape (293-304)
ALL_GATHERS = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "proj_wgrad", "fc1_fprop", "fc1_dgrad", "fc2_dgrad",
               "fc2_wgrad")
REDUCE_SCATTERS = ("proj_fprop", "fc2_fprop", "qkv_wgrad", "fc1_wgrad")
EXTERNAL = ("proj_wgrad", "fc2_wgrad")  # not in ub_sms' tables: TE's method for them is "external" alone
# the communicator's own region 0, registered as a buffer (userbuffers-host.cpp 354-358: LOCALSIZE = 4 x
# (NVTE_REG0_OFFSET + NVTE_REG0_FLAGS) = 4 x (14,400 + 791,552) B, userbuffers.h 30-51) and its flags (375: two
# 64 KiB pages), one communicator for all GEMMs (comm_gemm_overlap.h 45-46: static _ub_comm)
REGION0_BYTES = 4 * (14_400 + 5 * 1024 + 8192 * 32 * 3)
FLAGS_BYTES = 2 * (1 << 16)


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



def buffer_bytes(comm: CommSetup | None, training, assumptions: dict) -> int:
    """The userbuffers' communication buffers on a rank, outside torch's allocator, where the setup runs TE's
    userbuffers (else 0): per GEMM's communicator (its method as the setup's config says, ub_sms.overlaps) a buffer
    of Megatron's shape (seq x micro-batch / CP, hidden) (megatron/training/initialize.py 218-227, d98e8a64;
    Megatron-Bridge 00b7660b training/initialize.py 307-310), FP8 on the all-gathers under --fp8-format, and the
    communicator's region 0 and flags. Each registration is rounded up to the driver's allocation granularity
    (userbuffers-host.cpp 535-550, not read here: every Bridge shape is a multiple of 2 MiB)."""
    if not runs_userbuffers(comm, training):
        return 0
    model = assumptions.get("model") or {}
    if not {"seq_len", "micro_batch_size"} <= set(assumptions) or "hidden_size" not in model:
        raise UserError("TE's userbuffers (--tp-comm-overlap) are sized by the profile's sequence, micro-batch and "
                        "hidden size, which this profile does not record: profile the model with --arch or read "
                        "it with --from-megatron")
    cp = int(assumptions.get("cp", 1) or 1)
    elements = int(assumptions["seq_len"]) * int(assumptions["micro_batch_size"]) // cp * int(model["hidden_size"])
    methods = {name: overlap.method for name, overlap in ub_sms.overlaps(comm.ub_cfg, comm.ub_gemms).items()}
    total = 0
    for name in (*methods, *EXTERNAL):
        size = elements * (1 if training.float8 and name in ALL_GATHERS else 2)
        if methods.get(name) == "ring_exchange" and name in REDUCE_SCATTERS:
            size = size // comm.tp * (2 * comm.tp - 1)
        total += size
    return total + REGION0_BYTES + FLAGS_BYTES
