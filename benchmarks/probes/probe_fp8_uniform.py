"""Probe: does the warp-uniform warpgroup index cost the block-scaled FP8 kernel? Between the fp8.jsonl runs
of 2564f06 and aef61a6 the block-scaled plans went from 0.94 to 0.90 of the per-tensor ones (2048x14336x4096
205 -> 224 us at the same tile while per-tensor went 197 -> 180); of the kernel changes between them the
uniform index (0710bc4, Fp8GemmTraits::UNIFORM_WG) is the one that reshapes the consumer's code (its
block-scale arithmetic moves to uniform registers: R2UR 63 -> 24 in the 128 x 224 kernel).

Runs ``fp8_bench.py`` (its arguments after ours) with the kernel sources patched so that block-scaled
plans read the warpgroup index as before (``threadIdx.x / 128``), per-tensor plans unchanged; compare its
records with an unpatched run of the same shapes (block / per-tensor in each process).

    PYTHONPATH=src:benchmarks python3 benchmarks/probes/probe_fp8_uniform.py --out OUT.jsonl --shapes ..."""
import os
import sys

sys.path.insert(0, "benchmarks")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import probe_mc_parts as parts  # noqa: E402
from gemmlab.jit import compiler  # noqa: E402

UNIFORM = "static constexpr bool UNIFORM_WG = !kBias && kAct == 0 && !kDirect && sizeof(TOut) == 2;"
parts.PATCHES["fp8_block_divergent"] = [
    ("common/fp8_traits.cuh", UNIFORM, UNIFORM[:-1] + " && kScale != SCALE_BLOCK;")]

if __name__ == "__main__":
    compiler.KERNEL_ROOT = parts.patched_root("fp8_block_divergent")
    os.environ["GEMMLAB_GIT_SHA"] = os.environ.get("GEMMLAB_GIT_SHA", "") + "+fp8-block-divergent"
    import fp8_bench

    fp8_bench.main()
