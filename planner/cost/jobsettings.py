"""Settings a job states that move bytes the profile does not, each timed from its runtime record
(planner/cost/runtimes.py) at the profile's GPU's HBM bandwidth, memory-bound (issue 35: the
settings Megatron-LM's functional tests gpt3_7b_tp*_memory_speed run, Megatron-LM 6e091e1b):

- unfused weight-gradient accumulation (Megatron-LM's --no-gradient-accumulation-fusion): per
  microbatch, each weight's bf16 gradient added into its fp32 main_grad by a kernel of its own, the
  record's `unfused_wgrad_bytes` a weight beyond the accumulation the profile charges. Embedding
  tables are not linears: their gradients take that path with or without the setting.
- the logging reads (--log-params-norm, --log-num-zeros-in-grad): once a step, each over the rank's
  optimizer shard, the record's `logged_read_shard_bytes` a parameter.

Memory is unchanged: the unfused bf16 gradient lives from its GEMM to the DDP hook that runs right
after its AccumulateGrad, one linear's weight at a time, inside the backward transients the profile
charges at the moments that set a stage's peak (docs/published-runs.md §12.megtest)."""

from __future__ import annotations

from planner.cost import dataparallel, runtimes
from planner.cost.layers import LayerCost
from planner.schema import Profile, TrainSetup


def _hbm_tbps(profile: Profile) -> float | None:
    tbps = profile.assumptions.get("gpu_hbm_tbps")
    return tbps if isinstance(tbps, (int, float)) and not isinstance(tbps, bool) and tbps > 0 else None


def weight_param_count(layer: LayerCost) -> int:
    """The layer's parameters whose gradients a linear's wgrad GEMM makes: all but an embedding
    table's (a block's norms and biases, under 0.1% of it, counted with its linears)."""
    return 0 if "embedding" in layer.kind.lower() else layer.param_count


def unfused_accumulation_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms per microbatch the layer's unfused weight-gradient accumulation adds to its backward; 0
    where the setup keeps the fused path or the profile names no HBM bandwidth (a measured step)."""
    tbps = _hbm_tbps(profile)
    if not setup.training.unfused_grad_accumulation or tbps is None:
        return 0.0
    moved = weight_param_count(layer) * runtimes.of(setup.training).unfused_wgrad_bytes
    return moved / (tbps * 1e12) * 1e3


def logged_reads_ms(layer: LayerCost, profile: Profile, setup: TrainSetup) -> float:
    """ms once a step the setup's logging reads take over the layer's share of the rank's shard."""
    training = setup.training
    reads = int(training.log_params_norm) + int(training.log_num_zeros_in_grad)
    tbps = _hbm_tbps(profile)
    if not reads or tbps is None:
        return 0.0
    shard = layer.param_count / dataparallel.shard_size(setup)
    moved = reads * shard * runtimes.of(training).logged_read_shard_bytes
    return moved / (tbps * 1e12) * 1e3
