"""Probe: one k-step at a time, when the loads of the engine kernel's 64-row mid tiles are issued, when the
consumer finds them landed, and when it releases the slot. Session 19's Nsight Compute run found our
64 x 96 consumer at 1024x768x3072 waiting on "full" for 23% of its samples (cuBLAS's: 4%) and each SM
receiving its 953 KB at 53 B/clk (cuBLAS: 66; our multicast build: 45), with the L2 not the bound. This
says which side is slow: the producer's issue (does it wait on "empty", how long after a release does it
issue), the flight (issue to landed), or, with multicast, the pair's coupling.

A patched copy of the kernel sources (probe_mc_parts.patched_root) records clock64's low 32 bits into a
device buffer: kind 0 the producer's issue of k-step kt (after its "empty" wait), 1 the first consumer's
return from the "full" wait of kt, 2 its release of kt, per CTA (one data-parallel tile each: every plan
here is one wave). The marks are global stores in the loops they measure: they cost a little themselves,
the same in both builds. Eager launches, 30 (10 warm-up); per plan the medians over CTAs and launches of:

  first_issue / first_full   the first k-step's issue and landing, cycles after the CTA's start mark
  flight                     issue -> consumer passes the full wait (an upper bound on the flight: the
                             consumer may arrive later than the bytes)
  period                     consumer's full(kt + 1) - full(kt) in the steady state (k-steps 12 .. end-4)
  wait_share                 the share of the steady state the consumer spent in the full wait (full(kt + 1)
                             - release(kt - 1): its iteration kt ends with that release, over the period)
  issue_lag                  issue(kt) - release(kt - STAGES): how soon a released slot is refilled
                             (multicast: the peer's release counts too; negative: the slot was free)

    python benchmarks/probes/probe_kstep_trace.py OUT.jsonl
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
import probe_mc_parts as parts  # noqa: E402
from gemmlab import planner  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402

# (M, N, K, bm, bn, mcast): the mid 64-row tiles, multicast twin, and a 128-row tile that beats cuBLAS.
PLANS = [(1024, 768, 3072, 64, 96, 1), (1024, 768, 3072, 64, 96, 2), (640, 1024, 5120, 64, 80, 1),
         (128, 4096, 4096, 64, 64, 1), (1536, 1024, 4096, 128, 96, 1)]
if os.environ.get("PROBE_PLANS"):  # "M,N,K,bm,bn,mcast;..."
    PLANS = [tuple(int(x) for x in s.split(",")) for s in os.environ["PROBE_PLANS"].split(";")]
# PROBE_BUILD=launch: the trace on top of probe_mc_parts' "launch" build, where a multicast plan is a
# clustered launch whose CTAs share nothing (own loads, own releases, no cluster barriers): the same tile
# traced plainly (mcast 1) and clustered (mcast 2), to see where a clustered launch's CTAs lose time.
BUILD = os.environ.get("PROBE_BUILD", "")
KMAX, CTAS = 128, 132
WG_LINE = ("const int wg = Tr::UNIFORM_WG ? warpgroup_index() : static_cast<int>(threadIdx.x / 128), "
           "t = threadIdx.x % 128;")


def trace_patches(addr: int) -> list:
    helper = (f"#define KTRACE_BUF {addr:#x}ull\n"
              "__device__ __forceinline__ void ktrace(int kind, int kt) {\n"
              f"    if (kt < 0 || kt >= {KMAX}) return;\n"
              "    reinterpret_cast<unsigned*>(KTRACE_BUF)[(blockIdx.x * 4 + kind) * " + str(KMAX) + " + kt] =\n"
              "        static_cast<unsigned>(clock64());\n"
              "}\n")
    return [
        ("engine/gemm.cu", '#include "common/mainloop.cuh"', helper + '#include "common/mainloop.cuh"'),
        ("engine/gemm.cu", WG_LINE, WG_LINE + "\n    if (threadIdx.x == 0) ktrace(3, 0);"),
        ("common/mainloop.cuh", "        u64* bar = ring.acquire(cur, a_bytes + b_bytes + Extra::bytes);",
         "        u64* bar = ring.acquire(cur, a_bytes + b_bytes + Extra::bytes);\n        ktrace(0, kt);"),
        ("common/mainloop.cuh", "        ring.wait_full(cur);\n        // This consumer's rows",
         "        ring.wait_full(cur);\n        if (t == 0 && consumer == 0) ktrace(1, kt);\n"
         "        // This consumer's rows"),
        ("common/mainloop.cuh", "wgmma_wait<1>();\n            if (t == 0) ring.template release<Tr::MCAST>(prev);",
         "wgmma_wait<1>();\n            if (t == 0) ring.template release<Tr::MCAST>(prev);\n"
         "            if (t == 0 && consumer == 0) ktrace(2, kt - 1);"),
        ("common/mainloop.cuh", "wgmma_wait<0>();\n    if (t == 0) ring.template release<Tr::MCAST>(prev);",
         "wgmma_wait<0>();\n    if (t == 0) ring.template release<Tr::MCAST>(prev);\n"
         "    if (t == 0 && consumer == 0) ktrace(2, k_end - 1);"),
    ]


def summarize(tr, k_iters: int, stages: int) -> dict:
    """tr: (launches, CTAs, 4, KMAX) int64 clock deltas (unwrapped against the start mark)."""
    start = tr[:, :, 3, :1]
    iss, full, rel = tr[:, :, 0, :k_iters] - start, tr[:, :, 1, :k_iters] - start, tr[:, :, 2, :k_iters] - start
    lo, hi = 12, k_iters - 4
    period = (full[:, :, lo + 1:hi + 1] - full[:, :, lo:hi]).double()
    # The consumer is ready for k-step kt + 1 once it released kt - 1 (the end of its iteration kt).
    waited = (full[:, :, lo + 1:hi + 1] - rel[:, :, lo - 1:hi - 1]).double().clamp(min=0)
    lag = (iss[:, :, stages + lo:hi] - rel[:, :, lo:hi - stages]).double()
    med = lambda x: x.double().median().item()  # noqa: E731
    return {"first_issue": med(iss[:, :, 0]), "first_full": med(full[:, :, 0]),
            "flight": med((full - iss)[:, :, lo:hi]), "period": med(period),
            "wait_share": med(waited) / max(med(period), 1.0), "issue_lag": med(lag),
            "last_release": med(rel[:, :, k_iters - 1])}


def main():
    buf = torch.zeros(CTAS * 4 * KMAX, dtype=torch.int32, device="cuda")
    parts.PATCHES["ktrace"] = trace_patches(buf.data_ptr()) + (parts.PATCHES[BUILD] if BUILD else [])
    compiler.KERNEL_ROOT = parts.patched_root("ktrace")
    from gemmlab import engine2
    from gemmlab.gpu import gpu_info, sample_clocks
    order = "pairs for mcast 2"
    if os.environ.get("PROBE_SWAP_ORDER") == "1":  # launch build: the orders exchanged (probe_mc_parts)
        assert BUILD == "launch"
        from gemmlab.schedule import device_order_table

        def swapped_order(p, device):
            if p.mcast > 1:
                return device_order_table("hilbert", p.tiles_m, p.tiles_n, 8, device)
            return device_order_table("hilbert", p.tiles_m, p.tiles_n, 8, device, pair_m=2 if p.tiles_m % 2 == 0 else 1)
        engine2.plan_order = swapped_order
        order = "swapped: pairs for mcast 1"
    prof = engine2._profile(torch.device("cuda"))
    out = open(sys.argv[1], "a")
    for M, N, K, bm, bn, mc in PLANS:
        p = min((c for c in planner.candidates(M, N, K, profile=prof, mcast=mc > 1)
                 if (c.bm, c.bn, c.mcast) == (bm, bn, mc) and c.schedule == "data_parallel" and not c.swap_ab),
                key=lambda c: c.predicted_s)
        assert p.tiles <= p.grid <= CTAS, p
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        o = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ w.float().t()
        runs = [r.view(CTAS, 4, KMAX)[: p.tiles].long() for r in parts.traced_runs(engine2, p, a, w, o, buf)]
        err = ((o.float() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, err
        tr = torch.stack(runs)
        tr = (tr - tr[:, :, 3:4, :1]) % (1 << 32)  # 32-bit clock deltas from the CTA's start mark
        tr[:, :, 3] = 0
        s = summarize(tr, (K + 63) // 64, p.stages)
        rec = {"suite": "kstep-trace", "build": BUILD or "shipped", "order": order, "M": M, "N": N, "K": K,
               "bm": bm, "bn": bn, "mcast": mc,
               "stages": p.stages, "plan": repr(p), "rel_error": err, **s, "sm_clock_mhz": sample_clocks().sm_mhz,
               "gpu": gpu_info().name, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}
        print(f"{M}x{N}x{K} {bm}x{bn} mc{mc} {p.stages} st: first issue {s['first_issue']:.0f} full "
              f"{s['first_full']:.0f}; flight {s['flight']:.0f}, period {s['period']:.0f}, waiting "
              f"{s['wait_share']:.0%}, issue lag {s['issue_lag']:.0f}, done {s['last_release']:.0f} cycles",
              flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
