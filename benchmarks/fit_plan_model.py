"""Check gemmlab.plan_cost against the committed h11 records (CPU only; no GPU needed).

    PYTHONPATH=src python3 benchmarks/fit_plan_model.py [--scale launch_s=2e-6 ...]

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

from gemmlab import plan_cost
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--set", nargs="*", default=[], help="NAME=VALUE overrides of DeviceProfile constants")
    args = p.parse_args()
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
