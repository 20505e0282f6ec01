"""The autotuner: time a step's configs at one shape on this GPU, keep the fastest correct one, persist it.

``tune(spec, M, N, K)`` picks candidates from the step's search space (``KernelSpec.configs()``, the
same space the registry validates), times them with ``gemmlab.bench.bench_shape`` (the one timer:
rotating inputs, CUDA-graph replays, interleaved with cuBLAS, correctness checked first) in groups of
several per call, re-times the best few of every group together in one final call, and returns every
record with the winner. Nothing is ever tuned by editing source: a config is template arguments and
launch-time options chosen from Python.

Results persist per GPU, one JSON file per (GPU name, SM count, driver major version), written atomically
under a lock and read tolerantly: the format and its guarantees are ``gemmlab.tuned``'s docstring.

The files and their lookups are ``gemmlab.tuned`` (the store the runtime reads without this module):
``best_config`` (what ``KernelSpec.config_for`` asks first) returns the saved winner for a step and shape
on the visible GPU. The Hopper engine's plan (tile width, split-K count) is h11's config
``{"BN", "SPLITS"}``, and ``engine.plan_for`` takes the winner saved for ``hopper.h11_general`` at exactly
(M, N, K) on the tensors' GPU while the engine can still run it, else ``choose_plan``. h11's ladder launcher runs the
config's plan (``engine.gemm(..., plan=)``) in the nn.Linear layout ``gemmlab.matmul`` sees, so tuning
times what matmul runs; one entry serves bf16 and fp16 (same element size), every epilogue and layout.
A step whose launcher ignored its config would set ``extra["not_tunable"]`` (``tune`` refuses it).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UnsupportedProblem
from .kernelspec import KernelSpec
# The store, re-exported: the CLI, the MCP server and the tests read tuned results through this module too.
from .tuned import (FORMAT, AutotuneCacheWarning, GpuKey, best_config, current_gpu, device_gpu,  # noqa: F401
                    entry_key, load, nearest_config, save_entry, saved_entries, tune_dir, tuned_file_stamp,
                    tuned_path)

GROUP_SIZE = 8  # candidates per bench_shape call (plus cuBLAS): enough to share one interleaved run
FINAL_TOP = 4  # the best of the screening groups re-timed together, so the winner is decided in one run

# Candidates ---------------------------------------------------------------------------------------------

def variant_key(spec: KernelSpec, cfg: dict) -> tuple:
    """What makes two configs different runs: the compiled instantiation plus the launch-time options."""
    cfg = spec.resolve(cfg)
    return (spec.name_expression(cfg), tuple((p.name, cfg[p.name]) for p in spec.params if not p.template))


def _spread(items: list, k: int) -> list:
    """``k`` items evenly spaced over ``items`` (first and last included), in order; all if there are few."""
    n = len(items)
    if k <= 0:
        return []
    if n <= k:
        return list(items)
    if k == 1:
        return [items[(n - 1) // 2]]
    # Steps of (n-1)/(k-1) > 1 round to distinct indices.
    return [items[round(i * (n - 1) / (k - 1))] for i in range(k)]


def tunable(spec: KernelSpec) -> str | None:
    """None if ``spec`` can be tuned; else why not."""
    if not spec.params:
        return "it has no parameters"
    return spec.extra.get("not_tunable")


@dataclass
class Candidates:
    configs: list[dict[str, int]]  # to time, the step's own choice first when it runs the shape
    skipped: list[tuple[dict, str]]  # (config, why it is not timed)
    heuristic: dict[str, int] | None  # the step's own choice, None if it cannot run the shape


def select_candidates(spec: KernelSpec, M: int, N: int, K: int, sm_count: int, *,
                      configs: Sequence[dict] | None = None, max_configs: int = 32) -> Candidates:
    """The configs to time, those left out (with the reason) and the step's own choice.

    Candidates are ``configs`` (each over the defaults) or the step's whole valid space, less configs that
    cannot run (M, N, K), less duplicates (same instantiation and launch options, ``variant_key``), at most
    ``max_configs``. The step's own choice (``config_for(..., tuned=False)``: its heuristic, else its
    defaults) is always first when it runs the shape; the rest are spread evenly over the remaining list
    (deterministic). Raises ``UnsupportedProblem`` for a config with an unknown parameter or value."""
    if max_configs < 1:
        raise ValueError(f"max_configs must be >= 1, got {max_configs}")
    skipped: list[tuple[dict, str]] = []
    pool = [spec.resolve(c) for c in configs] if configs is not None else spec.configs()
    try:
        base = spec.config_for(M, N, K, sm_count, tuned=False)
        why = spec.why_unsupported(M, N, K, base)
    except UnsupportedProblem as e:
        base, why = None, str(e)
    if why is not None:
        skipped.append((base or spec.default_config(), f"the step's own choice cannot run the shape: {why}"))
        base = None
    seen = {variant_key(spec, base)} if base is not None else set()
    rest = []
    for cfg in pool:
        why = spec.why_unsupported(M, N, K, cfg)
        if why is not None:
            skipped.append((cfg, why))
            continue
        key = variant_key(spec, cfg)
        if key not in seen:
            seen.add(key)
            rest.append(cfg)
    head = [base] if base is not None else []
    chosen = _spread(rest, max_configs - len(head))
    kept = {variant_key(spec, c) for c in chosen}
    skipped += [(c, f"beyond max_configs={max_configs}") for c in rest if variant_key(spec, c) not in kept]
    return Candidates(configs=head + chosen, skipped=skipped, heuristic=base)


# Timing and choosing ------------------------------------------------------------------------------------

def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _checked(rec: dict) -> bool:
    """Marked correct, with a finite error."""
    return rec.get("correct") is True and _finite(rec.get("rel_error"))


def _good(rec: dict) -> bool:
    """Correct, with a finite error and a finite positive time."""
    return _checked(rec) and _finite(rec.get("time_ms")) and rec["time_ms"] > 0


def _config_id(rec: dict) -> str:
    return json.dumps(rec.get("config"), sort_keys=True)


def pick_winner(records: Iterable[dict]) -> dict | None:
    """The fastest record by median time among the correct ones (NaN/inf errors or times never win);
    on a tie, the earlier record. None if no record qualifies."""
    best = None
    for rec in records:
        if _good(rec) and (best is None or rec["time_ms"] < best["time_ms"]):
            best = rec
    return best


@dataclass
class TuneResult:
    """What ``tune`` measured. ``records`` are ``bench_shape`` records (plus ``autotune_stage``: "screen"
    or "final", and ``error`` for a candidate that failed to run); ``winner`` is one of them."""

    kernel: str
    M: int
    N: int
    K: int
    gpu: GpuKey
    heuristic: dict[str, int] | None  # the step's own choice (timed first), None if it cannot run the shape
    candidates: list[dict[str, int]]
    skipped: list[tuple[dict, str]]
    records: list[dict] = field(default_factory=list)
    winner: dict | None = None
    saved_to: Path | None = None

    @property
    def config(self) -> dict[str, int] | None:
        return dict(self.winner["config"]) if self.winner else None

    def latest(self) -> list[dict]:
        """One record per candidate: its final-round record if it had one, else its screening record."""
        out: dict[str, dict] = {}
        for rec in self.records:
            out[_config_id(rec)] = rec
        return list(out.values())

    def heuristic_record(self) -> dict | None:
        if self.heuristic is None:
            return None
        return next((r for r in reversed(self.records) if r.get("config") == self.heuristic), None)


def _failed_record(spec: KernelSpec, cfg: dict, M: int, N: int, K: int, err: BaseException) -> dict:
    first = str(err).splitlines()[0] if str(err) else ""
    return {"kernel": spec.name, "config": spec.resolve(cfg), "M": M, "N": N, "K": K, "correct": False,
            "rel_error": float("nan"), "error": f"{type(err).__name__}: {first}"}


def _time_group(spec: KernelSpec, M: int, N: int, K: int, group: list[dict], rounds: int, stage: str,
                log: Callable[[str], None]) -> list[dict]:
    """``bench_shape`` on a group; if the call fails, each candidate alone (a failing one is recorded)."""
    from . import bench

    extra = {"autotune_stage": stage}
    steps = [(spec, cfg) for cfg in group]
    try:
        return bench.bench_shape(spec.ladder, M, N, K, steps, suite="autotune", rounds=rounds, extra=extra)
    except Exception as e:  # noqa: BLE001 - one bad candidate (launch error, ...) must not sink the group
        if len(group) == 1:
            log(f"{spec.name}{spec.config_tag(group[0])} failed: {e}")
            return [dict(_failed_record(spec, group[0], M, N, K, e), **extra)]
        log(f"a group of {len(group)} failed ({type(e).__name__}); timing its candidates one by one")
    out = []
    for cfg in group:
        out += _time_group(spec, M, N, K, [cfg], rounds, stage, log)
    return out


def tune(spec: KernelSpec | str, M: int, N: int, K: int, *, configs: Sequence[dict] | None = None,
         max_configs: int = 32, rounds: int = 5, budget_s: float | None = None, save: bool = True,
         group_size: int = GROUP_SIZE, final_top: int = FINAL_TOP,
         log: Callable[[str], None] | None = None) -> TuneResult:
    """Time ``spec``'s candidate configs at (M, N, K) on the visible GPU and pick the fastest correct one.

    Candidates come from ``select_candidates`` (``configs`` or the step's space; the step's own choice
    always among them). They are timed ``group_size`` at a time, each group one ``bench_shape`` call
    interleaved with cuBLAS (``rounds`` rounds, median per candidate); a candidate whose output is wrong
    (or NaN) is kept in the records with ``correct`` false and never wins. With more than one group, the
    ``final_top`` fastest plus the step's own choice are timed again together and the winner is taken from
    that call, so clock drift between groups cannot decide it. ``budget_s`` (wall-clock seconds) stops
    starting new groups once spent (the first group always runs; the final call is skipped past it).
    With ``save``, the winner is written to this GPU's autotune file (``TuneResult.saved_to``).

    Needs a GPU (``NoGPUError`` otherwise); ``UnsupportedProblem`` if the step cannot be tuned or no
    config runs the shape."""
    from . import bench, registry
    from . import gpu as _gpu

    if isinstance(spec, str):
        spec = registry.get(spec)
    why = tunable(spec)
    if why:
        raise UnsupportedProblem(f"{spec.name} cannot be tuned: {why}")
    if rounds < 1 or group_size < 1:
        raise ValueError("rounds and group_size must be >= 1")
    log = log or (lambda msg: None)
    info = _gpu.gpu_info()
    key = GpuKey.from_info(info)
    sel = select_candidates(spec, M, N, K, key.sm_count, configs=configs, max_configs=max_configs)
    cands, heuristic = sel.configs, sel.heuristic
    if not cands:
        reasons = "; ".join(sorted({why for _, why in sel.skipped})[:4])
        raise UnsupportedProblem(f"{spec.name}: no config runs M={M} N={N} K={K} ({reasons})")
    result = TuneResult(kernel=spec.name, M=M, N=N, K=K, gpu=key, heuristic=heuristic, candidates=cands,
                        skipped=list(sel.skipped))

    start = time.monotonic()
    groups = [cands[i:i + group_size] for i in range(0, len(cands), group_size)]
    over_budget = False
    for i, group in enumerate(groups):
        if i and budget_s is not None and time.monotonic() - start >= budget_s:
            left = [c for g in groups[i:] for c in g]
            result.skipped += [(c, f"not timed: budget of {budget_s:g} s spent") for c in left]
            log(f"budget of {budget_s:g} s spent: {len(left)} candidates not timed")
            over_budget = True
            break
        log(f"group {i + 1}/{len(groups)}: {len(group)} candidates")
        result.records += _time_group(spec, M, N, K, group, rounds, "screen", log)

    timed = [r for r in result.records if _good(r)]
    if len(groups) > 1 and not over_budget and len(timed) > 1 and final_top > 0 and \
            (budget_s is None or time.monotonic() - start < budget_s):
        best = sorted(timed, key=lambda r: r["time_ms"])[:final_top]
        final = [r["config"] for r in best]
        if heuristic is not None and heuristic not in final and any(r["config"] == heuristic for r in timed):
            final.append(heuristic)
        log(f"final: the {len(final)} best together")
        final_recs = _time_group(spec, M, N, K, final, rounds, "final", log)
        result.records += final_recs
    else:
        final_recs = []
    # A config wrong in any call is out, even if another call passed (and never a NaN error).
    wrong = {_config_id(r) for r in result.records if not _checked(r)}
    result.winner = (pick_winner(r for r in final_recs if _config_id(r) not in wrong)
                     or pick_winner(r for r in timed if _config_id(r) not in wrong))

    if save and result.winner is not None:
        w = result.winner
        h = result.heuristic_record()
        entry = {
            "kernel": spec.name, "M": int(M), "N": int(N), "K": int(K), "config": dict(w["config"]),
            "time_ms": w["time_ms"], "tflops": w.get("tflops"), "ratio": w.get("ratio"),
            "heuristic_config": heuristic, "heuristic_time_ms": h.get("time_ms") if h else None,
            "candidates": len(cands), "rounds": rounds,
            "git_sha": w.get("git_sha") or bench.git_sha(),
            "when": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        result.saved_to = save_entry(key, entry)
    return result
