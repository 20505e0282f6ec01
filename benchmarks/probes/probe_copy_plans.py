"""Probe: do the operand copies cost every plan the same? On the broad set's shapes whose operands are
copied (K odd or off 8: A's and the weight's rows not 16-byte aligned), the data-parallel and global
split-K plans ran 1.2-2.1x their modelled time while cluster split-K and stream-K ran 0.9-1.4x
(five H200 runs, bb0d0cc and before); at 300x2050x4095 the model's pick (64 x 80 data-parallel) ran
1.09-1.14x slower than the best measured plan (128 x 96 split-K x2), the broad set's worst pick. Either the
copy and the GEMM after it interact (the GEMM is launched with PDL under the copy) differently by plan, or
those plans' kernels are slower on these shapes than priced whatever comes before them.

Per shape and per plan (engine_broad.candidate_plans: the model's pick, the best of each schedule and of
the other tile height), graph replay interleaved with torch.mm:
  NAME          the plan as gemmlab.matmul runs it: the copies' launch, then the GEMM (engine.gemm);
  NAME/aligned  the same plan on operands copied once beforehand into aligned buffers (the GEMM alone);
  copies        the two copies alone (engine.pad_copy, one plain launch each).
NAME - NAME/aligned is what the copies cost that plan; the same for every plan means no interplay.
Every result checked against an fp32 product (outputs poisoned with NaN first).

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_copy_plans.py OUT.jsonl
    PROBE_SHAPES="M,N,K;..." """
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine_broad import candidate_plans, precompile  # noqa: E402
from plans_vs_torch import bad_results, plan_tag, shapes_from_env  # noqa: E402

from gemmlab import engine, engine2  # noqa: E402
from gemmlab.gpu import gpu_info  # noqa: E402
from gemmlab.timer import time_interleaved  # noqa: E402

SHAPES = shapes_from_env([(300, 2050, 4095), (2050, 2050, 2050), (640, 3001, 2047), (1000, 4096, 3005),
                          (128, 1000, 4093), (2048, 1021, 8191)])


def operands(M: int, N: int, K: int) -> tuple:
    """(a, w, out, a copied into an aligned buffer, w copied likewise)."""
    a = torch.randn(M, K, device="cuda").bfloat16()
    w = torch.randn(N, K, device="cuda").bfloat16()
    ta, tw = engine._aligned_empty(M, K, a.dtype, a.device), engine._aligned_empty(N, K, a.dtype, a.device)
    engine.pad_copy(a, ta)
    engine.pad_copy(w, tw)
    return a, w, torch.empty(M, N, device="cuda", dtype=torch.bfloat16), ta, tw


def main():
    info = gpu_info()
    prof = engine2._profile(torch.device("cuda"))
    per_shape = {s: candidate_plans(*s, prof) for s in SHAPES}
    precompile([p for plans in per_shape.values() for p in plans.values()], min(16, os.cpu_count() or 1))
    with open(sys.argv[1], "a") as f:
        for (M, N, K), plans in per_shape.items():
            sets = [operands(M, N, K) for _ in range(3)]
            ref = sets[0][0].float() @ sets[0][1].float().t()
            cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2])}
            for name, p in plans.items():
                cands[name] = lambda i, p=p: engine.gemm(sets[i][0], sets[i][1].t(), sets[i][2], plan=p)
                cands[name + "/aligned"] = lambda i, p=p: engine.gemm(sets[i][3], sets[i][4].t(), sets[i][2], plan=p)
            bad = bad_results(cands, sets[0][2], ref)

            def copies(i):
                engine.pad_copy(sets[i][0], sets[i][3])
                engine.pad_copy(sets[i][1], sets[i][4])

            cands["copies"] = copies
            res = time_interleaved(cands, 3, rounds=5, replay_ms=3.0)
            ms = {k: t.median_ms for k, t in res.timings.items()}
            base = ms["torch"]
            print(f"{M}x{N}x{K}: torch {base * 1e3:.1f} us, copies {ms['copies'] * 1e3:.1f} us, "
                  f"{res.clocks.sm_mhz} MHz; bad {bad}", flush=True)
            for name, p in plans.items():
                full, alone = ms[name], ms[name + "/aligned"]
                rec = {"suite": "copy-plans-probe", "M": M, "N": N, "K": K, "candidate": name,
                       "plan": plan_tag(p), "predicted_ms": p.predicted_s * 1e3, "time_ms": full,
                       "aligned_ms": alone, "copies_ms": ms["copies"], "torch_ms": base,
                       "ratio": base / full, "aligned_ratio": base / alone, "copy_cost_ms": full - alone,
                       "bad": bad, "sm_clock_mhz": res.clocks.sm_mhz, "gpu": info.name,
                       "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}
                print(f"  {name:22s} {plan_tag(p):34s} priced {p.predicted_s * 1e6:7.1f} us, run {full * 1e3:7.1f}, "
                      f"aligned {alone * 1e3:7.1f} (copies cost it {(full - alone) * 1e3:5.1f})", flush=True)
                f.write(json.dumps(rec) + "\n")
            f.flush()


if __name__ == "__main__":
    main()
