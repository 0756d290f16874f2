"""A plain MLP chain as an nn.Sequential of blocks (Linear -> GELU -> Linear): its
children are the pipeline layers ("0", "1", ...). Regression on random data, so the
default loss (MSE) applies.

Blocks rather than single ops: a lone Linear or GELU keeps only its input for
backward, so checkpointing it would free nothing; a block keeps its hidden
activations too, which checkpointing trades for a second forward.
"""

import torch
from torch import nn

WIDTH = 512
HIDDEN = 2048
DEPTH = 8


def build_model():
    return nn.Sequential(*(nn.Sequential(nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH))
                           for _ in range(DEPTH)))


def example_batch(micro_batch_size):
    generator = torch.Generator().manual_seed(micro_batch_size)
    inputs = torch.randn(micro_batch_size * 64, WIDTH, generator=generator)
    return inputs, torch.randn(micro_batch_size * 64, WIDTH, generator=generator)
