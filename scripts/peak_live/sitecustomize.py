"""Loaded by scripts/peak_live.py's ranks (this folder first on PYTHONPATH, PEAK_LIVE_DIR set): MemTracker records,
at each new peak, every live storage it tracks with its bytes, its kind and where it was made (the innermost frames
in planner/ or torch/distributed), and writes the peak's list per tracker to PEAK_LIVE_DIR/rank<RANK>.jsonl."""

import os

if os.environ.get("PEAK_LIVE_SWITCH"):  # the interpreter's switch interval (s): the rank's thread keeps the GIL longer
    import sys

    sys.setswitchinterval(float(os.environ["PEAK_LIVE_SWITCH"]))

if os.environ.get("PEAK_LIVE_HOLD_RS"):  # each reduce-scatter's input held to the next one's call: as gloo's clone,
    import torch.distributed as dist  # its work not yet let go by gloo's worker thread, would be (a simulation)

    _held, _reduce_scatter_single = [], dist.reduce_scatter_single

    def reduce_scatter_single(*args, **kwargs):
        _held[:] = [kwargs.get("input")]
        return _reduce_scatter_single(*args, **kwargs)

    dist.reduce_scatter_single = reduce_scatter_single

if os.environ.get("PEAK_LIVE_DIR"):
    import json
    import traceback
    from pathlib import Path

    from torch.distributed._tools import mem_tracker as mt

    def _where() -> str:
        frames = [f for f in traceback.extract_stack()[:-3]
                  if ("/planner/" in f.filename or "/distributed/" in f.filename or "/nn/" in f.filename)
                  and "_tools" not in f.filename]
        return " < ".join(f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in frames[::-1][:4])

    _create = mt._WeakRefInfo.create_winfo.__func__

    def create_winfo(cls, st, device, reftype, callback=None):
        winfo, w_st = _create(cls, st, device, reftype, callback)
        winfo.where = _where()
        return winfo, w_st

    mt._WeakRefInfo.create_winfo = classmethod(create_winfo)
    _update = mt.MemTracker._update_peak_stats

    def _update_peak_stats(self, peak_state):
        before = sum(self._peak_mem.values())
        _update(self, peak_state)
        if sum(self._peak_mem.values()) > before:
            self._peak_live = [(w.mem_consumed, w.reftype.name, getattr(w, "where", "?"))
                               for w, _ in list(self._WINFO.values()) if w.mem_consumed > 0]
            self._peak_at = _where()

    mt.MemTracker._update_peak_stats = _update_peak_stats
    _exit = mt.MemTracker.__exit__

    def __exit__(self, *args):
        _exit(self, *args)
        out = Path(os.environ["PEAK_LIVE_DIR"]) / f"rank{os.environ.get('RANK', '0')}.jsonl"
        with out.open("a") as f:
            f.write(json.dumps({"peak": sum(self._peak_mem.values()), "at": getattr(self, "_peak_at", ""),
                                "live": getattr(self, "_peak_live", [])}) + "\n")

    mt.MemTracker.__exit__ = __exit__
