"""A small mixture-of-experts decoder: token + position embedding, N pre-norm blocks of
causal attention and a MoE feed-forward (a router picking the top 2 of 8 SwiGLU experts
per token, dropless, plus one shared SwiGLU expert), final norm + LM head.

Sized so that profiling and a 2-stage run on a 2-core CPU take seconds. Follows the
ckplan model-file contract (build_model, example_batch, pipeline_layers), and its
experts follow the experts contract that expert parallelism (`solve --ep`) runs on, the
one of transformers 5's MoE models (MixtralExperts, Qwen2MoeExperts):

    experts.num_experts                   an int, E
    every parameter of `experts`          stacked over the experts: shape (E, ...)
    experts(hidden, top_k_index, top_k_weights) -> out
        hidden (T, H), top_k_index (T, k) int, top_k_weights (T, k):
        out[t] = sum over j of top_k_weights[t, j] * expert_{top_k_index[t, j]}(hidden[t]),
        summed over j in order (j = 0 first)

Every token reaches its k experts (no capacity, nothing dropped), so a pipeline with the
experts split over ranks computes what one process does.
"""

import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 1024
SEQ = 64
DIM = 128
HEADS = 4
BLOCKS = 4
EXPERTS = 8
TOP_K = 2
EXPERT_WIDTH = 128  # each routed expert's SwiGLU width
SHARED_WIDTH = 128  # the shared expert's


class Embedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, DIM)
        self.pos = nn.Embedding(SEQ, DIM)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(positions)


class SwiGLU(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.gate_proj = nn.Linear(DIM, width, bias=False)
        self.up_proj = nn.Linear(DIM, width, bias=False)
        self.down_proj = nn.Linear(width, DIM, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Experts(nn.Module):
    """EXPERTS SwiGLU experts, their weights stacked: (E, 2 x width, DIM) and (E, DIM, width)."""

    def __init__(self):
        super().__init__()
        self.num_experts = EXPERTS
        self.gate_up_proj = nn.Parameter(torch.randn(EXPERTS, 2 * EXPERT_WIDTH, DIM) * DIM ** -0.5)
        self.down_proj = nn.Parameter(torch.randn(EXPERTS, DIM, EXPERT_WIDTH) * EXPERT_WIDTH ** -0.5)

    def forward(self, hidden, top_k_index, top_k_weights):
        num_tokens, top_k = top_k_index.shape
        expert_ids, order = top_k_index.reshape(-1).sort(stable=True)  # the token copies grouped by expert
        counts = torch.bincount(expert_ids, minlength=self.num_experts).tolist()
        outputs = []
        for expert, rows in enumerate(hidden[order // top_k].split(counts)):
            gate, up = F.linear(rows, self.gate_up_proj[expert]).chunk(2, dim=-1)
            outputs.append(F.linear(F.silu(gate) * up, self.down_proj[expert]))
        copies = torch.cat(outputs)[torch.argsort(order)]  # back in (token, j) order
        return (copies * top_k_weights.reshape(-1, 1)).view(num_tokens, top_k, -1).sum(dim=1)


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        self.top_k = TOP_K
        self.gate = nn.Linear(DIM, EXPERTS, bias=False)  # the router
        self.experts = Experts()
        self.shared_expert = SwiGLU(SHARED_WIDTH)

    def forward(self, x):
        batch, seq, dim = x.shape
        flat = x.reshape(-1, dim)
        probs = F.softmax(self.gate(flat), dim=-1, dtype=torch.float32)
        weights, index = probs.topk(self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        return (self.experts(flat, index, weights) + self.shared_expert(flat)).view(batch, seq, dim)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(DIM)
        self.qkv = nn.Linear(DIM, 3 * DIM)
        self.proj = nn.Linear(DIM, DIM)
        self.ln2 = nn.LayerNorm(DIM)
        self.moe = MoE()

    def forward(self, x):
        batch, seq, dim = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, HEADS, dim // HEADS).transpose(1, 2) for t in (q, k, v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(batch, seq, dim))
        return x + self.moe(self.ln2(x))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(DIM)
        self.lm = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x):
        return self.lm(self.ln(x))


class MoEGPT(nn.Module):
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
    return MoEGPT()


def example_batch(micro_batch_size):
    generator = torch.Generator().manual_seed(micro_batch_size)
    tokens = torch.randint(0, VOCAB, (micro_batch_size, SEQ + 1), generator=generator)
    return tokens[:, :-1], tokens[:, 1:]


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
