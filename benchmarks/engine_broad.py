"""Time the engine kernel on the broad shape set: the plan model's plan and a few other plans of the new
kernel, the current engine (h11, ``gemmlab.engine``) and torch.mm, interleaved in one process per shape.

    PYTHONPATH=src python3 benchmarks/engine_broad.py --out $OUT/engine_broad.jsonl [--limit 40]
        [--shapes "2040,3584,3584;512,1024,4096"] [--classes mid,unaligned] [--budget-s 300]
        [--tiles 64x160,64x208 --max-m 1536] [--swap-any --min-m 65] [--swap-twin]

Shapes come from ``benchmarks/shapes/broad.json`` (``gemmlab.broad_shapes``), spread over the set in a
fixed order when ``--limit`` takes a subset. Per shape the candidates are: ``model`` (``plan()``'s pick),
the model's best plan of each other schedule, its best plan with another tile height, ``engine`` (what
``gemmlab.matmul`` runs through ``engine.gemm``: ``engine.route``'s choice of the decode kernel, h11 or
the engine kernel; its record says which), and ``torch`` (torch.mm on the same operands, TN:
``a @ w.t()``), ``h11`` (h11's plan, where the router runs the engine kernel: what ran there before
the router), and ``decode`` (the decode kernel, where the router priced it and chose another kernel).
Every engine-kernel candidate runs through the prepared launch ``gemmlab.matmul`` uses (``engine.gemm(...,
plan=)``: programmatic dependent launch included), so plans compare as users run them. Inputs are fresh
randn, rotated over sets of 2x the L2; every candidate is checked against an fp32 reference before it is
timed (``gemmlab.timer``: graph replays, interleaved rounds, per-candidate SM clocks). One JSON line per
(shape, candidate): git sha, GPU, clocks, shape and class, the plan and its predicted time, the measured
time, torch's, the ratio and whether PDL was on. Every instantiation is compiled up front in a process pool
(the disk cache then serves the timing process). Shapes run in a fixed shuffled order, and
``--budget-s`` stops between shapes, so a cut-short run still covers every class.

``--out`` (default ``$OUT/engine_broad.jsonl``; required where ``$OUT`` is unset) gets plain JSON lines. The
committed records are ``benchmarks/results/engine_broad.jsonl.gz``, kept gzipped (~1.6 MB a run uncompressed);
a run is added to them as one more gzip member, as the script prints at the end:

    gzip -c $OUT/engine_broad.jsonl >> benchmarks/results/engine_broad.jsonl.gz
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import os
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch

from gemmlab import decode, engine, engine2
from gemmlab import planner
from gemmlab.bench import check_candidates, git_sha
from gemmlab.broad_shapes import classify
from gemmlab.gpu import gpu_info
from gemmlab.record_files import load_records
from gemmlab.timer import sets_for, time_interleaved
from gemmlab.jit import launch

SHAPES = Path(__file__).resolve().parent / "shapes" / "broad.json"


def load_cases(args) -> list[dict]:
    cases = json.loads(SHAPES.read_text())["cases"]
    if args.shapes:
        want = [tuple(int(x) for x in s.split(",")) for s in args.shapes.split(";")]
        known = {(c["M"], c["N"], c["K"]): c for c in cases}
        # a shape outside the set gets the set's class for its size (decode, mid, prefill, unaligned)
        cases = [known.get(w) or {"name": "x".join(map(str, w)), "M": w[0], "N": w[1], "K": w[2], "cls": classify(*w),
                                  "family": "adhoc", "source": "adhoc"} for w in want]
    if args.classes:
        cases = [c for c in cases if c["cls"] in args.classes.split(",")]
    if args.limit and len(cases) > args.limit:  # an even spread over the (sorted) set
        step = len(cases) / args.limit
        cases = [cases[int(i * step)] for i in range(args.limit)]
    if args.skip_measured:  # PATH@SHA: complete a run the budget cut short
        path, sha = args.skip_measured.rsplit("@", 1)
        done = {(r["M"], r["N"], r["K"]) for r in load_records(path)
                if r.get("candidate") == "engine" and r.get("git_sha", "").startswith(sha)}
        cases = [c for c in cases if (c["M"], c["N"], c["K"]) not in done]
    if not args.shapes:  # a fixed shuffle: a run the time budget cuts short still samples every class
        random.Random(14).shuffle(cases)
    return cases


def candidate_plans(M: int, N: int, K: int, profile, tiles=(), swap_any: bool = False,
                    alt_profile=None, alt_consts: dict | None = None) -> dict[str, planner.Plan]:
    """name -> plan: the model's pick (and the best plain plan, "plain", where the pick is swapped; "no evict":
    the pick without ``Plan.evict_weight`` where it has it, "evict": with it where only the weight's size
    (``planner.EVICT_WEIGHT_ABOVE_ELEMENTS``) left it off), the best
    of each other schedule (without B multicast), the best with
    B multicast where it is offered, the best of another tile height,
    and the model's best offered plan of each tile in ``tiles`` ((bm, bn) pairs; candidate "tile BMxBN");
    ``swap_any``: the best swapped plans of any token count (``swapped_plans``); ``alt_profile`` and
    ``alt_consts`` ({gemmlab.planner constant: value}): the pick under that profile and those constants ("alt":
    e.g. the constants before a change, ``--alt NAME=VALUE``)."""
    cands = planner.candidates(M, N, K, profile=profile, schedules=planner.SCHEDULES)
    offered = planner.candidates(M, N, K, profile=profile)
    best = offered[0]  # what the planner offers
    out = {"model": best}
    if best.swap_ab:  # the best plain plan beside a swapped pick
        alt = next((c for c in offered if not c.swap_ab), None)
        if alt is not None:
            out["plain"] = alt
    if best.evict_weight:  # the pick without its evict-first weight loads (Plan.evict_weight's A/B)
        out["no evict"] = dataclasses.replace(best, evict_weight=False)
    else:  # the hint left off for a small weight (planner.EVICT_WEIGHT_ABOVE_ELEMENTS): the pick with it
        pm, pn = (best.N, best.M) if best.swap_ab else (best.M, best.N)  # the kernel's problem
        if best.mcast == 1 and planner.weight_read_once(pm, pn, best.bm, best.bn, best.swap_ab):
            out["evict"] = dataclasses.replace(best, evict_weight=True)
    for bm, bn in tiles:
        alt = next((c for c in offered if (c.bm, c.bn) == (bm, bn) and not c.swap_ab), None)
        if alt is not None and alt != best:
            out[f"tile {bm}x{bn}"] = alt
    for sched in planner.SCHEDULES:
        if sched != best.schedule or best.mcast > 1:
            alt = next((c for c in cands if c.schedule == sched and c.mcast == 1), None)
            if alt is not None:
                out[f"best {sched}"] = alt
    # B multicast where the planner offers it: the best plan with it when the pick has none
    alt = next((c for c in offered if c.mcast > 1), None)
    if alt is not None and best.mcast == 1:
        out["best mcast"] = alt
    alt = next((c for c in cands if c.bm != best.bm and c.schedule == best.schedule and c.mcast == best.mcast), None)
    if alt is not None:
        out[f"best bm={alt.bm}"] = alt
    if swap_any:
        out.update(swapped_plans(M, N, K, profile, best))
    if alt_profile is not None or alt_consts:  # the pick under other constants ("alt"), where it differs
        with _benchmarks_module("changed_picks").planner_constants(alt_consts or {}):
            alt = planner.candidates(M, N, K, profile=alt_profile or profile)[0]
        if alt != best:
            out["alt"] = alt
    return out


def _benchmarks_module(name: str):
    """A sibling script of this folder imported as a module (also when this file runs through runpy)."""
    import importlib
    import sys

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def swapped_plans(M: int, N: int, K: int, profile, best: planner.Plan) -> dict[str, planner.Plan]:
    """The model's best swapped plan (out^T = W @ A^T: the tokens on the wgmma's n side) of each offered
    schedule at any M and over any number of token columns, which the planner offers only up to
    SWAP_PAD_MAX_M tokens and SWAP_PAD_COLUMNS columns (data-parallel): "swap <schedule>"."""
    keep = planner.SWAP_MAX_M, planner.SWAP_PAD_MAX_M, planner.SWAP_PAD_COLUMNS
    planner.SWAP_MAX_M = planner.SWAP_PAD_MAX_M = planner.SWAP_PAD_COLUMNS = 1 << 30
    planner._CACHE.clear()
    try:
        swapped = [c for c in planner.candidates(M, N, K, profile=profile, swap_ab=True) if c.swap_ab]
    finally:
        planner.SWAP_MAX_M, planner.SWAP_PAD_MAX_M, planner.SWAP_PAD_COLUMNS = keep
        planner._CACHE.clear()
    out = {}
    for sched in ("data_parallel", "pingpong", "stream_k", "split_k"):
        alt = min((c for c in swapped if c.schedule == sched), key=lambda c: c.predicted_s, default=None)
        if alt is not None and alt != best:
            out[f"swap {sched}"] = alt
    return out


def _compile(expr_plan: planner.Plan) -> str:
    engine2.compile_plan(expr_plan)
    return expr_plan.name_expression


def precompile(plans: list[planner.Plan], workers: int) -> None:
    unique = {p.name_expression: p for p in plans}
    t0 = time.perf_counter()
    # spawn: the parent has a CUDA context, and the workers only need NVRTC.
    with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, unique.values()))
    print(f"compiled {len(unique)} instantiations in {time.perf_counter() - t0:.1f} s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    out = os.environ.get("OUT")  # no default under benchmarks/results: a plain file there would sit beside the .gz
    p.add_argument("--out", default=out and os.path.join(out, "engine_broad.jsonl"), required=not out,
                   help="JSON lines appended here (default: $OUT/engine_broad.jsonl)")
    p.add_argument("--shapes", default=None, help="M,N,K;M,N,K (instead of the broad set)")
    p.add_argument("--classes", default=None, help="only these classes (decode,mid,prefill,square,unaligned)")
    p.add_argument("--limit", type=int, default=0, help="at most this many shapes, spread over the set")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--replay-ms", type=float, default=4.0)
    p.add_argument("--budget-s", type=float, default=300.0, help="stop starting shapes after this long")
    p.add_argument("--skip-measured", default=None, metavar="PATH@SHA",
                   help="skip shapes with an engine record of that git sha in PATH (finish a cut-short run)")
    p.add_argument("--tiles", default="", help="BMxBN,...: also time the model's best plan of each of these tiles")
    p.add_argument("--max-m", type=int, default=0, help="only shapes with M <= this")
    p.add_argument("--min-m", type=int, default=0, help="only shapes with M >= this")
    p.add_argument("--lean", action="store_true",
                   help="only the model's pick, the router's choice and the --tiles / --swap-any candidates")
    p.add_argument("--decode-beside", action="store_true",
                   help="with --lean: still time the decode kernel where the router priced it and chose another")
    p.add_argument("--alt", nargs="*", default=[], metavar="NAME=VALUE",
                   help="also time the pick under the profile with these constants (candidate 'alt'; a NAME in "
                        "capitals is a gemmlab.planner constant, none for None)")
    p.add_argument("--swap-twin", action="store_true",
                   help="plan with planner.SWAP_TWIN on: the swapped twin is the model's pick and the router's, "
                        "the plain pick it replaces is timed beside it ('plain')")
    p.add_argument("--swap-any", action="store_true",
                   help="also time the best swapped plan of each schedule at any M (swapped_plans)")
    p.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1))
    args = p.parse_args()
    if args.out.endswith(".gz"):
        p.error("--out takes a plain JSON-line file; add it to a .jsonl.gz with gzip -c OUT >> FILE.jsonl.gz")
    t_start = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.swap_twin:
        planner.SWAP_TWIN = True
    info = gpu_info()
    prof = engine2._profile(torch.device("cuda"))
    cases = [c for c in load_cases(args) if (not args.max_m or c["M"] <= args.max_m) and c["M"] >= args.min_m]
    tiles = [tuple(int(x) for x in t.split("x")) for t in args.tiles.split(",") if t]
    alt, alt_consts = _benchmarks_module("changed_picks").constants(args.alt, prof) if args.alt else (None, {})
    per_case = [(c, candidate_plans(c["M"], c["N"], c["K"], prof, tiles, args.swap_any, alt, alt_consts))
                for c in cases]
    if args.lean:
        per_case = [(c, {k: v for k, v in ps.items() if not k.startswith("best ")}) for c, ps in per_case]
    precompile([pl for _, ps in per_case for pl in ps.values()], args.workers)
    sha = git_sha()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    ratios: dict[str, list[float]] = {}
    best_loss = []
    for n, (case, plans) in enumerate(per_case):
        if time.perf_counter() - t_start > args.budget_s:
            print(f"budget reached after {n} of {len(per_case)} shapes", flush=True)
            break
        M, N, K = case["M"], case["N"], case["K"]
        n_sets = max(1, min(sets_for(2 * (M * K + N * K + M * N), info.l2_bytes), 16))
        sets = [(torch.randn(M, K, device="cuda").bfloat16(), torch.randn(N, K, device="cuda").bfloat16().t(),
                 torch.empty(M, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
        ref = sets[0][0].float() @ sets[0][1].float()
        # Every candidate through a prepared launch (engine.gemm: Engine2Launch), as gemmlab.matmul's route:
        # the same launch path, programmatic dependent launch included, so plans compare as users run them.
        runs = {name: (lambda i, pl=pl: engine.gemm(*sets[i], plan=pl)) for name, pl in plans.items()}
        runs["engine"] = lambda i: engine.gemm(*sets[i])
        route = engine.plan(M, N, K, sm_count=info.sm_count)
        if route.kernel == "engine" and not args.lean:  # what gemmlab.matmul ran before the router: h11's plan
            runs["h11"] = lambda i, h=route.h11: engine.gemm(*sets[i], plan=h)
        # Priced out by the router: the decode kernel beside it.
        if route.decode_s is not None and route.kernel != "decode" and (args.decode_beside or not args.lean):
            runs["decode"] = lambda i: engine.gemm(*sets[i], plan="decode")
        # The decode kernel's split where it ran (its records say which plan their time is of: the price's
        # refit, fit_plan_model.py --route --decode, keeps only those of today's plans).
        dplan = (repr(decode.plan(M, N, K, info.sm_count, decode.variant_for(sets[0][0], sets[0][1])))
                 if route.decode_s is not None else None)
        cands = {"torch": lambda i: torch.mm(sets[i][0], sets[i][1], out=sets[i][2])}
        passing, errors = check_candidates(runs, sets[0][2], ref)
        cands.update(passing)
        res = time_interleaved(cands, n_sets, rounds=args.rounds, replay_ms=args.replay_ms)
        base = res.timings["torch"].median_ms
        times = {k: t.median_ms for k, t in res.timings.items() if k != "torch"}
        line = f"[{n + 1}/{len(per_case)}] {M}x{N}x{K} {case['cls']:9s} torch {base * 1e3:8.1f} us"
        with open(args.out, "a") as f:
            for name in runs:
                pl = plans.get(name)
                t = times.get(name)
                rec = {"suite": "engine-broad", "case": case["name"], "cls": case["cls"], "family": case["family"],
                       "M": M, "N": N, "K": K, "candidate": name, "time_ms": t, "baseline": "torch.mm",
                       "baseline_ms": base, "ratio": base / t if t else None, "rel_error": errors[name],
                       "correct": t is not None, "sm_clock_mhz": res.clocks.sm_mhz,
                       "kernel_sm_clock_mhz": res.clocks_by_name[name].sm_mhz if name in res.clocks_by_name else None,
                       "gpu": info.name, "sm_count": info.sm_count, "git_sha": sha, "torch": torch.__version__,
                       "pdl": launch.PDL,  # the candidates' prepared launches: PDL unless GEMMLAB_PDL=0
                       "flush_bytes": res.flush_bytes}  # the timer's write before each replay (0: none)
                if name == "engine":
                    rec.update(route=repr(route), kernel=route.kernel)
                if name == "decode" or (name == "engine" and route.kernel == "decode"):
                    rec["decode_plan"] = dplan
                if pl is not None:
                    rec.update(plan=repr(pl), bm=pl.bm, bn=pl.bn, schedule=pl.schedule, splits=pl.splits,
                               sk_tiles=pl.sk_tiles, sk_ctas=pl.sk_ctas, stages=pl.stages, grid=pl.grid,
                               mcast=pl.mcast, predicted_ms=pl.predicted_s * 1e3)
                f.write(json.dumps(rec) + "\n")
                line += f" | {name} " + (f"x{base / t:.3f}" if t else "WRONG")
                if t:
                    ratios.setdefault(name, []).append(base / t)
        if "model" in times:
            best_loss.append(times["model"] / min(v for k, v in times.items() if k not in ("engine", "h11")))
        print(line, flush=True)
    print(f"{time.perf_counter() - t_start:.0f} s; ratios to torch.mm (geomean, min, share >= 1.0):")
    for name, xs in sorted(ratios.items()):
        gm = math.exp(statistics.fmean(map(math.log, xs)))
        print(f"  {name:22s} {gm:.3f}  {min(xs):.3f}  {sum(x >= 1.0 for x in xs) / len(xs):.0%}  ({len(xs)} shapes)")
    if best_loss:
        gm = math.exp(statistics.fmean(map(math.log, best_loss)))
        print(f"model plan / best measured new-kernel plan: geomean {gm:.3f}, worst {max(best_loss):.3f}")
    print(f"records in {args.out}; to keep them: gzip -c {args.out} >> benchmarks/results/engine_broad.jsonl.gz")


if __name__ == "__main__":
    main()
