"""A plain MLP chain as an nn.Sequential: its children are the pipeline layers
("0", "1", ...). Regression on random data, so the default loss (MSE) applies."""

import torch
from torch import nn

WIDTH = 512
HIDDEN = 2048
DEPTH = 6


def build_model():
    layers = []
    for _ in range(DEPTH):
        layers += [nn.Linear(WIDTH, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, WIDTH)]
    return nn.Sequential(*layers)


def example_batch(micro_batch_size):
    generator = torch.Generator().manual_seed(micro_batch_size)
    inputs = torch.randn(micro_batch_size * 64, WIDTH, generator=generator)
    return inputs, torch.randn(micro_batch_size * 64, WIDTH, generator=generator)
