"""The plan model's and the router's picks against the best measured candidate, on the broad set (CPU only).

    PYTHONPATH=src python3 benchmarks/pick_vs_oracle.py [--set NAME=VALUE ...] [--worst 6] [--changed]

Records: the broad runs in ``SHAS`` (240cc15, 180 shapes, and 6417c0c, the other 117, time all 297 shapes
with the same bf16 code; dc8faff, d107e97 and dd13e41, 290, 249 and 241 shapes, with ping-pong and global
split-K plans beside; 1b32f41 (swap AB, 64-row tiles 128..256 wide beside on the mid class) and 3e08f7d (B
multicast on misaligned rows), all 297 each; 0a9a13b, 933513a, bb0d0cc and 7b947dc, the later full runs
at the shipped defaults; plans pooled over the runs, the router's choice from the newest). Per shape they hold a few engine-kernel plans
(``model``: the pick then, ``best split_k`` / ``best stream_k`` / ``best data_parallel`` / ``best bm=..``),
``engine`` (what the router ran), ``h11`` and ``decode`` where timed beside. Every number is a measured
ratio to torch.mm (torch time / ours, > 1: we win), split into the fit half (even positions of the sorted
shapes, as ``fit_plan_model.py``) and the held-out half (odd). Printed per half and per class (decode,
mid, prefill, square, unaligned):

  * ``as run``: the router's choice as recorded (the ``engine`` candidate);
  * ``oracle``: the best measured candidate of any kernel;
  * ``route``: what ``engine.route`` itself chooses on meta tensors of the shape, planned with the profile
    given (``--set`` overrides constants; ``route(profile=)``): the decode kernel, h11 or the engine
    kernel's plan. Only a plan that was measured can be scored, so the route is scored on the shapes
    where its choice has a record, and the shapes where it has none are listed (they need a GPU). Until
    session 44 this script kept a copy of the router's rule, which had drifted from it (no weighing
    profile, no swapped plans priced as plain ones): it sent decode shapes the router runs on the decode
    kernel to the engine kernel;
  * ``route*``: the router's choice of kernel, with the engine kernel's plan the one the model ranks first
    among the shape's measured plans: scorable on every shape, the view ``fit_plan_model.py`` fits to.

``--worst`` lists, per class, the shapes where ``route*`` loses most against the oracle; ``--changed``
lists every shape whose route differs from the recorded one.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
from collections import defaultdict
from pathlib import Path

import torch

from gemmlab import engine, plan_cost, planner
from gemmlab.record_files import load_records
from gemmlab.devices import H200

RESULTS = Path(__file__).resolve().parent / "results"
SHAS = ("240cc1560ab0", "6417c0cb0f7a", "dc8faff37bbc", "d107e9759599", "dd13e41", "1b32f41", "3e08f7d",
        "0a9a13bf94bf", "933513a0d3e8", "bb0d0cc3aaae", "7b947dca92f3")
CLASSES = ("decode", "mid", "prefill", "square", "unaligned")


@dataclasses.dataclass(frozen=True)
class Case:
    """One shape's records: ``plans`` the engine kernel's (candidate -> record), ``h11`` / ``decode`` the
    other kernels' (None where not timed), ``ran`` the router's recorded choice, ``cls`` its class."""

    shape: tuple
    cls: str
    plans: dict
    h11: dict | None
    decode: dict | None
    ran: dict
    model: dict | None = None  # the newest run's record of the model's pick


def load(shas=SHAS) -> dict[tuple, Case]:
    """{(M, N, K): Case} over the runs ``shas``. A shape timed by several runs: the router's choice, h11 and
    the decode kernel from the newest; the engine kernel's plans pooled over all of them (each plan's
    newest record; ratios are to torch.mm in the same run, so they pool across the runs' clocks)."""
    by = defaultdict(dict)
    order = {sha: i for i, sha in enumerate(shas)}
    for r in load_records(RESULTS / "engine_broad.jsonl.gz"):
        if r.get("git_sha") in order and r.get("time_ms"):
            by[(r["M"], r["N"], r["K"])].setdefault(r["git_sha"], {})[r["candidate"]] = r
    cases = {}
    for s, runs in by.items():
        newest = sorted(runs, key=order.get)
        c = runs[newest[-1]]
        ran = c["engine"]
        h11 = c.get("h11") or (ran if ran.get("kernel") == "h11" else None)
        dec = c.get("decode") or (ran if ran.get("kernel") == "decode" else None)
        pooled = {}
        for sha in newest:  # older first: a newer record of the same plan replaces it
            for k, r in runs[sha].items():
                if k != "engine" and r.get("bm") is not None:
                    pooled[plan_key(r)] = (f"{k}@{sha[:7]}", r)
        plans = dict(pooled.values())
        cls = next(r["cls"] for r in c.values() if r.get("cls"))
        cases[s] = Case(s, cls, plans, h11, dec, ran, c.get("model"))
    return cases


def halves(shapes) -> tuple[set, set]:
    """The fit half (even positions of the sorted shapes) and the held-out half."""
    ordered = sorted(shapes)
    fit = {s for i, s in enumerate(ordered) if i % 2 == 0}
    return fit, set(ordered) - fit


def plan_key(p) -> tuple:
    """What identifies an engine-kernel plan (a ``planner.Plan`` or a record)."""
    get = (lambda k: getattr(p, k)) if isinstance(p, planner.Plan) else p.get
    swapped = p.swap_ab if isinstance(p, planner.Plan) else "swap AB" in (p.get("plan") or "")
    mcast = p.mcast if isinstance(p, planner.Plan) else mcast_of(p)
    return tuple(get(k) for k in ("bm", "bn", "schedule", "splits", "sk_tiles", "sk_ctas", "stages")) + (swapped, mcast)


def kernel_problem(s, r) -> tuple[int, int, int]:
    """The problem a record's plan tiles: (N, M, K) for a swap-AB plan (out^T = W @ A^T), else ``s``."""
    return (s[1], s[0], s[2]) if "swap AB" in (r.get("plan") or "") else tuple(s)


def streaming_ctas(s, r) -> float:
    """``planner.streaming_ctas`` of a record's plan (its CTAs loading, averaged over its waves)."""
    m, n, _ = kernel_problem(s, r)
    return planner.streaming_ctas(m, n, r["bm"], r["bn"], r["splits"], r.get("grid") or 132)


def mcast_of(r) -> int:
    """A record's B multicast (``Plan.mcast``; records before the field say it in the plan's repr)."""
    return r.get("mcast") or (2 if "B multicast" in (r.get("plan") or "") else 1)


def price(s, r, prof, clock_mhz: float | None = None) -> float:
    """A record's plan priced by ``plan_cost`` at ``clock_mhz`` (default: the planning clock; a swap-AB plan
    tiles N x M x K; the broad set's operands are contiguous and K-major, so their rows are K long)."""
    K = s[2]
    s = kernel_problem(s, r)
    return plan_cost.predict_s(*s, bm=r["bm"], bn=r["bn"], schedule=r["schedule"], stages=r["stages"],
                               splits=r["splits"], sk_tiles=r["sk_tiles"], sk_ctas=r["sk_ctas"], prof=prof,
                               clock_mhz=clock_mhz, direct=(s[1] * 2) % 16 != 0, mcast=mcast_of(r),
                               misaligned=plan_cost.misaligned_pitch(K))


@dataclasses.dataclass
class Choice:
    kernel: str  # "engine", "h11" or "decode"
    record: dict | None  # its measured record, None where that was never timed
    plan: object = None  # the engine kernel's plan (a planner.Plan or a record)


def meta_call(M: int, N: int, K: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, b, out) of a contiguous bf16 call as the broad set makes it (``a @ w.t()``), on the meta device."""
    meta = dict(dtype=torch.bfloat16, device="meta")
    return torch.empty(M, K, **meta), torch.empty(N, K, **meta).t(), torch.empty(M, N, **meta)


def router(shape, prof) -> engine.Route:
    """``engine.route`` on meta tensors of a contiguous bf16 call of ``shape``, planned with ``prof``."""
    return engine.route(*meta_call(*shape), bias=None, activation=None, has_c=False, sm_count=prof.sm_count,
                        profile=prof)


def route(case: Case, prof, measured_only: bool = False, routed: engine.Route | None = None) -> Choice:
    """``engine.route``'s choice for this shape's call planned with ``prof`` (no tuned plans): the router
    itself on meta tensors, so this replays what ``gemmlab.matmul`` would run. The engine kernel's plan:
    the router's, or with ``measured_only`` the one the planner ranks first among the shape's measured
    plans (the kernel stays the router's choice either way). ``routed``: ``router``'s answer, if at hand."""
    s = case.shape
    r = routed or router(s, prof)
    if r.kernel == "decode":
        return Choice("decode", case.decode)
    if r.kernel == "h11":
        return Choice("h11", case.h11)
    if not measured_only:
        return Choice("engine", {plan_key(x): x for x in case.plans.values()}.get(plan_key(r.plan)), r.plan)
    # among the schedules the planner offers (global split-K is timed, not offered)
    offered = [x for x in case.plans.values() if x["schedule"] in planner.OFFERED_SCHEDULES]

    def key(x):
        swapped = "swap AB" in (x.get("plan") or "")
        return planner.rank_key(price(s, x, prof), s[1] if swapped else s[0], x["schedule"], x["splits"],
                                x["bm"], x["bn"], x["stages"], ctas=streaming_ctas(s, x))

    rec = min(offered, key=key)
    # planner.SWAP_PREFER_M: at few tokens the best swapped plan runs unless it is stream-K
    swapped = sorted((x for x in offered if "swap AB" in (x.get("plan") or "")), key=key)
    if s[0] <= planner.SWAP_PREFER_M and swapped and swapped[0]["schedule"] != "stream_k":
        rec = swapped[0]
    return Choice("engine", rec, rec)


def oracle(case: Case) -> float:
    return max(r["ratio"] for r in (*case.plans.values(), case.h11, case.decode, case.ran) if r)


def gm(xs) -> float:
    return math.exp(statistics.fmean(map(math.log, xs))) if xs else float("nan")


def summary(xs) -> str:
    if not xs:
        return "-"
    return f"{gm(xs):.3f} {sum(x >= 1 for x in xs) / len(xs):4.0%} min {min(xs):.3f}"


def evaluate(cases: dict, prof) -> dict:
    """Per shape: as run, oracle, route (None where unmeasured) and route* ratios."""
    out = {}
    for s, c in cases.items():
        r = router(s, prof)
        full, lim = route(c, prof, routed=r), route(c, prof, measured_only=True, routed=r)
        out[s] = {"ran": c.ran["ratio"], "oracle": oracle(c), "route": full.record and full.record["ratio"],
                  "route*": lim.record["ratio"] if lim.record else None, "choice": full, "choice*": lim}
    return out


def report(cases: dict, prof, worst: int = 6, changed: bool = False) -> dict:
    ev = evaluate(cases, prof)
    fit, held = halves(cases)
    for name, half in (("fit", fit), ("held-out", held), ("all", fit | held)):
        rows = [ev[s] for s in half]
        scored = [e for e in rows if e["route"] is not None]
        print(f"{name:8s} ({len(half)} shapes) as run {summary([e['ran'] for e in rows])} | oracle "
              f"{summary([e['oracle'] for e in rows])} | route* {summary([e['route*'] for e in rows if e['route*']])}"
              f" | route {summary([e['route'] for e in scored])} on {len(scored)} measured, its oracle "
              f"{gm([e['oracle'] for e in scored]):.3f}, as run there {gm([e['ran'] for e in scored]):.3f}")
    print("per class (all shapes): as run / route* / oracle geomean; route* behind the oracle (geomean, worst)")
    for cls in CLASSES:
        ss = [s for s in cases if cases[s].cls == cls]
        ss = [s for s in ss if ev[s]["route*"] is not None]  # a kernel chosen that was not timed there
        loss = [ev[s]["route*"] / ev[s]["oracle"] for s in ss]
        print(f"  {cls:9s} {len(ss):3d} shapes: {gm([ev[s]['ran'] for s in ss]):.3f} / "
              f"{gm([ev[s]['route*'] for s in ss]):.3f} / {gm([ev[s]['oracle'] for s in ss]):.3f}; "
              f"behind {gm(loss):.3f}, worst {min(loss):.3f}")
        for s in sorted(ss, key=lambda s: ev[s]["route*"] / ev[s]["oracle"])[:worst]:
            c, ch = cases[s], ev[s]["choice*"]
            best = max((r for r in (*c.plans.values(), c.h11, c.decode) if r), key=lambda r: r["ratio"])
            print(f"    {s[0]}x{s[1]}x{s[2]}: route* {describe(ch)} {ev[s]['route*']:.3f}, best {name_of(c, best)} "
                  f"{best['ratio']:.3f}, as run {c.ran['ratio']:.3f}")
    unmeasured = [s for s in sorted(cases) if ev[s]["route"] is None]
    print(f"route's choice never measured on {len(unmeasured)} shapes:")
    for s in unmeasured:
        print(f"    {s[0]}x{s[1]}x{s[2]} ({cases[s].cls}): {describe(ev[s]['choice'])}")
    if changed:
        print("shapes whose route differs from the recorded one:")
        for s in sorted(cases):
            ch, ran = ev[s]["choice"], cases[s].ran
            model = cases[s].model
            same_plan = ch.kernel != "engine" or (model is not None and plan_key(ch.plan) == plan_key(model))
            if ch.kernel != ran.get("kernel") or not same_plan:
                got = f"{ev[s]['route']:.3f}" if ev[s]["route"] else "unmeasured"
                print(f"    {s[0]}x{s[1]}x{s[2]}: {describe(ch)} {got} (as run {ran['ratio']:.3f})")
    return ev


def describe(ch: Choice) -> str:
    if ch.kernel != "engine":
        return ch.kernel
    p = ch.plan
    get = (lambda k: getattr(p, k)) if isinstance(p, planner.Plan) else p.get
    sched = {"data_parallel": "DP", "split_k": f"SK x{get('splits')}", "pingpong": "PP",
             "stream_k": f"stream-K {get('sk_tiles')}/{get('sk_ctas')}",
             "split_k_global": f"global SK x{get('splits')}"}[get("schedule")]
    return f"{get('bm')}x{get('bn')} {sched} {get('stages')}st"


def name_of(case: Case, r: dict) -> str:
    if r is case.h11:
        return "h11"
    if r is case.decode:
        return "decode"
    return describe(Choice("engine", r, r))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", nargs="*", default=[], help="NAME=VALUE overrides of DeviceProfile constants")
    p.add_argument("--worst", type=int, default=6, help="shapes listed per class")
    p.add_argument("--changed", action="store_true", help="list the shapes whose route changed")
    p.add_argument("--shas", nargs="*", default=None, help="the broad runs to pool, oldest first (default: SHAS)")
    args = p.parse_args()
    prof = dataclasses.replace(H200, **{k: float(v) for k, v in (s.split("=") for s in args.set)})
    report(load(tuple(args.shas) if args.shas else SHAS), prof, args.worst, args.changed)


if __name__ == "__main__":
    main()
