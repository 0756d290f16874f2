"""Megatron-LM's layer-level activation offload (--cpu-offloading, --cpu-offloading-num-layers), for the
reader in megatron.py, read at megatron-core 92c8482e (Megatron-Bridge 00b7660b's 3rdparty/Megatron-LM) and
the Transformer Engine v2.9 it calls (docs/framework-facts.md §107):

- --cpu-offloading-num-layers N > 0 turns --cpu-offloading on (megatron/training/arguments.py 1250-1251);
  TransformerBlock wraps every layer's forward in TE's get_cpu_offload_context(enabled, N, num_layers,
  activations True, weights False, double buffering False) (transformer_block.py 307-318, model_parallel_config.py
  326-345);
- TE's AsyncDoubleBufferGroupOffloadHandler offloads the saved tensors TE's modules and megatron's fused SwiGLU
  mark, of the first N layers (groups 0..N-1, `current_group < num_offload_group`), to pinned host memory on a
  d2h stream of its own, and brings them back on an h2d stream before each layer's backward: overlapped with
  compute (TE cpu_offload.py 303-657 at v2.9);
- megatron-core refuses it with pipeline parallelism, with recompute, with N outside [0, num_layers) and with
  CUDA graphs (transformer_config.py 1053-1068, 1631-1632; the same at d98e8a64, 1884-1899, 2800-2801: §321).

The job carries it as the `offload` option on the first N decoder layers (Recompute mode "block", option
"offload"); under the megatron record (te_window_offload) the cost model charges those layers as TE's window
runs them (planner/cost/te_offload.py: each layer's whole saved set moved, its input too; group i held from
layer i to layer window[i]; each copy beside its window's compute). ckplan's per-layer option
(planner/profiler/analytic_kept.offload_option) charges them under the other runtimes.
"""

from __future__ import annotations

from planner.errors import UserError
from planner.models.configs import Recompute
from planner.models.configs.megatron_args import Flags
from planner.schema import OPTION_OFFLOAD

CUDA_GRAPH_FLAGS = ("--cuda-graph-impl", "--enable-cuda-graph", "--external-cuda-graph")


def read_cpu_offloading(flags: Flags, job) -> None:
    """Take --cpu-offloading and --cpu-offloading-num-layers into the job's per-layer offload, or refuse
    as megatron-core does (after _parallel and _recompute have read the job's pipeline and recompute)."""
    if "--cpu-offloading" not in flags.given and "--cpu-offloading-num-layers" not in flags.given:
        return
    on = flags.has("--cpu-offloading")
    count = flags.take("--cpu-offloading-num-layers", "decoder layers whose activations go to the host", int, 0)
    layers = job.arch.num_layers
    if count > 0:
        on = True  # arguments.py 1250-1251: a count turns it on
    if not on:
        flags.take("--cpu-offloading", "layer-level activation offload", bool)
        return
    if count < 0 or count >= layers:
        raise UserError(f"--cpu-offloading-num-layers {count}: megatron-core offloads fewer layers than the model's "
                        f"{layers} (TransformerConfig refuses it); give 1 to {layers - 1}")
    if count == 0:
        raise UserError("--cpu-offloading without --cpu-offloading-num-layers: Transformer Engine's offload handler "
                        "has no layer to offload (its window map is empty); give --cpu-offloading-num-layers N")
    if job.pp > 1:
        raise UserError(f"--cpu-offloading with --pipeline-model-parallel-size {job.pp}: megatron-core refuses "
                        "CPU offloading with pipeline parallelism; drop one")
    if job.recompute.mode != "none":
        raise UserError("--cpu-offloading with recompute: megatron-core refuses CPU offloading when activation "
                        "recomputation is enabled; drop one")
    graphs = [f for f in CUDA_GRAPH_FLAGS if flags.has(f) and flags.given[f] != ["none"]]
    if graphs:
        raise UserError(f"--cpu-offloading with {graphs[0]}: megatron-core refuses CUDA graphs with CPU "
                        "offloading; drop one")
    flags.take("--cpu-offloading", "Transformer Engine's activation offload: the first "
               f"{count} decoder layers' saved activations on pinned host memory, copied on streams of their own "
               "beside the compute (Transformer Engine's window handler, planner/cost/te_offload.py)", bool)
    job.recompute = Recompute(mode="block", num_layers=count, option=OPTION_OFFLOAD)
    flags.notes.append(f"--cpu-offloading-num-layers {count}: decoder layers 1-{count} offloaded as Transformer "
                       "Engine's window handler runs them under --runtime megatron (each layer's whole saved set, "
                       f"its input too; each copy spread over {layers // count} layers' compute); under another "
                       "runtime ckplan's per-layer offload option, which keeps each layer's input on the device")
