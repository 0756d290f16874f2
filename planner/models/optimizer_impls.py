"""The kernels a job's Adam step runs, where they are not the one fused step the analytic profile times.

The analytic profile times Adam as one fused, memory-bound kernel over the parameters (planner/profiler/analytic.py
STEP_BYTES_PER_PARAM: 28 B a parameter at the HBM's bandwidth). Some jobs step another way:

- `decoupled-adamw`: Composer's DecoupledAdamW (mosaicml/composer v0.16.3 c82da77f and v0.16.4 1c9d8d17, the same
  code: composer/optim/decoupled_weight_decay.py 236-263), which llm-foundry v0.3.0 builds for `name:
  decoupled_adamw` (llmfoundry/utils/builders.py 141-142), the optimizer of every MPT pretraining yaml
  (scripts/train/yamls/pretrain/mpt-*.yaml 60-66: weight_decay 0.0). It loops over the parameters in Python, each
  its own eager kernels over fp32 tensors (the parameter, its fp32 gradient, exp_avg, exp_avg_sq):
  `exp_avg.mul_(beta1)` (read 4, write 4) `.add_(grad, alpha)` (read 8, write 4); `exp_avg_sq.mul_(beta2)` (8)
  `.addcmul_(grad, grad, value)` (exp_avg_sq and the gradient read, the same tensor twice, once from memory; write 4:
  12); `denom = (exp_avg_sq.sqrt()` (8, a new tensor) `/ math.sqrt(bias_correction2))` (8, another) `.add_(eps)` (8);
  `param.addcdiv_(exp_avg, denom, value)` (read 12, write 4). 80 B a parameter, at the GPU's eager elementwise rate.
  Not charged: `param.mul_` of the decoupled weight decay (8 B more; the yamls' weight_decay is 0.0, so it does not
  run), and the host: each parameter tensor's `state_steps[i].item()` (240) waits for the device before its kernels
  are issued, and `state['step'] += 1` (321) is a kernel a tensor; no published per-launch figure for the runs' hosts.
"""

from __future__ import annotations

from planner.models.gpus import GPU
from planner.models.membound_rate import achieved_tbps

FUSED, DECOUPLED_ADAMW = "fused", "decoupled-adamw"
IMPLS = (FUSED, DECOUPLED_ADAMW)
IMPL_HELP = {
    FUSED: "one fused kernel over the parameters, the profile's own Adam step",
    DECOUPLED_ADAMW: "Composer 0.16's DecoupledAdamW (llm-foundry's decoupled_adamw): eight eager kernels a "
                     "parameter tensor, 80 B a parameter at the GPU's elementwise rate",
}
DECOUPLED_ADAMW_BYTES = 8 + 12 + 8 + 12 + 8 + 8 + 8 + 16  # per parameter: the kernels in the module's docstring
DECOUPLED_ADAMW_SOURCE = ("Composer v0.16.3/v0.16.4 composer/optim/decoupled_weight_decay.py 236-263 (DecoupledAdamW."
                          "adamw: a Python loop, eight eager kernels a tensor, 80 B a parameter at weight_decay 0); "
                          "each tensor's .item() device sync not charged")


def adam_step_ms(impl: str, param_count: int, gpu: GPU) -> float | None:
    """One Adam step over `param_count` parameters as `impl` runs it on `gpu`, in ms; None for FUSED (the
    profile's own step stands)."""
    if impl == FUSED:
        return None
    return param_count * DECOUPLED_ADAMW_BYTES / (achieved_tbps(gpu, "eager", "elementwise") * 1e12) * 1e3
