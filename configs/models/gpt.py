"""A GPT-style decoder: token + position embedding, N pre-norm transformer blocks,
final norm + LM head. First and last pipeline layers differ from the blocks.

Sized so that profiling on a 2-core CPU takes seconds. Follows the ckplan model-file
contract: build_model(), example_batch(micro_batch_size), and pipeline_layers() on
the model returning (fqn, module) pairs.
"""

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 2048
SEQ = 128
DIM = 256
HEADS = 4
BLOCKS = 8


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(positions)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.fc = nn.Linear(DIM, 4 * DIM)
        self.out = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, HEADS, dim // HEADS).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.lm = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        return self.lm(self.ln(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = Embedding()
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.head = Head()

    def pipeline_layers(self):
        return [("embed", self.embed)] + [(f"blocks.{i}", b) for i, b in enumerate(self.blocks)] + [("head", self.head)]

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model():
    return GPT()


def example_batch(micro_batch_size):
    generator = torch.Generator().manual_seed(micro_batch_size)
    tokens = torch.randint(0, VOCAB, (micro_batch_size, SEQ + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
