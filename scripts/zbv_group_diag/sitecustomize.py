"""Diagnostic (ZBVDIAG=FOLDER, this folder on PYTHONPATH; docs/published-runs.md §66.zbvgroup): torch's stage_backward_weight logged group by group against the run's MemTracker:
live bytes before each group, the tracker's peak after it, each group's dweights bytes and whether they were added."""
import os

if os.environ.get("ZBVDIAG"):
    import torch
    import torch.distributed as dist
    import torch.distributed.pipelining._backward as bw
    import torch.distributed.pipelining.stage as st
    from torch.autograd.graph import GradientEdge

    import planner.runtime.memtrack as mt

    TRACKERS = []
    enter = mt.PeakMemory.__enter__

    def patched_enter(self):
        out = enter(self)
        TRACKERS.append(self._tracker)
        return out

    mt.PeakMemory.__enter__ = patched_enter

    def total(kind):
        t = TRACKERS[-1] if TRACKERS else None
        if t is None:
            return -1
        return int(sum(s["Total"] for d, s in t.get_tracker_snapshot(kind).items() if d.type == "cpu"))

    def log(msg):
        with open(os.path.join(os.environ["ZBVDIAG"], f"rank{dist.get_rank()}.log"), "a") as f:
            f.write(msg + "\n")

    def stage_backward_weight(weights, param_groups, retain_graph=False):
        grad_acc_to_weight = {}
        weight_grads = []
        for index, weight in enumerate(weights):
            grad_acc = bw._get_grad_fn_or_grad_acc(weight)
            grad_acc_to_weight[grad_acc] = weight, index
            weight_grads.append(weight.grad)
        log(f"W start live {total('current')} peak {total('peak')} groups {len(param_groups)}")
        for g, param_group in enumerate(param_groups):
            valid_edges, valid_grad_outputs = [], []
            for grads_tuple, intermediate in zip(param_group["grads"], param_group["intermediates"]):
                for i, grad in enumerate(grads_tuple):
                    if grad is not None:
                        valid_edges.append(GradientEdge(intermediate, i))
                        valid_grad_outputs.append(grad)
            assert len(param_group["intermediates"]) == 1
            del param_group["intermediates"]
            names = sorted(grad_acc_to_weight[p][1] for p in param_group["params"])
            before = total("current")
            dweights = torch.autograd.grad(valid_edges, tuple(GradientEdge(w, 0) for w in param_group["params"]),
                                           grad_outputs=valid_grad_outputs, retain_graph=retain_graph)
            after = total("current")
            saved = sum(t.untyped_storage().nbytes() for t in valid_grad_outputs)
            del param_group["grads"], valid_grad_outputs
            freed = total("current")
            added = False
            for grad_acc, dw in zip(param_group["params"], dweights):
                weight, index = grad_acc_to_weight[grad_acc]
                if weight.grad is None:
                    weight.grad = dw
                else:
                    weight.grad += dw
                    added = True
            log(f"  group {g} params {names} before {before} after {after} (+{after - before}) "
                f"saved-grads {saved} after-del {freed} peak {total('peak')} dweights "
                f"{sum(d.untyped_storage().nbytes() for d in dweights)} added {added}")
        log(f"W end live {total('current')}")
        return tuple(weight_grads)

    bw.stage_backward_weight = stage_backward_weight
    st.stage_backward_weight = stage_backward_weight
