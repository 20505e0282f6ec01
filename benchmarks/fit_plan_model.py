"""Check gemmlab.plan_cost against the committed records, or fit it to the broad set (CPU only).

    PYTHONPATH=src python3 benchmarks/fit_plan_model.py [--set launch_s=2e-6 ...]
    PYTHONPATH=src python3 benchmarks/fit_plan_model.py --broad [--fit [--only NAME ...]] [--sha SHA ...]
    PYTHONPATH=src python3 benchmarks/fit_plan_model.py --route [--decode] [--set h11_factor=1.04]

``--route``: ``engine.route``'s choice on the records of both broad runs (ac16df0, f55b3b5), per run and
half of the shapes (the same even / odd split over both runs' shapes): the routed kernel's measured ratio
to torch.mm (geomean, share >= 1.0, min) and its loss against the best of the kernels it weighs (the
decode kernel, h11, the engine kernel's measured plan the model ranks first), for the decode rule before
("always": wherever use_decode allows it) and now ("priced"). ``--decode`` first fits the decode kernel's
price (``decode.cost_s``'s four ``DeviceProfile.decode_*`` constants) on the fit half and prints it.

``--broad``: the engine kernel's own records (``engine_broad.jsonl.gz``, by default the two newest runs,
``BROAD_SHAS``: per shape the model's plan and a few others, h11 and the decode kernel), split by shape into a fit half (even positions of the
sorted distinct shapes) and a held-out half (odd). Prints, per half, mean |log measured / predicted| over
every new-kernel record, and how far the model's pick among each shape's measured plans runs behind the
best of them (geomean, worst; the pick as the planner ranks them, ``planner.rank_key``); then h11's
records priced as engine-kernel plans (``h11_cost``), ``h11_factor`` fitted to them, and the router's
choice against the best measured candidate (``pick_vs_oracle.report``). ``--fit``: coordinate descent over
the profile constants of ``FIT_NAMES`` (or ``--only`` some of them) on the fit half (loss = mean |log| + 2 log(pick geomean) + 0.5 log(pick worst)),
printing the fitted values to copy into ``gemmlab.devices``.

Without ``--broad``: h11's older records, as below.

The engine kernel keeps h11's k-loop and epilogue, so h11's records are the plan model's calibration
set: ``engine_policies.jsonl`` (every (BN, splits) plan of the few-tile shapes, runs with cluster split-K, timed against torch.mm)
and the engine's own plans in ``matmul.jsonl`` (llm suite at sha 090adea, squares at 0f8f206). Each
record is predicted as a BM = 128 plan at the record's SM clock; the script prints measured / predicted
per record class, and for each engine_policies shape how far the plan the model ranks first among the
measured ones is from the best measured (the "picks well" measure of issue 14).
``--set NAME=VALUE`` overrides a DeviceProfile constant, to try a fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
from collections import defaultdict
from pathlib import Path

import pick_vs_oracle
from gemmlab import plan_cost, planner
from gemmlab.record_files import load_records
from gemmlab.devices import H200

RESULTS = Path(__file__).resolve().parent / "results"
BM = 128


def h11_stages(bn: int, split: bool) -> int:
    """h11's ring depth (engine._qsize): as many 128 x bn stages as fit beside its slabs, up to 9."""
    slabs = 0 if split else 2 * 2 * 64 * 64 * 2
    for q in range(9, 1, -1):
        if q * (BM + bn) * 64 * 2 + slabs + 1024 <= 227 * 1024 - 256:
            return q
    return 1


def predict(r: dict, bn: int, splits: int, prof) -> float:
    sched = "split_k" if splits > 1 else "data_parallel"
    return plan_cost.predict_s(r["M"], r["N"], r["K"], bm=BM, bn=bn, schedule=sched, stages=h11_stages(bn, splits > 1),
                               splits=splits, prof=prof, clock_mhz=r.get("sm_clock_mhz") or prof.plan_clock_mhz)


# Runs of engine_policies with today's split-K (clusters reducing through DSMEM, sha 4fc772e on); the
# earlier ones reduced through an L2 workspace.
CLUSTER_SPLIT_SHAS = {"4fc772e", "227f35c", "0f8f206", "6ea410a", "090adea"}


def policy_records():
    for line in open(RESULTS / "engine_policies.jsonl"):
        r = json.loads(line)
        if r.get("git_sha") not in CLUSTER_SPLIT_SHAS:
            continue
        m = re.fullmatch(r"BN=(\d+),splits=(\d+)", r["config"])
        if m:
            yield r, int(m.group(1)), int(m.group(2))


def engine_records():
    """The engine's own h11 plans in the llm (090adea) and square (0f8f206) suites: M > 32 (the decode
    kernel ran the rest), plan as engine.choose_plan made it."""
    from gemmlab import engine

    for line in open(RESULTS / "matmul.jsonl"):
        r = json.loads(line)
        if (r.get("git_sha"), r.get("suite")) in (("090adea", "llm"), ("0f8f206", "square")) and r["M"] > 32:
            bn, splits = engine.choose_plan(r["M"], r["N"], r["K"], 132)
            yield r, bn, splits


FIT_NAMES = ("launch_s", "tile_fixed_s", "store_bytes_per_s", "direct_store_bytes_per_s", "engine_l2_bytes_per_s",
             "sm_l2_bytes_per_s", "l2_latency_s", "hbm_latency_s", "cluster_sync_s", "dsmem_bytes_per_s",
             "partial_bytes_per_s", "smem_bytes_per_clk", "engine_mma_efficiency", "one_consumer_efficiency",
             "hbm_read_bytes_per_s", "stream_k_fixed_s", "split_k_kstep_factor", "stream_k_kstep_factor",
             "hbm_stream_bytes_per_s", "hbm_stream_latency_s")
# The two newest broad runs: together all 297 shapes, timed with the same bf16 engine code (240cc15: 180
# shapes, 6417c0c: the other 117). ac16df0 (the first full run, the fit before) is older code.
BROAD_SHAS = ("240cc1560ab0", "6417c0cb0f7a")
BROAD_SHA = BROAD_SHAS


def broad_records(sha: str | tuple = BROAD_SHAS) -> tuple[list[dict], set]:
    """The broad set's records with a time of one run (a sha) or several (a tuple of shas), and the fit
    half's shapes (even positions of the sorted distinct shapes)."""
    shas = (sha,) if isinstance(sha, str) else tuple(sha)
    recs = [r for r in load_records(RESULTS / "engine_broad.jsonl.gz")
            if r.get("git_sha") in shas and r.get("time_ms")]
    shapes = sorted({(r["M"], r["N"], r["K"]) for r in recs})
    return recs, {s for i, s in enumerate(shapes) if i % 2 == 0}


def _clock(r: dict) -> float:
    return r.get("kernel_sm_clock_mhz") or r["sm_clock_mhz"]


def broad_eval(recs: list[dict], half: set, prof, per_run: bool = False) -> dict:
    """Mean |log measured / predicted| (each record priced at its kernel's clock) and the pick's loss
    (geomean, worst) over the shapes in ``half``: the plan the planner would rank first among a shape's
    measured plans of the schedules it offers (priced at the planning clock, ties broken as
    ``planner.rank_key``) against the best of them. ``per_run``: each (shape, run) on its own, its pick
    against the best of that run's plans (several runs' records of a shape are not compared across runs,
    whose clocks differ)."""
    logs, by = [], defaultdict(list)
    for r in recs:
        s = (r["M"], r["N"], r["K"])
        if s not in half or r.get("bm") is None:
            continue
        ks = pick_vs_oracle.kernel_problem(s, r)  # a swapped plan tiles N x M x K
        t = pick_vs_oracle.price(s, r, prof, _clock(r))
        logs.append(abs(math.log(r["time_ms"] * 1e-3 / t)))
        if r["schedule"] not in planner.OFFERED_SCHEDULES:  # timed beside, never picked: not a candidate
            continue
        key = planner.rank_key(pick_vs_oracle.price(s, r, prof), ks[0], r["schedule"], r["splits"], r["bm"], r["bn"],
                               r["stages"], ctas=pick_vs_oracle.streaming_ctas(s, r))
        by[(s, r["git_sha"]) if per_run else s].append((key, r["time_ms"]))
    loss = [min(v)[1] / min(m for _, m in v) for v in by.values() if len(v) > 1 or not per_run]
    return {"abs_log": statistics.fmean(logs), "pick_gm": math.exp(statistics.fmean(map(math.log, loss))),
            "pick_worst": max(loss), "records": len(logs), "shapes": len(loss)}


def _objective(recs, half, prof, per_run: bool = False) -> float:
    e = broad_eval(recs, half, prof, per_run)
    return e["abs_log"] + 2 * math.log(e["pick_gm"]) + 0.5 * math.log(e["pick_worst"])


def fit(recs, half, prof, rounds: int = 6, names=FIT_NAMES, per_run: bool = False):
    """Coordinate descent: each constant of ``names`` in turn scaled by the factor that lowers the loss most."""
    best = _objective(recs, half, prof, per_run)
    for _ in range(rounds):
        for name in names:
            for f in (0.5, 0.7, 0.85, 0.93, 1.07, 1.18, 1.4, 2.0):
                v = getattr(prof, name) * f
                if (name.endswith("efficiency") and v > 1) or (name.endswith("factor") and v < 1):
                    continue
                q = dataclasses.replace(prof, **{name: v})
                if q.hbm_latency_s < q.l2_latency_s:  # a load from HBM is never quicker than an L2 hit
                    continue
                o = _objective(recs, half, q, per_run)
                if o < best - 1e-4:
                    best, prof = o, q
    return prof


def h11_rows(recs: list[dict], prof):
    """(shape, measured h11 time, h11's plan priced by plan_cost (without h11_factor)) for the records whose
    engine candidate ran h11 (not the decode kernel): h11's plan is a 128-row data-parallel or split-K
    plan of the model with h11's ring depth and, where h11 overlaps its epilogue, ``overlap``."""
    from gemmlab import engine

    for r in recs:
        ran = r.get("kernel", "decode" if engine.decode_shape(r["M"], r["N"], r["K"]) else "h11")
        if not (r["candidate"] == "h11" or (r["candidate"] == "engine" and ran == "h11")):
            continue
        s = (r["M"], r["N"], r["K"])
        yield s, r["time_ms"] * 1e-3, engine.h11_cost(*s, prof=prof, clock_mhz=_clock(r))


def broad_main(args) -> None:
    recs, train = broad_records(args.sha)
    held = {(r["M"], r["N"], r["K"]) for r in recs} - train
    prof = dataclasses.replace(H200, **{k: float(v) for k, v in (s.split("=") for s in args.set)})
    for name, half in (("fit", train), ("held-out", held)):
        print(f"{name:9s} (profile as given) {broad_eval(recs, half, prof, args.per_run)}")
    if args.fit:
        names = args.only or FIT_NAMES
        prof = fit(recs, train, prof, names=names, per_run=args.per_run)
        for name in names:
            print(f"  {name} = {getattr(prof, name):.4g}")
        for name, half in (("fit", train), ("held-out", held)):
            print(f"{name:9s} (fitted) {broad_eval(recs, half, prof, args.per_run)}")
    rows = list(h11_rows(recs, prof))
    for name, half in (("fit", train), ("held-out", held)):
        xs = [m / p for s, m, p in rows if s in half]
        print(f"{name:9s} h11 measured / priced: geomean {statistics.geometric_mean(xs):.3f} "
              f"mean |log| {statistics.fmean(abs(math.log(x)) for x in xs):.3f} ({len(xs)} shapes)")
    factor = statistics.geometric_mean([m / p for s, m, p in rows if s in train])
    print(f"h11_factor (fit half) = {factor:.3f}; the router with it (benchmarks/pick_vs_oracle.py):")
    pick_vs_oracle.report(pick_vs_oracle.load(tuple(args.sha)), dataclasses.replace(prof, h11_factor=factor),
                          worst=3)


# The router on the records of both broad runs (``--route``, ``--decode``) ---------------------------------

ROUTE_SHAS = ("ac16df0070a2", "f55b3b567247")


def route_cases(shas=ROUTE_SHAS) -> dict:
    """{sha: {shape: {"decode" | "h11" | "new": ...}}}: per shape the decode kernel's record (where the old
    route ran it), h11's record (``engine`` where it ran h11, else ``h11`` timed beside the engine kernel)
    and the engine kernel's records (every plan measured)."""
    from gemmlab import engine

    by = defaultdict(lambda: defaultdict(dict))
    for r in load_records(RESULTS / "engine_broad.jsonl.gz"):
        if r.get("git_sha") in shas and r.get("time_ms"):
            by[r["git_sha"]][(r["M"], r["N"], r["K"])][r["candidate"]] = r
    out = {}
    for sha, shapes in by.items():
        out[sha] = {}
        for s, c in shapes.items():
            e = c.get("engine")
            if e is None:
                continue
            ran = e.get("kernel", "decode" if engine.decode_shape(*s) else "h11")
            d = {"new": [r for k, r in c.items() if r.get("bm") is not None and k != "engine"]}
            if ran in ("decode", "h11"):
                d[ran] = e
            if "h11" in c:
                d["h11"] = c["h11"]
            if "decode" in c:
                d["decode"] = c["decode"]
            out[sha][s] = d
    return out


def halves(cases: dict) -> tuple[set, set]:
    """The fit half (even positions of the sorted distinct shapes of all runs) and the held-out half."""
    shapes = sorted({s for d in cases.values() for s in d})
    fit = {s for i, s in enumerate(shapes) if i % 2 == 0}
    return fit, set(shapes) - fit


_price = pick_vs_oracle.price  # a record priced at the planning clock


def decode_rows(cases: dict, sm_count: int = 132):
    """(shape, sha, decode record, the engine kernel's measured plan the model ranks first) where both ran,
    and the decode record's plan is today's ``decode.plan`` where the record names it (``decode_plan``, from
    session 48; older records do not, and are taken as they are): ``decode_features`` prices today's plan,
    so a time of another plan would be fitted to the wrong features."""
    from gemmlab import decode

    for sha, shapes in cases.items():
        for s, d in shapes.items():
            if "decode" not in d or not d["new"]:
                continue
            ran = d["decode"].get("decode_plan")
            if ran is not None and ran != repr(decode.plan(*s, sm_count)):
                continue
            yield s, sha, d["decode"], min(d["new"], key=lambda r: _price(s, r, H200))


def decode_features(s, sm_count: int = 132) -> tuple[float, float, float, float, float]:
    """(1, NT, weight bytes over the plan's fill, those bytes x (NT - 1), the split-K fix-up as
    decode.plan_time prices it): ``decode.cost_s`` is their dot product with (decode_fixed_s,
    decode_token_tile_s, 1 / decode_hbm_bytes_per_s, decode_token_stream_share / decode_hbm_bytes_per_s,
    decode_fixup_factor)."""
    from gemmlab import decode

    p = decode.plan(*s, sm_count)
    weight_bytes, _, fixup, _, _ = decode._terms(*s, sm_count, p.rw, p.splits, p.variant)
    return 1.0, float(p.nt), weight_bytes, weight_bytes * (p.nt - 1), fixup


def fit_decode(rows) -> dict:
    """Least squares of the decode records' times on ``decode_features``, each weighted by 1 / its time (a
    relative fit: a 3 us shape counts as much as a 50 us one)."""
    import numpy as np

    X = np.array([decode_features(s) for s, *_ in rows])
    y = np.array([d["time_ms"] * 1e-3 for _, _, d, _ in rows])

    A = X / y[:, None]
    scale = np.abs(A).max(axis=0)  # columns of 1 .. 1e13: scaled, or lstsq's cutoff drops the small ones
    used = scale > 0  # no split plan among the records: the fix-up's factor stays as it is
    c = np.zeros(X.shape[1])
    c[used] = np.linalg.lstsq(A[:, used] / scale[used], np.ones_like(y), rcond=None)[0] / scale[used]
    out = {"decode_fixed_s": c[0], "decode_token_tile_s": c[1], "decode_hbm_bytes_per_s": 1.0 / c[2],
           "decode_token_stream_share": c[3] / c[2], "decode_fixup_factor": c[4]}
    if not used[4]:
        del out["decode_fixup_factor"]
    return out


def routed(s, d: dict, prof, decode_rule: str = "priced") -> dict | None:
    """The record of what the router's rule runs for shape ``s`` (the engine kernel: its measured plan the
    model ranks first), or None where that kernel has no record. ``decode_rule`` "always": the rule before
    this change (the decode kernel wherever use_decode allows it); "priced": ``engine.route``'s own choice
    between the decode and the engine kernel, on meta tensors with ``prof`` (it weighs the engine kernel as
    the router does: up to 32 tokens at its best plain plan's price, not at the measured plan's)."""
    from gemmlab import engine

    new = min(d["new"], key=lambda r: _price(s, r, prof)) if d["new"] else None
    if engine.decode_shape(*s):
        priced_in = new is not None and pick_vs_oracle.router(s, prof).kernel == "decode"
        if decode_rule == "always" or priced_in:
            return d.get("decode")
    if new is None:
        return None
    h11_s = prof.h11_factor * engine.h11_cost(*s, prof=prof, direct=(s[1] * 2) % 16 != 0)
    return new if _price(s, new, prof) < h11_s else d.get("h11")


def route_report(prof, decode_rule: str, cases: dict, halves_: tuple[set, set]) -> None:
    """Per run and half: the routed choice's measured ratio to torch.mm over the shapes where every kernel it
    weighs has a record (geomean, share >= 1.0, min), and its loss against the best of those kernels."""
    gm = lambda xs: math.exp(statistics.fmean(map(math.log, xs)))  # noqa: E731
    for sha, shapes in sorted(cases.items()):
        for name, half in zip(("fit", "held-out", "all"), (*halves_, halves_[0] | halves_[1])):
            got, best = [], []
            for s, d in shapes.items():
                if s not in half:
                    continue
                r = routed(s, d, prof, decode_rule)
                if r is None:
                    continue
                new = min(d["new"], key=lambda x: _price(s, x, prof)) if d["new"] else None
                options = [x for x in (d.get("decode"), d.get("h11"), new) if x is not None]
                got.append(r["ratio"])
                best.append(max(x["ratio"] for x in options))
            loss = [g / b for g, b in zip(got, best)]
            print(f"  {sha[:7]} {name:8s} routed {gm(got):.3f} >=1.0 {sum(x >= 1 for x in got) / len(got):4.0%} "
                  f"min {min(got):.3f}; routed / best of the weighed kernels: geomean {gm(loss):.4f} worst "
                  f"{min(loss):.3f} ({len(got)} shapes)")


def route_main(args) -> None:
    cases = route_cases(tuple(args.route_sha))
    fit_half, held = halves(cases)
    prof = dataclasses.replace(H200, **{k: float(v) for k, v in (s.split("=") for s in args.set)})
    if args.decode:
        rows = list(decode_rows(cases))
        for name, half in (("fit", fit_half), ("all", fit_half | held)):
            c = fit_decode([r for r in rows if r[0] in half])
            print(f"decode constants fitted on {name} ({sum(r[0] in half for r in rows)} records): "
                  + ", ".join(f"{k} = {v:.4g}" for k, v in c.items()))
        for name, half in (("fit", fit_half), ("held-out", held)):
            xs = [d["time_ms"] * 1e-3 / decode_cost(s, prof) for s, _, d, _ in rows if s in half]
            print(f"{name:8s} decode measured / priced: geomean {statistics.geometric_mean(xs):.3f}, mean |log| "
                  f"{statistics.fmean(abs(math.log(x)) for x in xs):.3f} ({len(xs)} records)")
    for rule in ("always", "priced"):
        print(f"decode rule {rule!r} (h11_factor {prof.h11_factor}):")
        route_report(prof, rule, cases, (fit_half, held))


def decode_cost(s, prof) -> float:
    from gemmlab import decode

    return decode.cost_s(*s, prof.sm_count, prof)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", nargs="*", default=[], help="NAME=VALUE overrides of DeviceProfile constants")
    p.add_argument("--broad", action="store_true", help="the broad set's records (engine_broad.jsonl.gz)")
    p.add_argument("--fit", action="store_true", help="with --broad: fit the constants on the fit half")
    p.add_argument("--sha", nargs="+", default=list(BROAD_SHAS), help="with --broad: the runs' git_shas")
    p.add_argument("--only", nargs="+", choices=FIT_NAMES, help="with --fit: fit only these constants")
    p.add_argument("--per-run", action="store_true",
                   help="with --broad: score each (shape, run)'s pick within its run (several --sha runs)")
    p.add_argument("--route", action="store_true", help="the router's choice on both broad runs' records, by half")
    p.add_argument("--decode", action="store_true", help="with --route: fit the decode kernel's price first")
    p.add_argument("--route-sha", nargs="+", default=list(ROUTE_SHAS), help="with --route: the broad runs' git_shas")
    args = p.parse_args()
    if args.route:
        route_main(args)
        return
    if args.broad:
        broad_main(args)
        return
    prof = dataclasses.replace(H200, **{k: float(v) for k, v in (s.split("=") for s in args.set)})
    ratios = defaultdict(list)
    by_shape = defaultdict(dict)
    for r, bn, splits in policy_records():
        ratios["policies split" if splits > 1 else "policies unsplit"].append(r["time_ms"] * 1e-3 / predict(r, bn, splits, prof))
        by_shape[(r["M"], r["N"], r["K"], r.get("git_sha"))][(bn, splits)] = (r["time_ms"], predict(r, bn, splits, prof))
    for r, bn, splits in engine_records():
        ratios[f"engine {r['suite']}"].append(r["time_ms"] * 1e-3 / predict(r, bn, splits, prof))
    print("measured / predicted (geomean, min, max, n):")
    for k, xs in sorted(ratios.items()):
        print(f"  {k:18s} {statistics.geometric_mean(xs):.3f}  {min(xs):.3f}  {max(xs):.3f}  {len(xs)}")
    losses = []
    for shape, plans in sorted(by_shape.items(), key=lambda kv: kv[0][:3]):
        if len(plans) < 2:
            continue
        best = min(t for t, _ in plans.values())
        pick = min(plans.items(), key=lambda kv: kv[1][1])
        losses.append(pick[1][0] / best)
        print(f"  {shape[0]}x{shape[1]}x{shape[2]} @{shape[3]}: model picks {pick[0]} at {pick[1][0] * 1e3:.1f} us, "
              f"best measured {best * 1e3:.1f} us ({pick[1][0] / best:.3f})")
    print(f"picked / best measured: geomean {math.exp(statistics.fmean(map(math.log, losses))):.3f}, "
          f"worst {max(losses):.3f} over {len(losses)} shape runs")


if __name__ == "__main__":
    main()
