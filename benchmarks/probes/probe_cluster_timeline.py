"""Probe: where a clustered launch of the engine kernel loses its time (probe_mc_parts.py found that clusters
of two cost 5-20% on 64-row tiles at mid shapes even with nothing crossing CTAs). The launch build of
probe_mc_parts (clusters launched, no multicast, no cluster barriers) with a per-CTA timeline
(kernels/common/timeline.cuh: %globaltimer and %smid at the kernel's start and where the consumer finished
its tiles): for the same tile with and without clusters, the spread of the CTAs' starts, how long each
CTA ran and at which SM clock (clock64 over %globaltimer), when its first k-step landed, the span, and on
which SMs the pairs ran. Eager launches; records one line per plan to argv[1]. PROBE_VARIANT: the build
(default launch; mc: multicast as shipped); PROBE_CLUSTER_POLICY as in probe_mc_parts."""
import json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
import probe_mc_parts as parts  # noqa: E402
from gemmlab import planner  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402

SHAPES = [(128, 4096, 4096, 64, 64), (1000, 1152, 6912, 64, 144), (200, 8192, 5376, 128, 128),
          (1536, 1024, 4096, 128, 96), (256, 5120, 5120, 64, 160)]
EV = 8


def timeline_patches(addr: int, variant: str) -> list:
    """probe_mc_parts' patches of ``variant`` and the timeline's marks (TIMELINE_BUF at ``addr``)."""
    return parts.PATCHES[variant] + [
        ("engine/gemm.cu", '#include "common/gemm_traits.cuh"',
         f'#define TIMELINE_BUF {addr:#x}ull\n#include "common/timeline.cuh"\n#include "common/gemm_traits.cuh"'),
        ("engine/gemm.cu", "const int wg = threadIdx.x / 128, t = threadIdx.x % 128;",
         "const int wg = threadIdx.x / 128, t = threadIdx.x % 128;\n    TIMELINE_MARK(threadIdx.x == 0, 0);"),
        ("engine/gemm.cu", "    if (!Tr::DIRECT && t == 0) tma_store_wait_all<0>();",
         "    TIMELINE_MARK(wg == 1 && t == 0, 1);\n    if (!Tr::DIRECT && t == 0) tma_store_wait_all<0>();"),
        # the first consumer's first k-step landed (inside the k-loop: both builds carry the same mark)
        ("common/mainloop.cuh", "        ring.wait_full(cur);\n        // This consumer's rows",
         "        ring.wait_full(cur);\n        TIMELINE_MARK(consumer == 0 && t == 0 && kt == k_begin && "
         "k_begin == 0, 2);\n        // This consumer's rows")]


def main():
    buf = torch.zeros(132 * EV * 3, dtype=torch.int64, device="cuda")
    parts.PATCHES["timeline"] = timeline_patches(buf.data_ptr(), os.environ.get("PROBE_VARIANT", "launch"))
    compiler.KERNEL_ROOT = parts.patched_root("timeline")
    from gemmlab import engine2
    from gemmlab.gpu import gpu_info
    prof = engine2._profile(torch.device("cuda"))
    out = open(sys.argv[1], "a")
    for M, N, K, bm, bn in SHAPES:
        cands = planner.candidates(M, N, K, profile=prof, mcast=True)
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        o = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ref = a.float() @ w.float().t()
        for mc in (1, 2):
            p = next(c for c in cands if (c.bm, c.bn, c.mcast) == (bm, bn, mc) and c.schedule == "data_parallel")
            if os.environ.get("PROBE_CLUSTER_POLICY"):
                parts.set_cluster_policy([p], int(os.environ["PROBE_CLUSTER_POLICY"]))
            runs = [r.view(132, EV, 3)[: p.grid] for r in parts.traced_runs(engine2, p, a, w, o, buf)]
            err = ((o.float() - ref).norm() / ref.norm()).item()
            span, spread, dur_med, dur_max, mhz, first = [], [], [], [], [], []
            for r in runs:
                st, en = r[:, 0, 0].double(), r[:, 1, 0].double()
                span.append((en.max() - st.min()).item() / 1e3)
                spread.append((st.max() - st.min()).item() / 1e3)
                d = (en - st) / 1e3
                dur_med.append(d.median().item())
                dur_max.append(d.max().item())
                # the SM clock each CTA ran at: clock64 ticks over %globaltimer ns
                mhz.append(((r[:, 1, 1] - r[:, 0, 1]).double() / (en - st) * 1e3).median().item())
                first.append(((r[:, 2, 0].double() - st) / 1e3).median().item())
            med = lambda xs: sorted(xs)[len(xs) // 2]
            last = runs[-1]
            rec = {"suite": "cluster-timeline", "variant": os.environ.get("PROBE_VARIANT", "launch"),
                   "policy": int(os.environ.get("PROBE_CLUSTER_POLICY", 0)), "M": M, "N": N, "K": K,
                   "bm": bm, "bn": bn, "mcast": mc,
                   "grid": p.grid, "rel_error": err, "span_us": med(span), "start_spread_us": med(spread),
                   "cta_us_median": med(dur_med), "cta_us_max": med(dur_max), "cta_sm_mhz": med(mhz),
                   "first_data_us": med(first),
                   "smid": last[:, 0, 2].tolist(), "start_ns": (last[:, 0, 0] - last[:, 0, 0].min()).tolist(),
                   "end_ns": (last[:, 1, 0] - last[:, 0, 0].min()).tolist(), "gpu": gpu_info().name,
                   "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}
            print(f"{M}x{N}x{K} {bm}x{bn} mcast {mc} grid {p.grid}: span {rec['span_us']:.1f} us, starts spread "
                  f"{rec['start_spread_us']:.2f} us, CTA median {rec['cta_us_median']:.1f} max {rec['cta_us_max']:.1f}"
                  f" at {rec['cta_sm_mhz']:.0f} MHz, first data {rec['first_data_us']:.2f} us"
                  f" (err {err:.1e}); first SMs {rec['smid'][:12]}", flush=True)
            out.write(json.dumps(rec) + "\n")
            out.flush()


if __name__ == "__main__":
    main()
