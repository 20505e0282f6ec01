"""Probe: deeper rings for the decode shapes' engine plans (planner.MAX_STAGES = 9 today; cuBLAS runs 64 x 16
tiles with 16 stages there). The routed plan with 9 / 12 / 16 stages, torch.mm, graph replay, interleaved."""
import dataclasses, json, os, sys
import torch
sys.path.insert(0, "benchmarks")
from engine_broad import precompile  # noqa: E402
from gemmlab import engine, engine2, planner  # noqa: E402
from gemmlab.timer import time_interleaved  # noqa: E402
from gemmlab.gpu import gpu_info  # noqa: E402

SHAPES = [(1, 14336, 4096), (8, 14336, 4096), (16, 14336, 4096), (32, 14336, 4096), (16, 8192, 8192),
          (32, 8192, 8192), (1, 16384, 16384), (16, 4096, 14336), (16, 11008, 4096), (128, 4096, 4096)]


def variants(M, N, K):
    prof = engine2._profile(torch.device("cuda"))
    out = {}
    for p in planner.candidates(M, N, K, profile=prof)[:3]:
        for q in (9, 12, 16):
            v = dataclasses.replace(p, stages=q)
            if v.smem_bytes <= planner.SMEM_LIMIT:
                tag = "swap " if p.swap_ab else ""
                out[f"{tag}{p.bm}x{p.bn} {p.schedule} s{p.splits} /{q}"] = v
    return out


def main():
    info = gpu_info()
    plans = {s: variants(*s) for s in SHAPES}
    precompile([p for d in plans.values() for p in d.values()], 16)
    out = open(sys.argv[1], "a")
    for (M, N, K), vs in plans.items():
        sets = []
        for i in range(3):
            a = torch.randn(M, K, device="cuda").bfloat16()
            w = torch.randn(N, K, device="cuda").bfloat16()
            sets.append((a, w, torch.empty(M, N, device="cuda", dtype=torch.bfloat16)))
        ref = sets[0][0].float() @ sets[0][1].float().t()
        cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2]),
                 "routed": lambda i: engine.gemm(sets[i][0], sets[i][1].t(), sets[i][2])}
        for name, p in vs.items():
            cands[name] = (lambda p: lambda i: engine2.launch(p, sets[i][0], sets[i][1].t(), sets[i][2]))(p)
        bad = []
        for name, fn in cands.items():
            sets[0][2].fill_(float("nan")); fn(0); torch.cuda.synchronize()
            err = ((sets[0][2].float() - ref).norm() / ref.norm()).item()
            if not err < 1e-2:
                bad.append((name, err))
        res = time_interleaved(cands, 3, rounds=5, replay_ms=3.0)
        base = res.timings["torch"].median_ms
        ratios = {k: round(base / t.median_ms, 4) for k, t in res.timings.items()}
        print(f"{M}x{N}x{K} torch {base*1e3:.1f} us, {res.clocks.sm_mhz} MHz, bad {bad}; route {engine.plan(M, N, K)!r}"[:300], flush=True)
        for k, v in sorted(ratios.items(), key=lambda kv: -kv[1]):
            print(f"   {v:.3f}  {k}", flush=True)
        out.write(json.dumps({"suite": "stages-probe", "M": M, "N": N, "K": K, "torch_ms": base, "ratios": ratios,
                              "plans": {k: repr(p) for k, p in vs.items()}, "bad": bad,
                              "sm_clock_mhz": res.clocks.sm_mhz, "gpu": info.name,
                              "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
