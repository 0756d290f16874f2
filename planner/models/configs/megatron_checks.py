"""Megatron-LM's --test-mode (arguments.py, transformer_config.py test_mode at d98e8a64): the realtime checks in each
attention forward, charged by planner/cost/realtime_tests.py."""

from __future__ import annotations

from planner.models.configs.megatron_args import Flags


def read_test_mode(flags: Flags, modelled) -> None:
    """Set `modelled`.test_mode from --test-mode, saying what is charged."""
    modelled.test_mode = bool(flags.take(
        "--test-mode", "Megatron-core's realtime tests: each attention forward with q/k norms all-gathers them over "
        "DP and TP and asserts each rank's equal on the host (attention.py 1753-1822, 1938-1939 at d98e8a64): the "
        "checks' host issue and the all-gathers' NCCL latency charged per forward (planner/cost/realtime_tests.py); "
        "the asserts' driver copy and synchronize not", bool, False))
