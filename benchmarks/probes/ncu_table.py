"""Summarise an Nsight Compute raw-page CSV (``ncu -i REPORT --csv --page raw --print-units base``, gzipped or
not) of probe_ncu.py's launches: one line per kernel (what it is, time, SM clock, grid and cluster, registers,
tensor-pipe / DRAM / L2 utilisation, L2 hit rate, SM active share, the main stall reasons), printed and, with
--out, appended as JSON lines (with --label: the probe's name for each launch, one per line in order).

    python3 benchmarks/probes/ncu_table.py RAW.csv.gz [--order ORDER.txt] [--out OUT.jsonl] [--sha SHA]
"""
import argparse
import csv
import gzip
import json
import re

METRICS = {
    "us": ("gpu__time_duration.sum", 1e-3),
    "sm_mhz": ("gpc__cycles_elapsed.avg.per_second", 1e-6),
    "grid": ("launch__grid_size", 1),
    "cluster": ("launch__cluster_size", 1),
    "regs": ("launch__registers_per_thread", 1),
    "tensor_pct": ("sm__pipe_tensor_type_hmma_hgmma_qgmma_imma_igmma_bmma_bgmma_cycles_active.avg"
                   ".pct_of_peak_sustained_elapsed", 1),
    "dram_read_pct": ("dram__bytes_read.sum.pct_of_peak_sustained_elapsed", 1),
    "dram_read_bytes": ("dram__bytes_read.sum", 1),
    "l2_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed", 1),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct", 1),
    "l2_read_sectors": ("lts__t_sectors_srcunit_tex_op_read.sum", 1),
    "l2_to_sm_bytes": ("l1tex__m_xbar2l1tex_read_bytes.sum", 1),
}
STALLS = ("long_scoreboard", "wait", "barrier", "gmma", "membar", "short_scoreboard")


def _num(v: str):
    try:
        return float(v.replace(",", ""))
    except ValueError:
        return None


def rows(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        table = list(csv.reader(f))
    head, data = table[0], table[2:]  # the second row holds units
    idx = {c: i for i, c in enumerate(head)}
    out = []
    for row in data:
        name = row[idx["Kernel Name"]]
        m = re.search(r"nvjet\S+", name) or re.search(r"Traits<(.*?)>>", name)
        rec = {"id": int(row[0]), "kernel": m.group(0) if m and m.group(0).startswith("nvjet") else
               (f"{name.split('<')[0].replace('void ', '')}<{m.group(1)}>" if m else name[:80])}
        for key, (col, scale) in METRICS.items():
            v = _num(row[idx[col]]) if col in idx else None
            rec[key] = v * scale if v is not None else None
        active, elapsed = _num(row[idx["sm__cycles_active.avg"]]), _num(row[idx["sm__cycles_elapsed.avg"]])
        rec["sm_active_pct"] = 100 * active / elapsed if active and elapsed else None
        rec["stalls"] = {s: _num(row[idx[f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio"]])
                         for s in STALLS}
        out.append(rec)
    return sorted(out, key=lambda r: r["id"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("raw")
    ap.add_argument("--order", help="probe_ncu.py's list of its launches, one per line")
    ap.add_argument("--out")
    ap.add_argument("--sha", default=None)
    args = ap.parse_args()
    recs = rows(args.raw)
    labels = open(args.order).read().splitlines() if args.order else []
    if len(labels) != len(recs):
        labels = [""] * len(recs)
    for r, label in zip(recs, labels):
        r["label"] = label[:200]
        st = " ".join(f"{k[:4]} {v:.2f}" for k, v in r["stalls"].items() if v)
        print(f"{r['id']:>2} {r['kernel'][:60]:<60} {r['us']:8.1f} us {r['sm_mhz']:5.0f} MHz grid {r['grid']:4.0f} "
              f"cl {r['cluster'] or 0:.0f} tensor {r['tensor_pct']:5.1f} dram {r['dram_read_pct']:5.1f} "
              f"L2 {r['l2_pct']:5.1f} hit {r['l2_hit_pct']:5.1f} active {r['sm_active_pct']:5.1f} dram MB "
              f"{(r['dram_read_bytes'] or 0) / 1e6:6.1f} L2 rd Msect {(r['l2_read_sectors'] or 0) / 1e6:5.2f} | {st}"
              + (f"\n   {label[:120]}" if label else ""))
    if args.out:
        with open(args.out, "a") as f:
            for r in recs:
                f.write(json.dumps({"suite": "ncu-probe", "git_sha": args.sha, "gpu": "NVIDIA H200", **r}) + "\n")


if __name__ == "__main__":
    main()
