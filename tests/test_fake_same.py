"""A fake profile runs each distinct layer once (planner/profiler/fake_same.py): the layers it copies
carry exactly the figures running them gives, and a layer that differs in anything its run could see
is run on its own."""

import json
from functools import partial

import pytest
import torch
from fixtures.cli import run_ok
from torch import nn

from planner.profiler import fake, fake_same

# what two profiles of one model may differ in: when each was made, and the host step's rate,
# timed on this host at each run (not by the fake run)
IGNORED = {"created_at", "host_step_ns_per_param"}


def _profiles(tmp_path, monkeypatch, *args) -> tuple[dict, dict, list[str], list[str]]:
    """`ckplan profile *args --fake` with each distinct layer run once and with every layer run:
    both profiles (as written) and the layers each ran (fake._layer_work's calls)."""
    ran: list[str] = []
    work = fake._layer_work
    monkeypatch.setattr(fake, "_layer_work", lambda layer, x, grad: ran.append(type(layer).__name__)
                        or work(layer, x, grad))
    run_ok("profile", *args, "--fake", "--out", tmp_path / "once.json")
    once_ran, ran[:] = list(ran), []
    monkeypatch.setattr(fake, "fake_measure", partial(fake.fake_measure, once=False))
    run_ok("profile", *args, "--fake", "--out", tmp_path / "each.json")
    once, each = (json.loads((tmp_path / name).read_text()) for name in ("once.json", "each.json"))
    return once, each, once_ran, list(ran)


def _assert_same(once: dict, each: dict) -> None:
    assert [layer["name"] for layer in once["layers"]] == [layer["name"] for layer in each["layers"]]
    for mine, theirs in zip(once["layers"], each["layers"], strict=True):
        assert mine == theirs, mine["name"]  # every LayerProfile field, exactly
    assert {key: value for key, value in once.items() if key not in IGNORED} == \
        {key: value for key, value in each.items() if key not in IGNORED}


def _config(tmp_path, config: dict):
    folder = tmp_path / config["model_type"]
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_mixtral_profile_copies_its_routed_experts_records(tmp_path, monkeypatch):
    """tests/test_fake_moe.py's Mixtral (4 experts, top 2), two MoE blocks in bfloat16: the routing
    is charged balanced from the router's output shape, never from its weights, so a copy's is exact."""
    pytest.importorskip("transformers")
    folder = _config(tmp_path, {"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2,
                                "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
                                "max_position_embeddings": 128})
    once, each, once_ran, each_ran = _profiles(tmp_path, monkeypatch, "--hf-config", folder, "--seq-len", "16",
                                               "--micro-batch-size", "2", "--dtype", "bfloat16")
    assert once_ran.count("Decoder") == 1 and each_ran.count("Decoder") == 2
    _assert_same(once, each)
    assert once["layers"][2]["routed_tokens"] == [16] * 4  # 2 x 16 tokens x top 2 over 4 experts


def test_alternating_sliding_and_full_layers_run_once_per_kind_in_their_order(tmp_path, monkeypatch):
    """Qwen3 with layer_types alternating sliding and full attention: each kind is run once (its
    modules differ in sliding_window, a plain attribute), the third layer copies the first."""
    pytest.importorskip("transformers")
    folder = _config(tmp_path, {"model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "head_dim": 16,
                                "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
                                "vocab_size": 256, "max_position_embeddings": 128, "use_sliding_window": True,
                                "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention",
                                                                     "sliding_attention"]})
    once, each, once_ran, each_ran = _profiles(tmp_path, monkeypatch, "--hf-config", folder, "--seq-len", "32",
                                               "--micro-batch-size", "1", "--device", "cpu", "--dtype", "float32")
    assert once_ran.count("Decoder") == 2 and each_ran.count("Decoder") == 3
    _assert_same(once, each)


BLOCKS = '''
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, doubled):
        super().__init__()
        self.linear = nn.Linear(16, 16)
        self.doubled = doubled  # a plain attribute: the block runs its linear twice where it is set

    def forward(self, x):
        x = torch.relu(self.linear(x))
        return torch.relu(self.linear(x)) if self.doubled else x


def build_model():
    return nn.Sequential(nn.Linear(16, 16), Block(False), Block(True), Block(False), nn.Linear(16, 4))


def example_batch(micro_batch_size):
    return torch.randn(micro_batch_size, 16), torch.randn(micro_batch_size, 4)
'''


def test_a_block_differing_only_in_a_plain_attribute_is_run_on_its_own(tmp_path, monkeypatch):
    """Three blocks of one class and parameters (one kind to the solver) after a first layer (the
    batch has no gradient: the first layer is its own), the middle one running its linear twice by
    a flag: it is run, the third copies the first, and every figure is what running each gives; the
    middle one's work is its own."""
    model = tmp_path / "blocks.py"
    model.write_text(BLOCKS)
    once, each, once_ran, each_ran = _profiles(tmp_path, monkeypatch, model, "--device", "cpu")
    assert once_ran == ["Linear", "Block", "Block", "Linear"]
    assert each_ran == ["Linear", "Block", "Block", "Block", "Linear"]
    _assert_same(once, each)
    flops = once["assumptions"]["flops"]
    assert flops["2"]["forward"] == 2 * flops["1"]["forward"] == 2 * flops["3"]["forward"]


# ---------------------------------------------------------------- the signature itself


class _Attention(nn.Module):
    def __init__(self, layer_idx: int, window: int | None):
        super().__init__()
        self.proj = nn.Linear(8, 8, device="meta")
        self.layer_idx, self.sliding_window = layer_idx, window

    def forward(self, x):
        return self.proj(x)


X = torch.empty(2, 8, device="meta", requires_grad=True)


def _key(layer: nn.Module, shared: set[int] = frozenset()):
    return fake_same.signature(layer, X, X.detach(), set(shared))


def test_the_signature_ignores_the_layer_number_but_not_a_window():
    assert _key(_Attention(0, None)) == _key(_Attention(7, None))
    assert _key(_Attention(0, 128)) != _key(_Attention(1, None))
    assert _key(_Attention(0, 128)) != _key(_Attention(0, 64))


def test_the_signature_reads_a_layers_own_entry_of_its_configs_per_layer_lists():
    class Config:
        num_hidden_layers = 2

        def __init__(self):
            self.layer_types = ["sliding_attention", "full_attention"]

    first, second = _Attention(0, None), _Attention(1, None)
    first.config = second.config = Config()
    assert _key(first) != _key(second)
    second.config.layer_types[1] = "sliding_attention"
    assert _key(first) == _key(second)


def test_hooks_tied_weights_and_a_differing_input_make_a_layer_its_own():
    plain = _Attention(0, None)
    assert _key(plain) is not None
    hooked = _Attention(0, None)
    hooked.proj.register_forward_pre_hook(lambda module, args: None)
    assert _key(hooked) is None
    tied = _Attention(0, None)
    assert _key(tied, fake_same.shared_parameters([tied, nn.ModuleList([tied.proj])])) is None
    assert fake_same.signature(plain, X.detach(), X.detach(), set()) != _key(plain)  # no input gradient
    wider = torch.empty(4, 8, device="meta", requires_grad=True)
    assert fake_same.signature(plain, wider, wider.detach(), set()) != _key(plain)


def test_a_layer_holding_its_own_copy_of_an_object_equals_one_holding_an_equal_copy():
    class Settings:
        def __init__(self, theta):
            self.theta = theta

    first, second, third = (_Attention(0, None) for _ in range(3))
    first.settings, second.settings, third.settings = Settings(1e4), Settings(1e4), Settings(5e5)
    assert _key(first) == _key(second) != _key(third)
    second.act = torch.relu
    first.act = torch.sigmoid
    assert _key(first) != _key(second)  # functions by identity


def test_a_copy_carries_its_own_name_in_its_float8_calls():
    from planner.profiler.float8 import Linear

    calls = [Linear("layers.0.attention.wq", 8, 4, 4, 4, 4, "layers.0.attention_norm"),
             Linear("layers.0.mlp", 8, 4, 4, 4, 4)]
    assert fake_same.renamed(calls, "layers.0", "layers.10") == [
        Linear("layers.10.attention.wq", 8, 4, 4, 4, 4, "layers.10.attention_norm"),
        Linear("layers.10.mlp", 8, 4, 4, 4, 4)]


def test_a_hook_that_only_notes_the_running_layer_leaves_it_comparable():
    """device_attention notes each layer's attention kernels by a forward pre-hook on every layer; that
    hook computes nothing, so layers equal in all else still compare equal (any other hook does not)."""
    from planner.models import archs
    from planner.profiler import device_attention

    first, second = _Attention(0, None), _Attention(1, None)
    with device_attention.device_attention("cuda", archs.gpu("h100"), [("a", first), ("b", second)]):
        assert first._forward_pre_hooks and _key(first) == _key(second) is not None
        second.register_forward_pre_hook(lambda module, args: None)
        assert _key(second) is None
