"""A stage whose static counts gradient shards it does not hold at its peak (beside a pipeline under FSDP2's moments,
gathered.stage_floor) has a negative transient: its printed parts say that term as bytes freed before the peak, and
still add up to the moment's bytes, in the plan's predicted figures and in the refusal's words."""

from planner.cost.assembly import StageCost
from planner.schema import TrainSetup
from planner.solve.planning import infeasible_message
from planner.solve.search import Shortfall, need_terms

GIB = 1 << 30


def _stage(transient: int) -> StageCost:
    # 10 GiB static, 1 GiB buffers, 2 x 3 GiB activations: the moment is 17 GiB + transient
    return StageCost(static_bytes=10 * GIB, kept_bytes=3 * GIB, in_flight=2, activation_bytes=6 * GIB,
                     buffer_bytes=GIB, transient_bytes=transient, peak_bytes=17 * GIB + transient, time_ms=1.0,
                     cap_bytes=80 * GIB)


def test_the_plans_predicted_parts_add_up_to_its_peak_with_the_freed_shards_said():
    predicted = _stage(-2 * GIB).predicted()
    assert (predicted.transient_bytes, predicted.freed_bytes) == (0, 2 * GIB)
    assert predicted.static_bytes + predicted.buffer_bytes + predicted.activation_bytes + predicted.transient_bytes \
        - predicted.freed_bytes == predicted.peak_bytes == 15 * GIB
    assert _stage(GIB).predicted().freed_bytes == 0


def test_the_refusal_names_the_freed_shards_and_its_parts_add_up():
    terms = need_terms(_stage(-2 * GIB))
    assert sum(terms.values()) == 15 * GIB
    setup = TrainSetup(stages=2, microbatches=2, micro_batch_size=1, mem_caps_bytes=[GIB] * 2, dp=2, zero=3)
    message = infeasible_message([Shortfall("device", 0, 15 * GIB, GIB, terms)], setup)
    assert ("activations x 2 microbatches 6 GiB, freed before the peak (gradient shards static counts), net of the "
            "largest transient -2 GiB") in message
    assert "largest transient 1 GiB" in infeasible_message(
        [Shortfall("device", 0, 18 * GIB, GIB, need_terms(_stage(GIB)))], setup)
