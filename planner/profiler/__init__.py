"""Measure a model's pipeline layers: `measure.measure_model` is the entry point.

storages.py counts memory by tensor storage, saved.py finds what each layer keeps
for backward, timing.py times forward/backward, kinds.py groups identical layers.
The profiler never prints and never reads files; `ckplan profile` does both.
"""
