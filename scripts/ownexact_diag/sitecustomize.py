"""Diagnostic (OWNDIAG=FOLDER, this folder on PYTHONPATH after the checkout; docs/published-runs.md §67.ownexact): at
each new peak of a run's MemTracker the live storages, each with the op (and forward or backward) that made it, kept
cheap (no stacks) so that gloo's timing moves little; the peak written per rank process at the tracker's exit as a
`PEAK` line; with OWNRS=1 also the largest moment at a reduce-scatter's wait (the `split` of gloo's clone) as `RS`."""
import os

if os.environ.get("OWNDIAG"):
    from torch.distributed._tools import mem_tracker as mt

    MADE = {}
    NOW = ["-"]
    create = mt._WeakRefInfo.create_winfo.__func__

    def create_winfo(cls, st, device, reftype, callback):
        winfo, w = create(cls, st, device, reftype, callback)
        MADE[id(winfo)] = NOW[0]
        return winfo, w

    mt._WeakRefInfo.create_winfo = classmethod(create_winfo)
    dispatch = mt.MemTracker.__torch_dispatch__

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        NOW[0] = f"{func.__name__}@{'B' if self._mod_tracker.is_bw else 'F'}"
        out = dispatch(self, func, types, args, kwargs)
        if func.__name__ == "split.Tensor" and os.environ.get("OWNRS"):
            total = sum(d.get("Total", 0) for d in self._curr_mem_snap.values())
            if total > getattr(self, "_own_rs", (0,))[0]:
                live = [(winfo.mem_consumed, MADE.get(id(winfo), "pre")) for st, (winfo, w) in list(self._WINFO.items())
                        if w() is not None and winfo.mem_consumed > 0]
                self._own_rs = (total, live, NOW[0])
        return out

    mt.MemTracker.__torch_dispatch__ = __torch_dispatch__
    update = mt.MemTracker._update_peak_stats

    def _update_peak_stats(self, peak_state):
        before = dict(self._peak_mem)
        update(self, peak_state)
        if self._peak_mem != before:
            live = [(winfo.mem_consumed, MADE.get(id(winfo), "pre")) for st, (winfo, w) in list(self._WINFO.items())
                    if w() is not None and winfo.mem_consumed > 0]
            self._own_peak = (sum(self._peak_mem.values()), live, NOW[0])

    mt.MemTracker._update_peak_stats = _update_peak_stats
    exit_ = mt.MemTracker.__exit__

    def __exit__(self, *args):
        out = exit_(self, *args)
        rs = getattr(self, "_own_rs", None)
        if rs is not None and self._depth == 0:
            import collections
            count = collections.Counter(rs[1])
            with open(os.path.join(os.environ["OWNDIAG"], f"r{os.environ.get('RANK', 'x')}-{os.getpid()}.txt"), "a") as f:
                f.write(f"RS {rs[0]} | " + "; ".join(f"{n}x{s} {m}" for (s, m), n in sorted(count.items(), key=lambda x: -x[0][0])) + "\n")
        peak = getattr(self, "_own_peak", None)
        if peak is not None and self._depth == 0:
            import collections
            total, live, at = peak
            count = collections.Counter(live)
            path = os.path.join(os.environ["OWNDIAG"], f"r{os.environ.get('RANK', 'x')}-{os.getpid()}.txt")
            with open(path, "a") as f:
                f.write(f"PEAK {total} at {at} | " + "; ".join(f"{n}x{s} {m}" for (s, m), n in
                                                           sorted(count.items(), key=lambda x: -x[0][0])) + "\n")
        return out

    mt.MemTracker.__exit__ = __exit__
