"""Benchmarks as data: time kernels against cuBLAS with the one timer and return JSON-able records.

A record holds the git sha, GPU, driver, SM clock / power / temperature during the run, the kernel
and its config, the shape, both times, TFLOP/s, the ratio to cuBLAS (> 1 is faster) and the
correctness error measured before timing. ``append_records`` writes them as JSON lines; ``load_records``
(``gemmlab.record_files``, which needs no torch) reads them back, plain or gzip.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
import subprocess
from pathlib import Path
from typing import Callable

import torch

from .gpu import gpu_info
from .kernelspec import KernelSpec
from .registry import LADDERS
from .record_files import load_records  # noqa: F401 (the reader beside the writer)
from .timer import eager_host_us, eager_wall_us, sets_for, time_interleaved

SCHEMA = 1
MAX_SET_BYTES = 8 * 2**30  # all rotating input sets together stay under this


def git_sha() -> str:
    env = os.environ.get("GEMMLAB_GIT_SHA")
    if env:
        return env
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).parent, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=Path(__file__).parent, timeout=10).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "") if out.returncode == 0 else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN or Inf anywhere gives inf (never passes)."""
    o = out.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float(torch.linalg.vector_norm(o - ref) / torch.linalg.vector_norm(ref).clamp_min(1e-300))


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill with NaN so an element the kernel forgot to write fails the check."""
    return t.fill_(float("nan"))


def check_candidates(runs: dict, out: torch.Tensor, ref: torch.Tensor, *, tol: float = 1e-2):
    """Run each candidate ``fn(0)`` once into ``out`` (its output on input set 0), poisoned first, and
    compare with ``ref``. Returns (passing, errors): the candidates within ``tol`` (relative error), to
    be timed, and each candidate's error, or its exception's text (recorded; the run goes on)."""
    passing, errors = {}, {}
    for name, fn in runs.items():
        poison_(out)
        try:
            fn(0)
            torch.cuda.synchronize()
            errors[name] = rel_error(out, ref.double())
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            errors[name] = f"{type(e).__name__}: {e}"[:300]
        if isinstance(errors[name], float) and errors[name] <= tol:
            passing[name] = fn
    return passing, errors


def flops(M: int, N: int, K: int) -> float:
    return 2.0 * M * N * K


def bench_shape(ladder: str, M: int, N: int, K: int, steps: list[tuple[KernelSpec, dict | None]], *,
                suite: str = "adhoc", rounds: int = 15, replay_ms: float = 20.0,
                extra: dict | None = None) -> list[dict]:
    """Time each (step, config) and cuBLAS on one shape, interleaved in one process. One record per step."""
    lad = LADDERS[ladder]
    info = gpu_info()
    elem = 4 if lad.dtype == "fp32" else 2
    per_set = elem * (M * K + K * N + M * N)
    n_sets = max(1, min(sets_for(per_set, info.l2_bytes), MAX_SET_BYTES // max(per_set, 1)))
    gen = torch.Generator(device="cuda").manual_seed(1234 + M + 7 * N + 13 * K)
    sets = [lad.make_inputs(M, N, K, "cuda", gen) for _ in range(n_sets)]

    # Correctness first, on fresh inputs with a poisoned output.
    a0, b0, c0 = sets[0]
    ref = lad.reference(a0, b0, c0, 1.0, 0.0)
    def label(spec, cfg):
        return spec.name + spec.config_tag(cfg)

    errors: dict[str, float] = {}
    runnable = []
    for spec, cfg in steps:
        out = poison_(torch.empty_like(c0))
        spec.run(a0, b0, out, config=cfg)
        torch.cuda.synchronize()
        errors[label(spec, cfg)] = rel_error(out, ref)
        if errors[label(spec, cfg)] <= lad.rel_tolerance:
            runnable.append((spec, cfg))
    outs = [torch.empty_like(c) for _, _, c in sets]

    def step_fn(spec, cfg) -> Callable[[int], None]:
        def fn(i):
            a, b, _ = sets[i]
            spec.run(a, b, outs[i], config=cfg)
        return fn

    def cublas(i):
        a, b, _ = sets[i]
        if lad.layout == "TN":
            torch.mm(a, b.t(), out=outs[i])
        else:
            torch.mm(a, b, out=outs[i])

    candidates = {"cublas": cublas}
    for spec, cfg in runnable:
        candidates[label(spec, cfg)] = step_fn(spec, cfg)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 cuBLAS is measured as true SGEMM
    try:
        res = time_interleaved(candidates, n_sets, replay_ms=replay_ms, rounds=rounds)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    base = res.timings["cublas"]
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    common = {
        "schema": SCHEMA, "time": now, "git_sha": git_sha(), "gpu": info.name, "sm_count": info.sm_count,
        "driver": info.driver, "torch": info.torch, "suite": suite, "ladder": ladder, "dtype": lad.dtype,
        "layout": lad.layout, "M": M, "N": N, "K": K, "n_sets": n_sets, "flush_bytes": res.flush_bytes,
        "sm_clock_mhz": res.clocks.sm_mhz, "mem_clock_mhz": res.clocks.mem_mhz,
        "power_w": res.clocks.power_w, "temp_c": res.clocks.temp_c,
        "baseline": "cublas(torch.mm)", "baseline_ms": base.median_ms,
        "baseline_sm_clock_mhz": _clock(res, "cublas"),
        "baseline_tflops": flops(M, N, K) / base.median_ms / 1e9, "baseline_spread": base.spread,
    }
    records = []
    for spec, cfg in steps:
        err = errors[label(spec, cfg)]
        rec = dict(common, kernel=spec.name, config=spec.resolve(cfg), rel_error=err,
                   correct=err <= lad.rel_tolerance, **(extra or {}))
        t = res.timings.get(label(spec, cfg))
        if t is not None:
            rec.update(time_ms=t.median_ms, tflops=flops(M, N, K) / t.median_ms / 1e9,
                       ratio=base.median_ms / t.median_ms, spread=t.spread,
                       launches_per_replay=t.launches_per_replay,
                       kernel_sm_clock_mhz=_clock(res, label(spec, cfg)))
        records.append(rec)
    del sets, outs
    torch.cuda.empty_cache()
    return records


def _clock(res, name: str) -> float | None:
    """The SM clock sampled during candidate ``name``'s own replays (None where NVML cannot say)."""
    c = getattr(res, "clocks_by_name", {}).get(name)
    return c.sm_mhz if c is not None else None


def append_records(path: str | Path, records: list[dict]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in records:
            f.write(json.dumps(r, sort_keys=True) + "\n")


# gemmlab.matmul against torch ----------------------------------------------------------------------

def matmul_inputs(M: int, N: int, K: int, *, layout: str = "TN", dtype=torch.bfloat16, generator=None):
    """A (M,K) and B (K,N) for a layout: 'TN' = A row-major, B an (N,K) weight seen as ``w.t()``
    (what nn.Linear computes); 'NN' = both row-major; 'NT' / 'TT' = A column-major with a row-major B /
    a weight B."""
    def rnd(*shape):
        return torch.randn(*shape, device="cuda", dtype=dtype, generator=generator)
    a_row_major, b_is_weight = {"TN": (True, True), "NN": (True, False), "NT": (False, False),
                                "TT": (False, True)}[layout]
    a = rnd(M, K) if a_row_major else rnd(K, M).t()
    b = rnd(N, K).t() if b_is_weight else rnd(K, N)
    return a, b


def _matmul_path(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None,
                 activation: str | None = None) -> str:
    """Which kernel ``gemmlab.matmul`` runs for these operands: "decode", "h11", "engine" (``engine.route``'s
    choice) or "sgemm" (fp32)."""
    if a.dtype == torch.float32:
        return "sgemm"
    from . import engine

    return engine.route(a, b, out, bias=bias, activation=activation, has_c=False,
                        sm_count=lambda: engine._sm_count(a.device),
                        memory_peak=lambda: engine._memory_peak(a.device)).kernel


def bench_matmul(M: int, N: int, K: int, *, layout: str = "TN", dtype=torch.bfloat16, bias: bool = False,
                 activation: str | None = None, suite: str = "adhoc", rounds: int = 15,
                 replay_ms: float = 20.0, extra: dict | None = None) -> dict:
    """``gemmlab.matmul`` against what a PyTorch user writes for the same thing (``torch.mm``, or
    ``torch.addmm`` + the activation for the epilogue), timed interleaved. Returns one record."""
    import torch.nn.functional as F

    from . import matmul

    info = gpu_info()
    per_set = 2 * (M * K + K * N + M * N)
    n_sets = max(1, min(sets_for(per_set, info.l2_bytes), MAX_SET_BYTES // max(per_set, 1)))
    gen = torch.Generator(device="cuda").manual_seed(4321 + M + 7 * N + 13 * K)
    sets = [matmul_inputs(M, N, K, layout=layout, dtype=dtype, generator=gen) for _ in range(n_sets)]
    biases = [torch.randn(N, device="cuda", dtype=dtype, generator=gen) if bias else None for _ in range(n_sets)]
    outs = [torch.empty(M, N, device="cuda", dtype=dtype) for _ in range(n_sets)]
    acts = {None: None, "relu": F.relu, "gelu": F.gelu, "silu": F.silu,
            "gelu_tanh": lambda x: F.gelu(x, approximate="tanh")}

    a0, b0 = sets[0]
    ref = a0.double() @ b0.double()
    if bias:
        ref = ref + biases[0].double()
    if activation:
        ref = acts[activation](ref)
    out = poison_(torch.empty(M, N, device="cuda", dtype=dtype))
    matmul(a0, b0, bias=biases[0], activation=activation, out=out)
    torch.cuda.synchronize()
    err = rel_error(out, ref)

    def ours(i):
        a, b = sets[i]
        matmul(a, b, bias=biases[i], activation=activation, out=outs[i])

    def theirs(i):
        a, b = sets[i]
        if bias:
            y = torch.addmm(biases[i], a, b, out=outs[i])
        else:
            y = torch.mm(a, b, out=outs[i])
        if activation:
            acts[activation](y)

    res = time_interleaved({"torch": theirs, "gemmlab": ours}, n_sets, replay_ms=replay_ms, rounds=rounds)
    t, base = res.timings["gemmlab"], res.timings["torch"]
    now = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    rec = {
        "schema": SCHEMA, "time": now, "git_sha": git_sha(), "gpu": info.name, "sm_count": info.sm_count,
        "driver": info.driver, "torch": info.torch, "suite": suite, "kernel": "gemmlab.matmul",
        "dtype": str(dtype).replace("torch.", ""), "layout": layout, "M": M, "N": N, "K": K,
        "bias": bias, "activation": activation, "n_sets": n_sets, "path": _matmul_path(a0, b0, out, biases[0], activation),
        "pdl": _pdl(), "flush_bytes": res.flush_bytes,
        "sm_clock_mhz": res.clocks.sm_mhz, "mem_clock_mhz": res.clocks.mem_mhz, "power_w": res.clocks.power_w,
        "temp_c": res.clocks.temp_c, "baseline": "torch.mm" + ("/addmm+act" if bias or activation else ""),
        "kernel_sm_clock_mhz": _clock(res, "gemmlab"), "baseline_sm_clock_mhz": _clock(res, "torch"),
        "baseline_ms": base.median_ms, "baseline_tflops": flops(M, N, K) / base.median_ms / 1e9,
        "time_ms": t.median_ms, "tflops": flops(M, N, K) / t.median_ms / 1e9, "ratio": base.median_ms / t.median_ms,
        "spread": t.spread, "baseline_spread": base.spread, "rel_error": err, "correct": err <= 1e-2,
        "min_bytes": 2 * (M * K + K * N + M * N),
        "gbps": 2 * (M * K + K * N + M * N) / t.median_ms / 1e6,
        "baseline_gbps": 2 * (M * K + K * N + M * N) / base.median_ms / 1e6,
        **(extra or {}),
    }
    del sets, outs
    return rec


# Eager calls: gemmlab.matmul / linear against torch as a caller runs them, no graphs ------------------------

def _eager_common(kind: str) -> dict:
    from .gpu import sample_clocks

    info = gpu_info()
    return {"schema": SCHEMA, "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "git_sha": git_sha(), "gpu": info.name, "sm_count": info.sm_count, "driver": info.driver,
            "torch": info.torch, "suite": "eager", "kind": kind, "sm_clock_mhz": sample_clocks().sm_mhz,
            "pdl": _pdl()}


def _pdl() -> bool:
    """Whether gemmlab's prepared launches use programmatic dependent launch (``jit.launch.PDL``): back-to-back
    calls overlap one kernel's start with the previous one's end, so eager and graph-replay records say so."""
    from .jit import launch

    return launch.PDL


def _interleaved_eager(ours: Callable[[], object], theirs: Callable[[], object], reps: int, calls: int) -> dict:
    """Host and wall time per call of both, measured in turns (ours, theirs; ``reps`` turns). Host times:
    the best turn (host time only grows with noise). Wall: the median turn, and ``ratio`` the median of
    the turns' own ratios (each turn times both within milliseconds, so clock and load drift cancel in
    its ratio; a ratio of two separately chosen best turns did not: 0.69-0.99 between runs of one stack)."""
    for _ in range(3):  # warm: compiles, descriptors, cuBLAS handles
        ours(), theirs()
    t = {"host": [], "baseline_host": [], "wall": [], "baseline_wall": []}
    for _ in range(reps):
        for key, fn in (("", ours), ("baseline_", theirs)):
            t[key + "host"].append(eager_host_us(fn, calls=calls))
            t[key + "wall"].append(eager_wall_us(fn, calls=calls))
    out = {f"{k}_us": (min(v) if k.endswith("host") else statistics.median(v)) for k, v in t.items()}
    out["ratio"] = statistics.median(b / o for o, b in zip(t["wall"], t["baseline_wall"]))
    out["ratio_min"] = min(b / o for o, b in zip(t["wall"], t["baseline_wall"]))
    out["host_excess_us"] = out["host_us"] - out["baseline_host_us"]
    out["reps"] = reps
    return out


def bench_eager(M: int, N: int, K: int, *, dtype=torch.bfloat16, reps: int = 5, extra: dict | None = None) -> dict:
    """``gemmlab.matmul(x, w.t())`` against ``torch.mm(x, w.t())`` on the same inputs, eager: the host time
    of one call (GPU kept busy) and the wall time of back-to-back calls (GPU idle). One record; ``ratio``
    is torch's wall time over ours (> 1: faster as a caller sees it)."""
    from . import matmul

    x = torch.randn(M, K, device="cuda", dtype=dtype)
    w = torch.randn(N, K, device="cuda", dtype=dtype)
    err = rel_error(matmul(x, w.t()), x.double() @ w.t().double())
    times = _interleaved_eager(lambda: matmul(x, w.t()), lambda: torch.mm(x, w.t()), reps, calls=100)
    return dict(_eager_common("per_call"), dtype=str(dtype).replace("torch.", ""), M=M, N=N, K=K,
                baseline="torch.mm", rel_error=err, correct=err <= 1e-2, **times, **(extra or {}))


def bench_eager_stack(M: int, *, dtype=torch.bfloat16, reps: int = 9) -> dict:
    """One eager forward's GEMMs (``matmul_suites.LLAMA2_7B_LAYER`` repeated to ``STACK_CALLS`` calls) at
    batch ``M``: ``gemmlab.linear`` against ``F.linear``, per call of the stack. One record."""
    import torch.nn.functional as F

    from . import linear
    from .matmul_suites import LLAMA2_7B_LAYER, STACK_CALLS

    weights = [torch.randn(n, k, device="cuda", dtype=dtype) for n, k in LLAMA2_7B_LAYER]
    xs = {k: torch.randn(M, k, device="cuda", dtype=dtype) for k in {k for _, k in LLAMA2_7B_LAYER}}
    calls = [(xs[w.shape[1]], w) for w in (weights * STACK_CALLS)[:STACK_CALLS]]

    def ours():
        for x, w in calls:
            linear(x, w)

    def theirs():
        for x, w in calls:
            F.linear(x, w)

    times = _interleaved_eager(ours, theirs, reps, calls=10)
    times = {k: v / STACK_CALLS if k.endswith("_us") else v for k, v in times.items()}
    return dict(_eager_common("stack"), dtype=str(dtype).replace("torch.", ""), M=M, calls=STACK_CALLS,
                model="llama2_7b", baseline="F.linear", **times)
