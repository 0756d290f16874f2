"""ckplan: activation checkpointing and pipeline partitioning under memory caps."""

__version__ = "0.1.0"
