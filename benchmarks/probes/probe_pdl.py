"""Probe: programmatic dependent launch (PDL) between back-to-back eager calls. Per shape, the GPU's period
per call of CALLS calls queued behind a sleeping kernel (CUDA events around them, recorded after the
sleep: kernel plus gap per call, with the host ahead of the GPU), gemmlab.matmul and torch.mm interleaved
over ROUNDS rounds (medians). One process per variant, argv[2]:
  off    GEMMLAB_PDL=0: plain launches
  late   the default: each CTA lets the next kernel be scheduled after its last unit (pdl_trigger_late)
  early  the kernels compiled with PDL_TRIGGER_EARLY=1: right after pdl_wait (kernels/common/ptx.cuh)
argv[3] (optional) "decode": the decode route's shapes (DECODE_SHAPES) instead of SHAPES.
One JSON line per (shape, variant) appended to argv[1]."""
import json
import os
import statistics
import sys

VARIANT = sys.argv[2]
if VARIANT == "off":
    os.environ["GEMMLAB_PDL"] = "0"

import torch  # noqa: E402

import gemmlab  # noqa: E402
from gemmlab.gpu import sample_clocks  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402

SHAPES = [(1, 14336, 4096), (8, 14336, 4096), (16, 14336, 4096), (32, 14336, 4096), (8, 8192, 8192),
          (16, 8192, 8192), (32, 8192, 8192), (16, 16384, 16384), (1, 4096, 4096), (16, 4096, 4096),
          (256, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096)]
# The decode kernel's shapes of the broad set, three of which lost with its trigger after the main loop.
DECODE_SHAPES = [(2, 1536, 8960), (2, 4096, 2304), (2, 576, 7168), (1, 2048, 2048), (4, 4096, 1024),
                 (1, 1536, 7168), (2, 3072, 3072), (8, 2048, 8192), (1, 4096, 4096), (16, 4096, 4096)]
CALLS, ROUNDS = 100, 7


def _early():
    plain = compiler.compile_kernel

    def compile_kernel(source, name_expression, *, defines=None, **kw):
        return plain(source, name_expression, defines={**(defines or {}), "PDL_TRIGGER_EARLY": "1"}, **kw)

    import gemmlab.engine as engine
    import gemmlab.engine2 as engine2

    compiler.compile_kernel = compile_kernel
    for m in (engine, engine2):
        if hasattr(m, "compile_kernel"):
            m.compile_kernel = compile_kernel


def period_us(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(10_000_000)  # ~5 ms: every call below is enqueued before the GPU reaches them
    start.record()
    for _ in range(CALLS):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / CALLS


def main():
    if VARIANT == "early":
        _early()
    out = open(sys.argv[1], "a")
    for M, N, K in DECODE_SHAPES if sys.argv[3:4] == ["decode"] else SHAPES:
        x = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        sides = {"torch": lambda: torch.mm(x, w.t()), "gemmlab": lambda: gemmlab.matmul(x, w.t())}
        for fn in sides.values():
            for _ in range(20):
                fn()
        torch.cuda.synchronize()
        times = {s: [] for s in sides}
        for r in range(ROUNDS):
            for s in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                times[s].append(period_us(sides[s]))
        t, g = statistics.median(times["torch"]), statistics.median(times["gemmlab"])
        rec = {"suite": "pdl-probe", "M": M, "N": N, "K": K, "variant": VARIANT, "calls": CALLS,
               "rounds": ROUNDS, "period_us": g, "baseline": "torch.mm", "baseline_period_us": t, "ratio": t / g,
               "period_us_all": times["gemmlab"], "baseline_period_us_all": times["torch"],
               "sm_clock_mhz": sample_clocks().sm_mhz, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}
        print(f"{VARIANT:5s} {M:5d}x{N:5d}x{K:5d} ours {g:8.2f} us torch {t:8.2f} us x{t / g:.3f}", flush=True)
        out.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
