"""A published row's once-an-iteration term (`published_rows.py split`'s step_and_exposed_dp), layer by layer:
the optimizer step on the device, and each data-parallel collective (dense and routed-expert parameters
apart) with its group, bytes, link rate, time and what the cost model leaves exposed.

usage: PYTHONPATH=$PWD python scripts/dp_step_terms.py E3 [E5 ...]   (profiles made by published_rows.py profiles)
"""
from __future__ import annotations

import sys

from planner.cost import costmodel, rules
from planner.cost import dataparallel as dpm

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
import published_rows  # noqa: E402


def one(row_id: str) -> None:
    table = published_rows.load_table()
    row = table.select(row_id)[0]
    stages, profile, setup, cost = published_rows.capture(published_rows.evaluate_args(row, published_rows.WORK))
    dp = setup.data_parallel
    experts = dpm.expert_setup(setup)
    print(f"{row.id}: dp {dp.dp}, ep {dp.ep}, zero {dp.zero}, microbatches {setup.pipeline.microbatches}, "
          f"shard link {dp.shard_gb_per_s} GB/s, replica link {dp.replica_gb_per_s} GB/s, "
          f"overlap grad reduce {dpm.overlaps_comm(setup)}, gathers in forward {dpm.gathers_in_forward(setup)}; "
          f"grad bytes {dpm.param_bytes(setup).grads}, gathered bytes {dpm.param_bytes(setup).weights}; "
          f"experts' group dp {experts.data_parallel.dp}")
    layers = {layer.name: layer for layer in costmodel.layer_costs(profile)}
    totals = {"step": 0.0, "gather": 0.0, "reduce": 0.0, "exposed": 0.0, "whole": 0.0}
    for stage, stage_cost in zip(stages, cost.stages):
        for name in stage.layers:
            layer = layers[name]
            step = dict(layer.step_ms).get(setup.training.optimizer, 0.0)
            dense, held = layer.param_count - layer.expert_param_count, dpm.held_expert_params(
                layer.expert_param_count, setup)
            per = step / layer.param_count if layer.param_count else 0.0
            device = dpm.device_step_ms(per * dense, setup) + (dpm.device_step_ms(per * held, experts)
                                                                if layer.expert_param_count else 0.0)
            gather, reduce = dpm.collectives_ms(layer.param_count, setup, expert_count=layer.expert_param_count,
                                                fp8_count=layer.float8_param_count)
            fwd, bwd = rules.compute_ms(layer.fwd_ms, setup.time), rules.compute_ms(layer.bwd_ms, setup.time)
            exposed = dpm.exposed_comm_ms(layer.param_count, setup, fwd_ms=fwd, bwd_ms=bwd,
                                          expert_count=layer.expert_param_count, fp8_count=layer.float8_param_count)
            whole = rules.layer_step_ms(layer, setup)
            for key, value in zip(totals, (device, gather, reduce, exposed, whole)):
                totals[key] += value
            if layer.expert_param_count and name == next(n for n in stage.layers
                                                         if layers[n].expert_param_count):
                print(f"  {name} ({layer.kind}): params {layer.param_count:,} (experts {layer.expert_param_count:,}, "
                      f"held {held:,.0f}); fwd {fwd:.2f} ms, bwd {bwd:.2f} ms; step {device:.3f} ms; "
                      f"gather {gather:.2f} ms (dense {dpm.weight_gather_ms(dense, setup):.2f}, experts "
                      f"{dpm.weight_gather_ms(held, experts):.2f}), reduce {reduce:.2f} ms (dense "
                      f"{dpm.grad_reduce_ms(dense, setup):.2f}, experts {dpm.grad_reduce_ms(held, experts):.2f}); "
                      f"exposed {exposed:.2f} ms; the layer's step term {whole:.2f} ms")
        print(f"  stage step_ms {stage_cost.step_ms:.1f}")
    print("  totals (ms, every layer of the stages): " + ", ".join(f"{k} {v:.1f}" for k, v in totals.items()))


if __name__ == "__main__":
    for arg in sys.argv[1:] or ["E3"]:
        one(arg)
