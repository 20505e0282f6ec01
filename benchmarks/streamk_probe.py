"""Where stream-K's time goes on few-tile, deep-K shapes, and what global split-K gains: one process per
call, every candidate interleaved with torch.mm (``gemmlab.timer``: graph replays, rotated input sets).

    PYTHONPATH=src python3 benchmarks/streamk_probe.py --out $OUT/streamk_probe.jsonl \
        [--shapes "512,1024,4096;512,1024,8192"] [--precompile-tests]

Per shape: the model's plan, the best data-parallel plan, the best stream-K plan timed twice (as it runs
now, and with a flags fill kernel before every launch: what each captured launch carried before the
workspace stopped zeroing per launch), and the best global split-K plan of each split count (2, 3, 4)
at 128 x 128 and at any tile. Records: the engine-broad schema (suite "streamk-probe").
``--precompile-tests`` also compiles the plans of tests/test_engine2_gpu.py in the pool (so the GPU tests
that follow read the disk cache).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import torch

from gemmlab import engine2, planner
from gemmlab.bench import check_candidates, git_sha
from gemmlab.gpu import gpu_info
from gemmlab.timer import sets_for, time_interleaved

sys_path = Path(__file__).resolve().parent
sys.path.insert(0, str(sys_path))  # engine_broad by its module name: its pool pickles engine_broad._compile
import engine_broad  # noqa: E402

SHAPES = "512,1024,4096;512,1024,8192;1536,1024,4096;256,512,2048;256,2560,9728;1024,768,3072;640,2048,2048;64,4096,3584"


def probe_plans(M: int, N: int, K: int, prof) -> dict[str, planner.Plan]:
    cands = planner.candidates(M, N, K, profile=prof, schedules=planner.SCHEDULES)
    out = {"model": planner.candidates(M, N, K, profile=prof)[0]}
    for sched in ("data_parallel", "stream_k", "split_k"):
        alt = next((c for c in cands if c.schedule == sched), None)
        if alt is not None:
            out[f"best {sched}"] = alt
    for s in range(2, planner.MAX_GLOBAL_SPLITS + 1):
        for name, ok in ((f"gsk x{s} 128x128", lambda c: (c.bm, c.bn) == (128, 128)), (f"gsk x{s}", lambda c: True)):
            alt = next((c for c in cands if c.schedule == "split_k_global" and c.splits == s and ok(c)), None)
            if alt is not None and alt not in out.values():
                out[name] = alt
    return out


def test_plans() -> list[planner.Plan]:
    sys.path.insert(0, str(sys_path.parent / "tests"))  # the test module's helpers (fakes)
    spec = importlib.util.spec_from_file_location("t", sys_path.parent / "tests" / "test_engine2_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    plans = []
    for shape, bm, bn, sched, kw in mod.CASES:
        for c in planner.candidates(*shape, schedules=planner.SCHEDULES, **kw):
            if (c.bm, c.bn, c.schedule) == (bm, bn, sched):
                plans.append(c)
                break
    return plans


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "benchmarks/results"), "streamk_probe.jsonl"))
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replay-ms", type=float, default=3.0)
    ap.add_argument("--precompile-tests", action="store_true")
    ap.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    info = gpu_info()
    prof = engine2._profile(torch.device("cuda"))
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
    per = [(s, probe_plans(*s, prof)) for s in shapes]
    extra = test_plans() if args.precompile_tests else []
    engine_broad.precompile([p for _, ps in per for p in ps.values()] + extra, args.workers)
    sha = git_sha()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for M, N, K in [s for s, _ in per]:
        plans = dict(per[[s for s, _ in per].index((M, N, K))][1])
        n_sets = max(1, min(sets_for(2 * (M * K + N * K + M * N), info.l2_bytes), 16))
        sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16().t(),
                 torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
        ref = sets[0][0].float() @ sets[0][1].float()
        runs = {name: (lambda i, pl=pl: engine2.launch(pl, *sets[i])) for name, pl in plans.items()}
        if "best stream_k" in plans:
            sk = plans["best stream_k"]

            def zero_then_launch(i, pl=sk):  # the flags fill each captured launch carried before
                engine2.workspace(pl, sets[i][0].device)[1].zero_()
                engine2.launch(pl, *sets[i])

            runs["best stream_k + fill"] = zero_then_launch
            plans["best stream_k + fill"] = sk
        cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1], out=sets[i][2])}
        passing, errors = check_candidates(runs, sets[0][2], ref)
        cands.update(passing)
        res = time_interleaved(cands, n_sets, rounds=args.rounds, replay_ms=args.replay_ms)
        base = res.timings["torch"].median_ms
        print(f"{M}x{N}x{K}: torch {base * 1e3:.1f} us", flush=True)
        with open(args.out, "a") as f:
            for name in runs:
                pl = plans[name]
                t = res.timings[name].median_ms if name in res.timings else None
                rec = {"suite": "streamk-probe", "case": f"{M}x{N}x{K}", "cls": "adhoc", "M": M, "N": N, "K": K,
                       "candidate": name, "time_ms": t, "baseline": "torch.mm", "baseline_ms": base,
                       "ratio": base / t if t else None, "rel_error": errors[name], "correct": t is not None,
                       "sm_clock_mhz": res.clocks.sm_mhz,
                       "kernel_sm_clock_mhz": res.clocks_by_name[name].sm_mhz if name in res.clocks_by_name else None,
                       "gpu": info.name, "sm_count": info.sm_count, "git_sha": sha, "torch": torch.__version__,
                       "plan": repr(pl), "bm": pl.bm, "bn": pl.bn, "schedule": pl.schedule, "splits": pl.splits,
                       "sk_tiles": pl.sk_tiles, "sk_ctas": pl.sk_ctas, "stages": pl.stages, "grid": pl.grid,
                       "predicted_ms": pl.predicted_s * 1e3}
                f.write(json.dumps(rec) + "\n")
                print(f"  {name:24s} " + (f"{t * 1e3:7.2f} us  x{base / t:.3f}  pred {pl.predicted_s * 1e6:5.1f}"
                                          if t else f"WRONG {errors[name]}") + f"  {pl.bm}x{pl.bn} "
                      f"{pl.schedule} s{pl.splits} {pl.sk_tiles}/{pl.sk_ctas}", flush=True)
    print(f"done in {time.perf_counter() - T0:.0f} s")


T0 = time.perf_counter()
if __name__ == "__main__":
    main()
