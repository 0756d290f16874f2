"""The search's setups charge the host's link as evaluate's do: shared by the GPUs behind one PCIe switch's uplink
(links.default_links, GPU.gpus_per_host_switch: 2 on an A100 server, §43.dsgap), where dp > 1 and where the
optimizer is offloaded on one replica."""

from __future__ import annotations

import pytest
from test_search import MINI

from planner.cost import links
from planner.models import archs
from planner.profiler.analytic import analytic_profile
from planner.profiler.formulas import Shape
from planner.schema import FileRef
from planner.solve import jobsearch
from planner.solve.degrees import Degrees

A100 = archs.gpu("a100-80g")
GiB = 2**30


def _profile():
    profile = analytic_profile(MINI, Shape(seq_len=2048, micro_batch_size=1, tp=1, sp=False), gpu=A100,
                               model=FileRef(file=f"arch:{MINI.name}", sha256=MINI.sha256()))
    # the host's Adam step as a profile measures it (its figure is not read here: the links are)
    return profile.model_copy(update={"host_step_ns_per_param": {"adam": 1.0}})


@pytest.mark.parametrize("pp,dp", [(1, 8), (2, 4), (1, 1)])
def test_an_offloaded_configurations_host_link_is_evaluates(pp, dp):
    profile = _profile()
    degrees = Degrees(tp=1, sp=False, pp=pp, dp=dp, micro_batch_size=1, microbatches=max(pp, 2), zero=1,
                      offload=True)
    options = jobsearch.JobOptions(mem_cap_bytes=80 * GiB, gpus_per_node=8, runtime="deepspeed")
    setup = jobsearch.job_setup(profile, degrees, options)
    chosen = links.default_links(profile, stages=pp, dp=dp, shard_group=dp, gpus_per_node=8)
    assert setup.data_parallel.host_gb_per_s == chosen.host_gb_per_s
    # by hand: two A100s a switch's uplink wherever the job has two ranks or more
    assert A100.gpus_per_host_switch == 2
    assert setup.data_parallel.host_gb_per_s == A100.host_link_gb_per_s / (2 if pp * dp > 1 else 1)
