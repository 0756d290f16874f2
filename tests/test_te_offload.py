"""Transformer Engine v2.9's layer-window activation offload (planner/cost/te_offload.py), by hand on toys: the
window map as cpu_offload.py 343-350 writes it, the groups held beside each layer, the copies' exposed time, a
4-layer block's per-layer quantities, and the megatron record's use of it (docs/framework-facts.md §112)."""

from __future__ import annotations

import dataclasses

import pytest

from planner.cost import runtimes, te_offload
from planner.cost.assembly import net_extra_bytes


def _te_loop(num_layers: int, num_offload: int) -> list[int]:
    """cpu_offload.py 343-350 at v2.9, line for line."""
    window, constant = {}, 0
    for i in range(num_offload):
        window[i] = ((num_layers // num_offload) * (i + 1)) - 1
        if i < (num_layers % num_offload):
            window[i] += i + 1
            constant = i + 1
        else:
            window[i] += constant
    return [window[i] for i in range(num_offload)]


def test_the_window_map_by_hand():
    assert te_offload.window_map(4, 2) == [1, 3]
    assert te_offload.window_map(80, 40) == list(range(1, 80, 2))  # B3: each group dropped two layers on
    assert te_offload.window_map(5, 2) == [2, 4]  # 5 // 2 = 2; group 0 takes the remainder's layer
    assert te_offload.window_map(7, 3) == [2, 4, 6]
    assert te_offload.window_map(4, 1) == [3]


@pytest.mark.parametrize("layers", range(2, 13))
def test_the_window_map_is_te_s_loop_and_ends_at_the_last_layer(layers):
    for count in range(1, layers):
        window = te_offload.window_map(layers, count)
        assert window == _te_loop(layers, count)
        assert window[-1] == layers - 1 and all(i <= w for i, w in enumerate(window))


def test_no_window_without_a_layer_left_on_the_device():
    with pytest.raises(ValueError, match="0 < N < L"):
        te_offload.window_map(4, 4)


def test_the_groups_held_beside_each_layer_by_hand():
    # L 4, N 2, window [1, 3]: group 0 from layer 0 to 1, group 1 from layer 1 to 3
    assert [te_offload.held_groups(4, 2, k) for k in range(4)] == [[0], [0, 1], [1], [1]]
    assert te_offload.copy_windows(4, 2) == [range(1, 2), range(2, 4)]


def test_the_held_groups_are_a_brute_force_replay_of_the_handler():
    """Play the handler's forward: a group is made at its layer's forward and dropped when layer window[i]'s
    forward ends; the backward reloads group j before layer window[j]'s backward and frees it after layer j's."""
    for layers in range(2, 10):
        for count in range(1, layers):
            window = te_offload.window_map(layers, count)
            on = set()
            for k in range(layers):  # forward
                on |= {k} if k < count else set()
                assert sorted(on) == te_offload.held_groups(layers, count, k)
                on -= {i for i in range(count) if window[i] == k}
            for k in reversed(range(layers)):  # backward
                on |= {j for j in range(count) if window[j] == k}
                assert sorted(on) == te_offload.held_groups(layers, count, k)
                on -= {k}


def test_a_four_layer_block_with_two_offloaded_by_hand():
    """Each layer saves 100 B and has 10 B of scratch; layers 0 and 1 offloaded. Kept: 0, 0, 100, 100 (200);
    offloaded (host) 100, 100. Beside each layer: 0 holds group 0, 1 holds groups 0 and 1, 2 and 3 group 1.
    The peak is at layer 3's backward: layers 2 and 3, group 1 back, the scratch: 310 B (ckplan's per-layer
    option: the two inputs kept besides)."""
    none = {"kept": 100.0, "extra": 10.0, "offloaded": 0.0, "time": 9.0}
    per_layer = [{"kept": 30.0, "extra": 110.0, "offloaded": 70.0, "time": 99.0}] * 2 + [dict(none)] * 2
    out = te_offload.window_per_layer(per_layer, [none, none, None, None], ["block"] * 4, [3.0] * 4, [6.0] * 4,
                                      ms_per_byte=None)
    assert [v["kept"] for v in out] == [0.0, 0.0, 100.0, 100.0]
    assert [v["offloaded"] for v in out] == [100.0, 100.0, 0.0, 0.0]
    assert [v["extra"] for v in out] == [110.0, 210.0, 110.0, 110.0]
    assert [v["time"] for v in out] == [9.0] * 4  # untimed: none's time
    kept = sum(v["kept"] for v in out)
    assert kept + net_extra_bytes([(v["extra"], v["kept"]) for v in out]) == 310.0


def test_the_copies_exposed_past_their_window_by_hand():
    """100 B a group at 0.1 ms/B: 10 ms a copy. Group 0 runs beside layer 1 (forward 3, backward 6 ms): 7 + 4 ms
    exposed; group 1 beside layers 2-3 (6, 12 ms): 4 + 0 ms."""
    saved = [100, 100, 100, 100]
    assert te_offload.exposed_ms(saved, [3.0] * 4, [6.0] * 4, 2, ms_per_byte=0.1) == [(7.0, 4.0), (4.0, 0.0)]
    none = {"kept": 100.0, "extra": 0.0, "time": 9.0}
    out = te_offload.window_per_layer([dict(none)] * 4, [none, none, None, None], ["block"] * 4, [3.0] * 4,
                                      [6.0] * 4, ms_per_byte=0.1)
    assert [v["time"] for v in out] == [9.0 + 11.0, 9.0 + 4.0, 9.0, 9.0]


@pytest.mark.parametrize("offloaded", [[False, True, False, False], [True, False, True, False], [True] * 4])
def test_what_is_not_the_block_s_first_n_stays_ckplan_s_option(offloaded):
    assert te_offload.window_layers(["block"] * 4, offloaded) is None


def test_the_block_is_the_offloaded_layers_kind():
    kinds = ["embed", "block", "block", "block", "head"]
    assert te_offload.window_layers(kinds, [False, True, False, False, False]) == ([1, 2, 3], 1)


def test_the_megatron_record_runs_te_s_handler_and_the_others_do_not():
    assert runtimes.facts("megatron", runtimes.VERSIONS["megatron"][-1]).te_window_offload
    assert "cpu_offload.py" in runtimes.facts("megatron", runtimes.VERSIONS["megatron"][-1]).sources[
        "te_window_offload"]
    for name in runtimes.VERSIONS:
        if name != "megatron":
            assert not runtimes.facts(name, runtimes.VERSIONS[name][-1]).te_window_offload


def test_a_tiny_megatron_job_against_ckplan_s_per_layer_option(tmp_path, monkeypatch):
    """The tiny 4-layer job with 2 offloaded: Transformer Engine's window moves each layer's input too, so the
    host holds none's kept bytes of the two and the device keeps the two layers left; with the record's fact
    off (ckplan's per-layer option) the two inputs stay on the device beside them."""
    from test_megatron_offload import _write

    from planner.commands.evaluate_config import predict
    from planner.models.configs import megatron

    job = _write(tmp_path, "--cpu-offloading-num-layers: 2")
    window = predict(megatron.read(job), gpus=1, gpu_name="gb200")
    record = runtimes.of
    monkeypatch.setattr(te_offload.runtimes, "of",
                        lambda training: dataclasses.replace(record(training), te_window_offload=False))
    generic = predict(megatron.read(job), gpus=1, gpu_name="gb200")
    options = {layer.name: {o.name: o for o in layer.recompute_options} for layer in window.profile.layers}
    decoder = [n for n in window.stages[0].layers if window.stages[0].option(n) == "offload"]
    inputs = sum(options[n]["offload"].kept_bytes for n in decoder)
    assert len(decoder) == 2 and inputs > 0
    assert window.cost.stages[0].host_bytes == generic.cost.stages[0].host_bytes + inputs
    assert window.cost.stages[0].kept_bytes == generic.cost.stages[0].kept_bytes - inputs
