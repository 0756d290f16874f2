"""The optimizers a plan can name, built one way for everyone: the runtime steps them,
the profiler times them, and the cost model's bytes per parameter assume them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import get_args

import torch

from planner.errors import UserError
from planner.schema import Optimizer

OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
ADAM_LR = 1e-3
SGD_LR = 1e-2
SGD_MOMENTUM = 0.9


def optimizer_class(name: str) -> tuple[type[torch.optim.Optimizer], dict]:
    """adam: Adam(lr=1e-3); sgd: SGD(lr=1e-2, momentum=0.9), as a class and its arguments
    (ZeroRedundancyOptimizer takes them so)."""
    if name == "adam":
        return torch.optim.Adam, {"lr": ADAM_LR}
    if name == "sgd":
        return torch.optim.SGD, {"lr": SGD_LR, "momentum": SGD_MOMENTUM}
    raise UserError(f"unknown optimizer {name!r}; the plan's setup.training.optimizer must be one of {', '.join(OPTIMIZERS)}")


def make_optimizer(name: str, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
    cls, kwargs = optimizer_class(name)
    return cls(params, **kwargs)
