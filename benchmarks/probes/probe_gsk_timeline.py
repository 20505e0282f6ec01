"""Probe: where a global split-K launch spends its fixed time. probe_split_fixed.py put it at ~7-8 us at
512 x 1024 (128 x 128 tiles, 2-4 ranks), against ~1.5 us for the data-parallel plan and ~3 us for
cuBLAS, while its k-steps run faster than cuBLAS's per unit of K. A patched copy of the kernels
(kernels/common/timeline.cuh) marks, per CTA (consumer 0's thread 0): the entry (0), its first k-step
landed (2), its k-loop done (3), its partial written to the workspace by every consumer thread (4), the
other ranks' flags acquired (7), its slice summed and stored (5), the exit (1): %globaltimer and clock64.
Eager launches, a synchronize after each, 30 runs after 10 warm-ups; phase lengths from clock64 at the
CTA's clock, medians over CTAs and runs. One line per plan to argv[1].
PROBE_FORM=thread: the thread-store exchange (gsk_reduce_store; the patched copy sets GSK_BULK_ON 0), the
form of gsk_timeline.jsonl's first records. PROBE_FORM=bulk (default: the kernel as it is where the slices
fit, GSK_BULK): after the k-loop (3), the partial staged and barred (4), the slices' bulk stores complete
(6), every peer's flag acquired and its slice's load issued (7), this rank's slices landed (8), summed and
stored (5), exit (1); not run yet.

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_gsk_timeline.py OUT.jsonl
    PROBE_PLANS="512,1024,4096,128,128,4;..." (M, N, K, bm, bn, splits)"""
import json, os, sys
import torch
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "benchmarks")
import probe_mc_parts as parts  # noqa: E402
from gemmlab import planner  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402

PLANS = [(512, 1024, 4096, 128, 128, 4), (512, 1024, 8192, 128, 128, 4), (512, 1024, 4096, 128, 128, 2),
         (512, 1024, 2048, 128, 128, 4), (256, 1536, 7168, 128, 96, 4)]
if os.environ.get("PROBE_PLANS"):
    PLANS = [tuple(int(x) for x in s.split(",")) for s in os.environ["PROBE_PLANS"].split(";")]
EV = 12
GEMM, RED = "engine/gemm.cu", "common/reduction.cuh"
FORM = os.environ.get("PROBE_FORM", "bulk")
PHASES = {"first_data": (0, 2), "k_loop": (2, 3), "partial_write": (3, 4), "flags_wait": (4, 7),
          "reduce_store": (7, 5), "exit": (5, 1), "cta": (0, 1)}
if FORM == "bulk":
    PHASES = {"first_data": (0, 2), "k_loop": (2, 3), "partial_stage": (3, 4), "bulk_stores": (4, 6),
              "flags_loads_issued": (6, 7), "slices_wait": (7, 8), "reduce_store": (8, 5), "exit": (5, 1),
              "cta": (0, 1)}


def patches(addr: int) -> list:
    common, at = parts.timeline_common_patches(addr, EV), parts.mark_between
    w20 = " " * 20  # the indent of gemm.cu's GSK_BULK branch
    if FORM == "bulk":  # gemm.cu's GSK_BULK branch (thread 128 = consumer 0's thread 0) and gsk_bulk_exchange
        return common + [
            at(GEMM, "const int valid = min(BM, ep.M - m0);\n", "", "threadIdx.x == 128", 4, w20),
            at(RED, "    tma_store_wait_all<0>();\n", "    fence_proxy_async_global();\n", "true", 6, "    "),
            at(RED, "rows * ROW, smem_u32(bar));\n    }\n", "}\n", "true", 7, "    "),
            at(GEMM, w20 + "mbar_wait_parity(&slices, 0);\n", w20 + "split_reduce_store<Tr, true>",
               "threadIdx.x == 128", 8, w20),
            at(GEMM, "threadIdx.x - 128, recv);\n", w20 + "continue;", "threadIdx.x == 128", 5, w20)]
    return common + [  # the thread-store form (gsk_reduce_store)
        ("common/gemm_traits.cuh", "#define GSK_BULK_ON 1", "#define GSK_BULK_ON 0"),
        at(RED, "    named_barrier_sync(3, CT);\n", "    if (ct == 0) {\n        flag_release_add(", "ct == 0", 4, "    "),
        at(RED, "    named_barrier_sync(3, CT);\n", "    const int q0 = rank * Q / splits", "ct == 0", 7, "    "),
        at(RED, "            store_pair<Tr>(ep, r + 8, c, sum.z, sum.w);\n        }\n    }\n", "", "ct == 0", 5, "    ")]


def main():
    buf = torch.zeros(132 * EV * 3, dtype=torch.int64, device="cuda")
    parts.PATCHES["gsk-timeline"] = patches(buf.data_ptr())
    compiler.KERNEL_ROOT = parts.patched_root("gsk-timeline")
    from gemmlab import engine2
    from gemmlab.gpu import gpu_info
    prof = engine2._profile(torch.device("cuda"))
    out = open(sys.argv[1], "a")
    med = parts.median
    for M, N, K, bm, bn, s in PLANS:
        p = next(c for c in planner.candidates(M, N, K, profile=prof, schedules=planner.SCHEDULES)
                 if (c.bm, c.bn, c.schedule, c.splits, c.swap_ab, c.mcast) == (bm, bn, "split_k_global", s, False, 1))
        runs, err = parts.traced_plan(engine2, p, M, N, K, buf, EV)
        rec = {"suite": "gsk-timeline", "M": M, "N": N, "K": K, "plan": repr(p), "bm": bm, "bn": bn, "splits": s,
               "grid": p.grid, "rel_error": err, "k_steps": -(-K // 64) // s}
        stats, mhz = parts.timeline_stats(runs, PHASES)
        rec.update(stats)
        # the slowest CTA's wait for the other ranks' flags (thread form: 4 -> 7; bulk: 6 -> 7, with the loads)
        e0 = 6 if FORM == "bulk" else 4
        rec["flags_wait_max_us"] = med([((r[:, 7, 1] - r[:, e0, 1]) / mz).max().item() for r, mz in zip(runs, mhz)])
        rec.update({"form": FORM, "gpu": gpu_info().name, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")})
        phases = " + ".join(f"{name} {rec[name + '_us']:.2f}" for name in PHASES
                            if name not in ("first_data", "k_loop", "exit", "cta"))
        print(f"{M}x{N}x{K} {bm}x{bn} gsk x{s} ({FORM}) grid {p.grid}: {parts.timeline_head(rec, rec['k_steps'])}"
              f" + {phases} (slowest flags wait {rec['flags_wait_max_us']:.2f})" + parts.timeline_tail(rec, err),
              flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
