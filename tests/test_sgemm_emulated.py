"""The fp32 ladder's kernels, run on the host without a GPU: indexing, edge guards, the float4
fallbacks for unaligned shapes and pointers, beta == 0 never reading C, and barrier placement.

Every CUDA thread becomes a coroutine (``host_emulation/cuda_host.h``) and blocks run one after
another, with the grid and block that each step's own launcher asks for. The threads of a block run
in forward, reverse or shuffled order between barriers, so a missing ``__syncthreads`` changes the
result. Needs g++; uses AddressSanitizer and UBSan when the compiler has them (a read past A or B,
or a misaligned float4 access, then fails the run).
"""

import shutil
import subprocess
from pathlib import Path
from unittest import mock

import pytest
import torch

from gemmlab import fp32, registry
from gemmlab.jit.compiler import KERNEL_ROOT
from gemmlab.ladders import sgemm as sgemm_ladder

HERE = Path(__file__).resolve().parent / "host_emulation"
FORWARD, REVERSE, SHUFFLED = 0, 1, 2

# (M, N, K, beta, misalign, order): ragged edges in every dimension, K and N not multiples of 4,
# operands shifted off 16-byte alignment, C poisoned with NaN when beta == 0.
CASES = [
    (1, 1, 1, -0.5, 0, FORWARD),
    (17, 33, 65, 0.0, 0, SHUFFLED),
    (67, 45, 33, -0.5, 1, REVERSE),
    (130, 131, 20, 0.0, 0, REVERSE),
    (128, 256, 96, -0.5, 0, SHUFFLED),
    (128, 256, 96, 0.0, 1, FORWARD),
    (255, 257, 129, -0.5, 0, SHUFFLED),
    (129, 257, 33, -0.5, 1, SHUFFLED),
]

# Configs that take code paths a step's default does not (none beyond the partial-pass config today).
EXTRA_CONFIGS: dict = {}


def _partial_pass_config(spec):
    """A config whose threads do not divide the float4 loads of a tile (k08 on guard the last pass)."""
    if spec.step < 8:
        return None
    for cfg in spec.configs():
        t = spec.threads(cfg)
        if (cfg["BM"] * cfg["BK"] // 4) % t or (cfg["BK"] * cfg["BN"] // 4) % t:
            return cfg
    return None


def _instances():
    out = []
    for spec in registry.all_kernels("sgemm"):
        out.append((spec, spec.default_config()))
        extra = _partial_pass_config(spec)
        if extra is not None and extra != spec.default_config():
            out.append((spec, extra))
        out += [(spec, spec.resolve(cfg)) for cfg in EXTRA_CONFIGS.get(spec.name, ())]
    return out


INSTANCES = _instances()


def _geometry(spec, cfg, M, N, K):
    """(grid, block) as the step's launcher passes them to ``launch``, captured on CPU tensors."""
    seen = {}

    def record(compiled, *, grid, block, args, smem=0, cluster=None):
        seen["grid"], seen["block"] = tuple(grid), tuple(block)

    # k01..k03 launch from the ladder's module, the tiled steps from gemmlab.fp32's (their shared launcher)
    with mock.patch.object(sgemm_ladder, "launch", record), mock.patch.object(fp32, "launch", record):
        spec.launcher(spec, None, cfg, torch.empty(M, K), torch.empty(K, N), torch.empty(M, N), 1.0, 0.0)
    grid = seen["grid"] + (1,) * (2 - len(seen["grid"]))
    block = seen["block"] + (1,) * (2 - len(seen["block"]))
    return grid[:2], block[:2]


def _compile(out_dir: Path, sanitize: bool) -> Path | None:
    exe = out_dir / ("harness_san" if sanitize else "harness")
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"] if sanitize else []
    cmd = ["g++", "-std=c++17", "-O1", *flags, "-I", str(out_dir), "-I", str(HERE), "-I", str(KERNEL_ROOT),
           "-I", str(KERNEL_ROOT / "sgemm"), str(HERE / "harness.cpp"), "-o", str(exe)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        if sanitize:
            return None
        pytest.fail(f"host build of the sgemm kernels failed:\n{proc.stderr[-4000:]}")
    return exe


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    out = tmp_path_factory.mktemp("sgemm_host")
    includes = sorted({spec.source for spec, _ in INSTANCES})
    lines = [f'#include "{src}"' for src in includes]
    lines.append("static const Kernel KERNELS[] = {")
    lines += [f"    &{spec.name_expression(cfg)}," for spec, cfg in INSTANCES]
    lines.append("};")
    (out / "kernel_table.inc").write_text("\n".join(lines) + "\n")
    return _compile(out, sanitize=True) or _compile(out, sanitize=False)


@pytest.mark.parametrize("index", range(len(INSTANCES)),
                         ids=[s.short + ("" if c == s.default_config() else "-partial-pass" if c == _partial_pass_config(s)
                                   else "-" + "-".join(f"{k}{v}" for k, v in c.items() if v != s.default_config()[k]))
                              for s, c in INSTANCES])
def test_kernel_matches_float64_on_the_host(harness, index):
    spec, cfg = INSTANCES[index]
    for M, N, K, beta, misalign, order in CASES:
        (gx, gy), (bx, by) = _geometry(spec, cfg, M, N, K)
        args = [index, M, N, K, gx, gy, bx, by, 0.75, beta, misalign, order]
        proc = subprocess.run([str(harness), *map(str, args)], capture_output=True, text=True, timeout=600,
                              env={"ASAN_OPTIONS": "detect_leaks=0:detect_stack_use_after_return=0"})
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        assert proc.returncode == 0 and last.startswith("OK"), (
            f"{spec.name} {cfg} M={M} N={N} K={K} beta={beta} misalign={misalign} order={order}:\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
