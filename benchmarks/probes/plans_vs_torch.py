"""The part the plan probes share (probe_mcast.py, probe_stages.py): engine-kernel plans of one nn.Linear-shaped
bf16 problem against torch.mm, each result checked against an fp32 product (outputs poisoned with NaN first),
then timed interleaved in graph replay with the project's timer."""
import os

import torch

from gemmlab import engine, engine2
from gemmlab.timer import time_interleaved


def shapes_from_env(default: list) -> list:
    """A probe's shapes: PROBE_SHAPES="M,N,K;M,N,K" (integers a shape, as many as the probe's own list has)
    in place of its default list."""
    raw = os.environ.get("PROBE_SHAPES")
    return [tuple(int(x) for x in s.split(",")) for s in raw.split(";")] if raw else list(default)


def plan_tag(p) -> str:
    """A plan's short name in the probes' records: [swap ]BMxBN schedule[ sSPLITS]/STAGES."""
    sk = f" s{p.splits}" if p.splits > 1 else ""
    return f"{'swap ' if p.swap_ab else ''}{p.bm}x{p.bn} {p.schedule}{sk}/{p.stages}"


def time_plans(M: int, N: int, K: int, plans: dict, *, routed: bool = False, prepared: bool = True) -> dict:
    """{name: plan} -> {"torch_ms", "ratios" (torch time / each one's; "torch", and "routed" if asked: what
    gemmlab.matmul runs), "bad" ([(name, relative error)] of results off by 1e-2 or more), "sm_clock_mhz"}.
    prepared: each plan through the prepared launch gemmlab.matmul uses (``engine.gemm(..., plan=p)``, with
    programmatic dependent launch); False: ``engine2.launch`` (plain launches, ``engine2.plan_order``)."""
    sets = []
    for _ in range(3):
        a = torch.randn(M, K, device="cuda").bfloat16()
        w = torch.randn(N, K, device="cuda").bfloat16()
        sets.append((a, w, torch.empty(M, N, device="cuda", dtype=torch.bfloat16)))
    ref = sets[0][0].float() @ sets[0][1].float().t()
    cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1].t(), out=sets[i][2])}
    if routed:
        cands["routed"] = lambda i: engine.gemm(sets[i][0], sets[i][1].t(), sets[i][2])
    for name, p in plans.items():
        if prepared:
            cands[name] = (lambda p: lambda i: engine.gemm(sets[i][0], sets[i][1].t(), sets[i][2], plan=p))(p)
        else:
            cands[name] = (lambda p: lambda i: engine2.launch(p, sets[i][0], sets[i][1].t(), sets[i][2]))(p)
    bad = bad_results(cands, sets[0][2], ref)
    res = time_interleaved(cands, 3, rounds=5, replay_ms=3.0)
    base = res.timings["torch"].median_ms
    return {"torch_ms": base, "ratios": {k: round(base / t.median_ms, 4) for k, t in res.timings.items()},
            "bad": bad, "sm_clock_mhz": res.clocks.sm_mhz}


def bad_results(cands: dict, out: torch.Tensor, ref: torch.Tensor) -> list:
    """[(name, relative error)] of the candidates (``fn(0)`` writes ``out``, poisoned with NaN first) whose
    result is off ``ref`` by 1e-2 or more (NaN included)."""
    bad = []
    for name, fn in cands.items():
        out.fill_(float("nan"))
        fn(0)
        torch.cuda.synchronize()
        err = ((out.float() - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            bad.append((name, err))
    return bad


def report(out, suite: str, M: int, N: int, K: int, plans: dict, r: dict, gpu: str, note: str = "") -> None:
    """Print ``time_plans``' result (best first, with each plan's predicted time) and append its record."""
    import json
    import os

    print(f"{M}x{N}x{K} torch {r['torch_ms'] * 1e3:.1f} us, {r['sm_clock_mhz']} MHz, bad {r['bad']}{note}"[:300],
          flush=True)
    for k, v in sorted(r["ratios"].items(), key=lambda kv: -kv[1]):
        p = plans.get(k)
        print(f"   {v:.3f}  {k}" + (f"  (predicted {p.predicted_s * 1e6:.1f} us, grid {p.grid})" if p else ""),
              flush=True)
    out.write(json.dumps({"suite": suite, "M": M, "N": N, "K": K, **r, "plans": {k: repr(p) for k, p in plans.items()},
                          "gpu": gpu, "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}) + "\n")
    out.flush()


def run_probe(suite: str, shapes, variants, path: str, note=None) -> None:
    """The probes' main loop: ``variants(M, N, K) -> {name: plan}`` per shape, every instantiation compiled
    up front in a process pool, then each shape's plans timed with ``time_plans`` (routed too) and reported
    (appended to ``path``); ``note(M, N, K) -> str`` adds to each shape's printed line."""
    from engine_broad import precompile
    from gemmlab.gpu import gpu_info

    plans = {s: variants(*s) for s in shapes}
    precompile([p for d in plans.values() for p in d.values()], 16)
    gpu = gpu_info().name
    with open(path, "a") as out:
        for (M, N, K), vs in plans.items():
            r = time_plans(M, N, K, vs, routed=True)
            report(out, suite, M, N, K, vs, r, gpu, note=note(M, N, K) if note else "")


def profiled_probe(suite: str, shapes, variants, note=None) -> None:
    """A probe's main: ``run_probe`` over ``shapes`` with ``variants(M, N, K, profile)`` planned for the GPU
    this runs on (``engine2._profile``), records appended to the path in ``sys.argv[1]``."""
    import sys

    prof = engine2._profile(torch.device("cuda"))
    run_probe(suite, shapes, lambda M, N, K: variants(M, N, K, prof), sys.argv[1], note=note)


def profile_launches(calls, plans, path: str) -> None:
    """For Nsight Compute (``ncu --profile-from-start off``): compile ``plans`` (a process pool), warm every
    one of ``calls`` ([(name, fn)]) up, then launch each once between cudaProfilerStart and cudaProfilerStop
    (a synchronize after each) and write their names to ``path``, one per line, in the report's order."""
    if plans:
        from engine_broad import precompile

        precompile(plans, 16)
    for _, fn in calls:  # compile and warm up outside the profiled range
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _, fn in calls:
        fn()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    with open(path, "w") as f:
        f.write("\n".join(name for name, _ in calls) + "\n")
