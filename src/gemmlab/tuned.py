"""Tuned configs on disk: which config ``gemmlab tune`` found fastest for a kernel at a shape on a GPU.

The store half of the autotuner (``gemmlab.autotune`` times candidates and calls ``save_entry``): the
runtime reads it (``engine.plan_for``, ``KernelSpec.config_for``) without importing anything that times,
compiles or registers kernels. A *spec* here is anything with ``name``, ``resolve(config)`` and
``why_unsupported(M, N, K, config)`` (a ``kernelspec.KernelSpec``).

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

``best_config`` returns the saved winner for a spec and shape on the visible GPU (or a given one), or
None; the answer is remembered per shape until the file changes (inode, mtime or size), so a repeated
lookup is one ``stat``. ``saved_config`` is the same lookup for callers that check a config themselves
(the engine: its plan is h11's config ``{"BN", "SPLITS"}``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import re
import tempfile
import warnings
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import UnsupportedProblem
from .jit.cache import cache_dir, cache_env

FORMAT = "gemmlab-autotune-1"


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

def _usable(spec, M: int, N: int, K: int, entry: dict | None) -> dict | None:
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


def best_config(spec, M: int, N: int, K: int, sm_count: int | None = None, *,
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


def nearest_config(spec, M: int, N: int, K: int, sm_count: int | None = None, *,
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


def saved_config(kernel: str, M: int, N: int, K: int, gpu: GpuKey) -> dict | None:
    """The config saved for ``kernel`` at exactly (M, N, K) in ``gpu``'s file, as saved (the caller checks
    that it still runs), or None. One ``stat`` per call; the file is parsed again only when it changed."""
    path = _tuned_file(cache_env(), gpu)
    try:
        os.stat(path)
    except OSError:
        return None
    entry = load(Path(path))["entries"].get(entry_key(kernel, M, N, K))
    return dict(entry["config"]) if entry is not None else None
