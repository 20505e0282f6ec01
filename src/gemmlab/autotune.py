"""The autotuner: time a step's configs at one shape on this GPU, keep the fastest correct one, persist it.

``tune(spec, M, N, K)`` picks candidates from the step's search space (``KernelSpec.configs()``, the
same space the registry validates), times them with ``gemmlab.bench.bench_shape`` (the one timer:
rotating inputs, CUDA-graph replays, interleaved with cuBLAS, correctness checked first) in groups of
several per call, re-times the best few of every group together in one final call, and returns every
record with the winner. Nothing is ever tuned by editing source: a config is template arguments and
launch-time options chosen from Python.

Results persist per GPU: one JSON file per (GPU name, SM count, driver major version) under
``cache_dir() / "autotune"`` (``GEMMLAB_CACHE_DIR``), with entries keyed by kernel and exact shape::

    {"format": "gemmlab-autotune-1",
     "gpu": {"name": "NVIDIA H200", "sm_count": 132, "driver_major": "570"},
     "entries": {"sgemm.k08_autotuned@4096x4096x4096": {
         "kernel": "sgemm.k08_autotuned", "M": 4096, "N": 4096, "K": 4096,
         "config": {"BM": 128, ...}, "time_ms": 2.71, "tflops": 50.7, "ratio": 0.99,
         "heuristic_config": {...}, "heuristic_time_ms": 3.18, "candidates": 32, "rounds": 5,
         "git_sha": "764a417abcd0", "when": "2025-01-01T00:00:00+00:00"}}}

Writes go to a temporary file in the same folder and ``os.replace`` it (a reader sees the old file or the
new one, never half of one), under an ``flock`` on a side lock file so two processes tuning at once both
keep their entries (without ``fcntl`` the last writer wins, still never a torn file). Reads are tolerant:
an unreadable, truncated or foreign file is ignored with an ``AutotuneCacheWarning`` and replaced on the
next save; a malformed entry is dropped.

``best_config`` (what ``KernelSpec.config_for`` asks first) returns the saved winner for a step and shape
on the visible GPU (or a given one), or None; the answer is remembered per shape until the file changes
(inode, mtime or size), so a repeated lookup is one ``stat``. The Hopper engine (``gemmlab.engine``) asks
it on every call that runs h11: its plan (tile width, split-K count) is h11's config ``{"BN", "SPLITS"}``, and
``engine.plan_for`` takes the winner saved for ``hopper.h11_general`` at exactly (M, N, K) on the
tensors' GPU while the engine can still run it, else ``choose_plan``. h11's ladder launcher runs the
config's plan (``engine.gemm(..., plan=)``) in the nn.Linear layout ``gemmlab.matmul`` sees, so tuning
times what matmul runs; one entry serves bf16 and fp16 (same element size), every epilogue and layout.
A step whose launcher ignored its config would set ``extra["not_tunable"]`` (``tune`` refuses it).
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import math
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .errors import UnsupportedProblem
from .jit.cache import cache_dir, cache_env
from .registry import KernelSpec

FORMAT = "gemmlab-autotune-1"
GROUP_SIZE = 8  # candidates per bench_shape call (plus cuBLAS): enough to share one interleaved run
FINAL_TOP = 4  # the best of the screening groups re-timed together, so the winner is decided in one run


class AutotuneCacheWarning(UserWarning):
    """An autotune file that could not be read (it is ignored and replaced on the next save)."""


# Which GPU a result belongs to --------------------------------------------------------------------------

@dataclass(frozen=True)
class GpuKey:
    """What a tuned result is valid for: the GPU model, its SM count and the driver's major version."""

    name: str
    sm_count: int
    driver_major: str

    @classmethod
    def from_info(cls, info) -> GpuKey:
        """From a ``gemmlab.gpu.GpuInfo`` (``driver`` like ``"570.124.06"``, or ``"unknown"``)."""
        driver = str(getattr(info, "driver", "unknown") or "unknown")
        return cls(name=str(info.name), sm_count=int(info.sm_count), driver_major=driver.split(".", 1)[0])

    def file_name(self) -> str:
        """``<readable slug>-<16 hex of SHA-256>.json``: safe on any filesystem, unique per key."""
        ident = json.dumps([self.name, self.sm_count, self.driver_major])
        digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
        slug = re.sub(r"[^A-Za-z0-9]+", "-", self.name).strip("-")[:40] or "gpu"
        return f"{slug}-{self.sm_count}sm-{digest}.json"

    def describe(self) -> str:
        return f"{self.name} ({self.sm_count} SMs, driver {self.driver_major})"


def current_gpu() -> GpuKey | None:
    """The visible GPU's key, or None without a GPU (never raises for a missing GPU)."""
    import torch

    if not torch.cuda.is_available():
        return None
    from . import gpu

    return GpuKey.from_info(gpu.gpu_info())


def tune_dir() -> Path:
    return cache_dir() / "autotune"


def tuned_path(gpu: GpuKey) -> Path:
    """The file holding ``gpu``'s tuned results."""
    return tune_dir() / gpu.file_name()


def entry_key(kernel: str, M: int, N: int, K: int) -> str:
    """The shape bucket: the exact shape, for now (``nearest_config`` looks around it)."""
    return f"{kernel}@{int(M)}x{int(N)}x{int(K)}"


# Reading and writing the files ------------------------------------------------------------------------

def _warn(path: Path, why: str) -> None:
    warnings.warn(f"autotune results {path}: {why}; ignoring the file (it is rewritten on the next save)",
                  AutotuneCacheWarning, stacklevel=3)


def _valid_entry(e) -> bool:
    return (isinstance(e, dict) and isinstance(e.get("kernel"), str)
            and all(isinstance(e.get(d), int) and e[d] >= 1 for d in ("M", "N", "K"))
            and isinstance(e.get("config"), dict)
            and all(isinstance(k, str) and isinstance(v, int) for k, v in e["config"].items()))


def _parse(path: Path, blob: bytes) -> dict:
    """The file's ``{"gpu": ..., "entries": ...}``; an empty one (with a warning) if it cannot be read."""
    empty = {"gpu": None, "entries": {}}
    try:
        doc = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        _warn(path, f"not valid JSON ({type(e).__name__}: {e})")
        return empty
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("entries"), dict):
        fmt = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        _warn(path, f"not a {FORMAT} file (format {fmt!r})")
        return empty
    entries = {k: e for k, e in doc["entries"].items() if _valid_entry(e)}
    if len(entries) != len(doc["entries"]):
        warnings.warn(f"autotune results {path}: dropped {len(doc['entries']) - len(entries)} malformed "
                      "entries", AutotuneCacheWarning, stacklevel=3)
    gpu = doc.get("gpu") if isinstance(doc.get("gpu"), dict) else None
    return {"gpu": gpu, "entries": entries}


def _read(path: Path) -> dict:
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return {"gpu": None, "entries": {}}
    except OSError as e:
        _warn(path, f"cannot be read ({e})")
        return {"gpu": None, "entries": {}}
    return _parse(path, blob)


_MEMO: dict[Path, tuple[tuple[int, int, int], dict]] = {}


def load(path: Path) -> dict:
    """The parsed file (``{"gpu": {...} or None, "entries": {key: entry}}``), cached in memory until the
    file changes (inode, mtime or size). Never raises for a missing or damaged file. Do not mutate."""
    path = Path(path).absolute()
    try:
        st = path.stat()
    except OSError:
        _MEMO.pop(path, None)
        return {"gpu": None, "entries": {}}
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    hit = _MEMO.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    doc = _read(path)
    _MEMO[path] = (stamp, doc)
    return doc


@contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path``'s side lock file, where the platform has ``flock``."""
    try:
        import fcntl
    except ImportError:  # no flock: last writer wins (each write is still atomic)
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def _write_atomic(path: Path, doc: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


SAVES = 0  # entries saved by this process (whoever keeps decisions made from the files compares it)


def tuned_file_stamp(gpu: GpuKey) -> tuple:
    """(path, inode, mtime, size) of ``gpu``'s tuned-config file, or (path, None) when there is none: what
    changes when any process saves a config for that GPU."""
    path = _tuned_file(cache_env(), gpu)
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)
    return (path, st.st_ino, st.st_mtime_ns, st.st_size)


def save_entry(gpu: GpuKey, entry: dict) -> Path:
    """Add or replace ``entry`` (needs ``kernel``, ``M``, ``N``, ``K``, ``config``) in ``gpu``'s file.

    Read-modify-write under the lock, written atomically; a damaged file is replaced. Returns the path."""
    if not _valid_entry(entry):
        raise ValueError(f"not an autotune entry (needs kernel, M, N, K >= 1 and an int config): {entry!r}")
    path = tuned_path(gpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        entries = dict(_read(path)["entries"])
        entries[entry_key(entry["kernel"], entry["M"], entry["N"], entry["K"])] = entry
        _write_atomic(path, {"format": FORMAT, "gpu": asdict(gpu), "entries": entries})
    global SAVES
    SAVES += 1
    return path


def saved_entries(gpu: GpuKey | None = None) -> list[tuple[dict, Path, dict]]:
    """``(gpu fields, file, entry)`` for every saved entry: of ``gpu``'s file, or of every file when
    ``gpu`` is None (damaged files are skipped with a warning). Sorted by GPU, kernel and shape."""
    paths = [tuned_path(gpu)] if gpu is not None else sorted(tune_dir().glob("*.json"))
    out = []
    for path in paths:
        doc = load(path)
        ident = doc["gpu"] or (asdict(gpu) if gpu is not None else {"name": "?", "sm_count": 0,
                                                                   "driver_major": "?"})
        for entry in doc["entries"].values():
            out.append((ident, path, entry))
    out.sort(key=lambda t: (str(t[0].get("name")), str(t[2]["kernel"]), t[2]["M"], t[2]["N"], t[2]["K"]))
    return out


# Lookups ------------------------------------------------------------------------------------------------

def _usable(spec: KernelSpec, M: int, N: int, K: int, entry: dict | None) -> dict | None:
    """The entry's config if it still resolves (the step's choices may have changed since) and runs the
    shape; else None."""
    if entry is None or entry.get("kernel") != spec.name:
        return None
    try:
        cfg = spec.resolve(entry["config"])
        if spec.why_unsupported(M, N, K, cfg) is not None:
            return None
    except UnsupportedProblem:
        return None
    return cfg


def _gpu_for(sm_count: int | None) -> GpuKey | None:
    gpu = current_gpu()
    if gpu is None or (sm_count is not None and int(sm_count) != gpu.sm_count):
        return None  # no GPU, or the caller asks about another device (e.g. the model's H200 profile)
    return gpu


_FOUND: dict[tuple, tuple] = {}  # (file, step, M, N, K) -> (the file's stamp, the spec, config or None)
_FOUND_MAX = 4096


def best_config(spec: KernelSpec, M: int, N: int, K: int, sm_count: int | None = None, *,
                gpu: GpuKey | None = None) -> dict[str, int] | None:
    """The config ``gemmlab tune`` saved for ``spec`` at exactly (M, N, K) on ``gpu`` (default: the visible
    GPU), or None: no GPU, ``sm_count`` given and not that GPU's, nothing saved, or a saved config that no
    longer resolves or runs the shape.

    On the engine's path for every eager call, so it is kept cheap: the answer is remembered per shape
    until the file changes (inode, mtime or size), and a repeated lookup is one ``stat`` (~3 us)."""
    if gpu is None:
        gpu = _gpu_for(sm_count)
    elif sm_count is not None and int(sm_count) != gpu.sm_count:
        return None
    if gpu is None:
        return None
    path = _tuned_file(cache_env(), gpu)
    try:
        st = os.stat(path)
    except OSError:
        return None
    stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    key = (path, spec.name, M, N, K)
    hit = _FOUND.get(key)
    if hit is None or hit[0] != stamp or hit[1] is not spec:
        entry = load(Path(path))["entries"].get(entry_key(spec.name, M, N, K))
        hit = (stamp, spec, _usable(spec, M, N, K, entry))
        if len(_FOUND) >= _FOUND_MAX:  # shapes without end (e.g. every sequence length): start over
            _FOUND.clear()
        _FOUND[key] = hit
    return dict(hit[2]) if hit[2] is not None else None


@functools.lru_cache(maxsize=64)
def _tuned_file(env: tuple, gpu: GpuKey) -> str:
    """``tuned_path(gpu)`` as a string, remembered per ``cache_env()`` (building it costs ~8 us)."""
    return os.fspath(tuned_path(gpu))


_DEVICE_GPU: dict[int, GpuKey] = {}


def device_gpu(index: int) -> GpuKey:
    """The key of CUDA device ``index``, read once per process: whose results the engine looks up."""
    key = _DEVICE_GPU.get(index)
    if key is None:
        from . import gpu

        key = _DEVICE_GPU[index] = GpuKey.from_info(gpu.gpu_info(index))
    return key


def nearest_config(spec: KernelSpec, M: int, N: int, K: int, sm_count: int | None = None, *,
                   max_distance: float = 1.0) -> tuple[dict[str, int], tuple[int, int, int]] | None:
    """The saved config of the nearest tuned shape for ``spec`` on the visible GPU, with that shape.

    Distance is ``sum(|log2(x / x_tuned)|)`` over M, N, K (a factor of two in one dimension is 1.0); only
    entries within ``max_distance`` whose config runs (M, N, K) count. Not used by ``config_for``: a
    neighbour's winner is a hint (e.g. a tuning starting point), not a measurement at this shape."""
    gpu = _gpu_for(sm_count)
    if gpu is None:
        return None
    best, best_d = None, math.inf
    for entry in load(tuned_path(gpu))["entries"].values():
        if entry["kernel"] != spec.name:
            continue
        d = sum(abs(math.log2(x / entry[n])) for x, n in ((M, "M"), (N, "N"), (K, "K")))
        cfg = _usable(spec, M, N, K, entry) if d <= max_distance and d < best_d else None
        if cfg is not None:
            best, best_d = (cfg, (entry["M"], entry["N"], entry["K"])), d
    return best


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
