"""Probe: why an eager decode call can lose to torch.mm while its kernel wins in graph replay. Back-to-back
eager calls of torch.mm and of gemmlab.matmul under torch.profiler (CUPTI kernel records): each side's
median kernel duration and median idle gap between its consecutive kernels, per shape, twice: as the calls come ("free": the host's
pace under the profiler, whose per-launch cost is not the eager call's), and queued behind a sleeping kernel
("queued": every launch is in the stream before the GPU reaches it, so a gap is the GPU's own time between
two kernels). One JSON line per (shape, side, mode) to argv[1]."""
import json
import os
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import gemmlab
from gemmlab.jit import launch

SHAPES = [(16, 14336, 4096), (32, 14336, 4096), (8, 14336, 4096), (32, 8192, 8192)]
CALLS = 60


def trace(fn, queued: bool) -> tuple[list[float], list[float]]:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        if queued:  # ~20 ms of GPU sleep (at up to 2 GHz): the host enqueues every call meanwhile
            torch.cuda._sleep(40_000_000)
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    ev = sorted((e for e in p.events() if e.device_type.name == "CUDA" and "sleep" not in e.name),
                key=lambda e: e.time_range.start)
    dur = [e.time_range.end - e.time_range.start for e in ev]
    gaps = [b.time_range.start - a.time_range.end for a, b in zip(ev, ev[1:])]
    return dur, gaps, sorted({e.name[:60] for e in ev})


def main():
    out = open(sys.argv[1], "a")
    for M, N, K in SHAPES:
        x = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        for side, fn, queued in ((s, f, q) for q in (False, True) for s, f in (
                ("torch", lambda: torch.mm(x, w.t())), ("gemmlab", lambda: gemmlab.matmul(x, w.t())))):
            dur, gaps, names = trace(fn, queued)
            rec = {"suite": "eager-gaps", "M": M, "N": N, "K": K, "side": side,
                   "mode": "queued" if queued else "free", "kernels": len(dur),
                   "kernel_us_median": statistics.median(dur), "gap_us_median": statistics.median(gaps),
                   "gap_us_mean": statistics.fmean(gaps), "names": names,
                   "git_sha": os.environ.get("GEMMLAB_GIT_SHA"), "pdl": launch.PDL}
            print(json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
