"""Probe: the TMA's L2 -> shared memory rate against the row pitch of a K-major bf16 operand.

132 CTAs, one thread each, keep STAGES boxes of 128 rows x 64 bf16 (16 KB) in flight over a (rows, K)
operand and nothing consumes them (tma_pitch.cu). Rows of K = 3000 or 1000 elements are 16- but not 32-byte
aligned; 3008 / 3024 / 3040 / 3072 / 1024 are. Prints GB/s per (rows, K, mode, stages); argv[1]: a JSON-lines
file for the records (benchmarks/results/tma_pitch_probe.jsonl). ``--pairs``: instead, clusters of two CTAs
that need the same boxes, each loading them whole or half of each multicast to both (the engine kernel's B
multicast), at aligned and misaligned rows: the rate each path delivers. Modes: 0 the engine's box (64 x 128,
128-byte swizzle), 1 two 32 x 128 boxes (64-byte swizzle), 3 eight 8 x 128 boxes (no swizzle).

    PYTHONPATH=src python3 benchmarks/probes/probe_tma_pitch.py [--pairs] OUT.jsonl   (on a Hopper GPU)
"""
import ctypes, json, os, sys

import numpy as np
import torch
from cuda.bindings import driver

from gemmlab.jit.compiler import KERNEL_ROOT, compile_kernel
from gemmlab.jit.launch import Launcher, encode_tensor_map, raw_stream

SRC = os.path.relpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tma_pitch.cu"), KERNEL_ROOT)
SMEM = 8 * 16384 + 1024
BOXES = {0: ((128, 64), 128), 1: ((128, 32), 64), 3: ((128, 8), 0)}  # mode: (box rows x cols, swizzle)
_keep = []


def aligned_map(t, K, mode, rows=128):
    """The descriptor in a 64-byte aligned buffer (CUtensorMap is alignas(64), as MapSlot keeps it)."""
    (_, cols), swz = BOXES[mode]
    box = (rows, cols)
    tm = encode_tensor_map(t.data_ptr(), t.shape[0], K, t.stride(0), t.dtype, box, swizzle_bytes=swz)
    buf = np.zeros(192, dtype=np.uint8)
    at = -buf.ctypes.data % 64
    ctypes.memmove(buf.ctypes.data + at, tm.getPtr(), 128)
    _keep.append(buf)
    return driver.CUtensorMap(_ptr=buf.ctypes.data + at)


_launchers = {}


def run(mode, stages, t, K, iters):
    if (mode, stages) not in _launchers:
        ck = compile_kernel(SRC, f"tma_pitch<{mode}, {stages}>", arch="sm_90a", use_disk_cache=False)
        _launchers[mode, stages] = Launcher(ck, ("tmap", "i32", "i32", "i32", "ptr"), grid=132, block=128,
                                            smem=SMEM, device_index=0)
    L = _launchers[mode, stages]
    L.set_args([aligned_map(t, K, mode), t.shape[0] // 128, -(-K // 64), iters, 0])
    L.launch(raw_stream(0))


def run_pairs(mc, stages, t, K, iters):
    """``tma_pair<mc, stages>``: clusters of two CTAs needing the same boxes, loaded whole by each (mc 1) or
    half by each and multicast (mc 2)."""
    if ("pair", mc, stages) not in _launchers:
        ck = compile_kernel(SRC, f"tma_pair<{mc}, {stages}>", arch="sm_90a", use_disk_cache=False)
        _launchers["pair", mc, stages] = Launcher(ck, ("tmap", "i32", "i32", "i32"), grid=132, block=128,
                                                  smem=SMEM, cluster=2, device_index=0)
    L = _launchers["pair", mc, stages]
    L.set_args([aligned_map(t, K, 0, rows=64 if mc == 2 else 128), t.shape[0] // 128, -(-K // 64), iters])
    L.launch(raw_stream(0))


def timed(fn, *args):
    """Best of five timed launches after one untimed, in ms."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn(*args)
    ts = []
    for _ in range(5):
        start.record()
        fn(*args)
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end))
    return min(ts)


def sweep(out, suite: str, Ks, variants: dict, fn) -> None:
    """Time ``fn(variant, stages, operand, K, iters)`` for each variant (name -> argument) at 4 and 8 stages,
    over an L2-resident operand (3072 rows, 18 MB at K = 3000) and one streamed from HBM (24576 rows, 148 MB);
    print GB/s delivered (132 CTAs x 16 KB a step) and append a record per point."""
    for rows in (3072, 24576):
        for K in Ks:
            buf = torch.randn(rows, K, device="cuda").bfloat16()
            iters = -(-K // 64) * 8
            for name, v in variants.items():
                for stages in (4, 8):
                    ms = timed(fn, v, stages, buf, K, iters)
                    gbs = 132 * iters * 16384 / ms / 1e6
                    print(f"{suite} rows {rows:6d} K {K:5d} pitch%32 {K * 2 % 32:2d} {name} stages {stages}: "
                          f"{gbs:8.0f} GB/s ({ms * 1e3:.1f} us)", flush=True)
                    if out:
                        out.write(json.dumps({"suite": suite, "rows": rows, "K": K, name.split()[0]: v,
                                              "stages": stages, "gb_per_s": gbs, "ms": ms,
                                              "git_sha": os.environ.get("GEMMLAB_GIT_SHA")}) + "\n")


def main():
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    out = open(paths[0], "a") if paths else None
    if "--pairs" in sys.argv:  # multicast against two separate loads of the same box
        sweep(out, "tma-pair-probe", (3000, 3072, 1000, 1024), {"mc 1": 1, "mc 2": 2}, run_pairs)
    else:
        sweep(out, "tma-pitch-probe", (3000, 3008, 3024, 3040, 3072, 1000, 1024),
              {f"mode {m}": m for m in BOXES}, run)


if __name__ == "__main__":
    main()
