"""Compile CUDA C++ kernels with NVRTC (through ``cuda.core.Program``), cache the cubin, keep the log.

A kernel is named by a source file under ``gemmlab/kernels`` and a name expression that instantiates
its template (``"sgemm_naive<32>"``). ``compile_kernel`` works without a GPU; ``CompiledKernel.load``
needs one.
"""

from __future__ import annotations

import io
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CompileError, NoGPUError
from ..log import logger
from . import cache as _cache
from .toolchain import cuda_include_dir, nvrtc_version

KERNEL_ROOT = Path(__file__).resolve().parent.parent / "kernels"
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


@dataclass(frozen=True)
class Resources:
    """What ptxas reported for one kernel (``-v``): per-thread registers, spills, stack, static smem."""

    registers: int
    spill_stores: int
    spill_loads: int
    stack_frame: int
    static_shared: int
    barriers: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


_RES_PATTERNS = {
    "registers": r"Used (\d+) registers",
    "barriers": r"used (\d+) barriers",
    "static_shared": r"(\d+) bytes smem",
    "stack_frame": r"(\d+) bytes stack frame",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
}


def parse_resources(log: str, mangled_name: str) -> Resources:
    """Read the ptxas ``-v`` lines that belong to ``mangled_name`` out of an NVRTC log."""
    # ptxas prints one block per entry; keep the part after this entry's "Compiling entry" line
    # (warnings that name the function can come before it).
    start = log.find(f"Compiling entry function '{mangled_name}'")
    part = log[start:] if start >= 0 else log
    nxt = part.find("Compiling entry function", 1)
    if nxt > 0:
        part = part[:nxt]
    values = {}
    for key, pat in _RES_PATTERNS.items():
        m = re.search(pat, part)
        values[key] = int(m.group(1)) if m else 0
    return Resources(**values)


def collect_sources(relpath: str) -> dict[str, str]:
    """The kernel file and every header it includes (recursively), keyed by path under kernels/."""
    out: dict[str, str] = {}
    todo = [relpath]
    while todo:
        rel = todo.pop()
        if rel in out:
            continue
        path = KERNEL_ROOT / rel
        if not path.is_file():
            raise CompileError(f"kernel source {rel!r} not found under {KERNEL_ROOT}")
        text = path.read_text()
        out[rel] = text
        for inc in _INCLUDE_RE.findall(text):
            # Includes resolve against the including file's folder, then kernels/ (like -I kernels).
            cand = (path.parent / inc).resolve()
            if not cand.is_file():
                cand = (KERNEL_ROOT / inc).resolve()
            todo.append(str(cand.relative_to(KERNEL_ROOT)))
    return out


@dataclass
class CompiledKernel:
    """A compiled kernel: the cubin, its mangled entry name, the NVRTC log and its resources."""

    name: str
    source: str
    name_expression: str
    arch: str
    cubin: bytes
    mangled_name: str
    log: str
    resources: Resources
    cache_status: str  # "hit", "miss" or "rebuilt" (a corrupted entry was replaced)
    seconds: float
    _loaded: dict = field(default_factory=dict, repr=False)

    def load(self, device_index: int | None = None):
        """The ``cuda.core.Kernel`` on a device (loads the module once per device)."""
        from . import launch as _launch

        dev = _launch.current_device(device_index)
        kern = self._loaded.get(dev.device_id)
        if kern is None:
            from cuda.core import ObjectCode

            obj = ObjectCode.from_cubin(self.cubin, name=self.name,
                                        symbol_mapping={self.name_expression: self.mangled_name.encode()})
            try:
                kern = obj.get_kernel(self.name_expression)
            except Exception as e:  # noqa: BLE001 - re-raised with context
                raise NoGPUError(f"{self.name}: cannot load the {self.arch} cubin on "
                                 f"{dev.name}: {e}") from e
            self._loaded[dev.device_id] = kern
        return kern


_MEMORY: dict[str, CompiledKernel] = {}
_FAST: dict[tuple, CompiledKernel] = {}
_LOCK = threading.Lock()


def compile_kernel(source: str, name_expression: str, *, arch: str, name: str | None = None,
                   defines: dict[str, str] | None = None, cache_path: Path | None = None,
                   use_disk_cache: bool = True) -> CompiledKernel:
    """Compile ``name_expression`` from ``kernels/<source>`` for ``arch`` (e.g. ``"sm_90a"``).

    The result is memoised in-process and cached on disk (see ``gemmlab.jit.cache``): in ``cache_path``
    when given, else in the ``GEMMLAB_CACHE_DIR`` search path; not on disk with ``use_disk_cache=False``
    or ``GEMMLAB_DISK_CACHE=0``. A cache folder that cannot be read or written never fails the compile.
    """
    from cuda.core import Program, ProgramOptions

    name = name or name_expression
    defines = dict(sorted((defines or {}).items()))
    # Fast path for launches: one dict lookup. (Sources edited while a process runs are not re-read.)
    fast_key = (source, name_expression, arch, tuple(defines.items()), str(cache_path), use_disk_cache)
    hit = _FAST.get(fast_key)
    if hit is not None:
        return hit
    sources = collect_sources(source)
    options = ProgramOptions(
        name=source,
        arch=arch,
        std="c++17",
        include_path=[str(KERNEL_ROOT), str((KERNEL_ROOT / source).parent), cuda_include_dir()],
        ptxas_options=["-v"],
        define_macro=[(k, v) for k, v in defines.items()] or None,
    )
    opt_fingerprint = (arch, "c++17", "-v", tuple(defines.items()))
    key = _cache.cache_key(sources=sources, options=opt_fingerprint, arch=arch,
                           name_expression=name_expression, nvrtc_version=nvrtc_version())
    mem_key = f"{cache_path}:{key}"
    with _LOCK:
        hit = _MEMORY.get(mem_key)
    if hit is not None:
        _FAST[fast_key] = hit
        return hit

    t0 = time.perf_counter()
    disk = _cache.DiskCache(cache_path) if use_disk_cache and _cache.disk_cache_enabled() else None
    status = "miss"
    entry = None
    if disk is not None:
        try:
            entry = disk.get(key)
        except _cache.CorruptEntry:  # (DiskCache.get has discarded it where the folder allows)
            status = "rebuilt"
    if entry is not None:
        status = "hit"
    else:
        log = io.StringIO()
        prog = Program(sources[source], "c++", options=options)
        try:
            obj = prog.compile("cubin", name_expressions=[name_expression], logs=log)
        except Exception as e:  # noqa: BLE001 - NVRTC errors carry the log
            raise CompileError(f"{name}: NVRTC failed for {arch}:\n{e}\n{log.getvalue()}") from e
        mangled = obj.symbol_mapping[name_expression]
        if isinstance(mangled, bytes):
            mangled = mangled.decode()
        entry = _cache.CacheEntry(cubin=bytes(obj.code), mangled_name=mangled, log=log.getvalue())
        if disk is not None:
            disk.put(key, entry)
    compiled = CompiledKernel(
        name=name, source=source, name_expression=name_expression, arch=arch, cubin=entry.cubin,
        mangled_name=entry.mangled_name, log=entry.log,
        resources=parse_resources(entry.log, entry.mangled_name), cache_status=status,
        seconds=time.perf_counter() - t0,
    )
    with _LOCK:
        _MEMORY[mem_key] = compiled
        _FAST[fast_key] = compiled
    logger.debug("compiled %s for %s: cache %s in %.3f s", name, arch, status, compiled.seconds)
    if status != "hit":
        logger.info("compiled %s (%.2f s)", name, compiled.seconds)
    return compiled


def clear_memory_cache() -> None:
    """Forget in-process compiled kernels (tests use this to reach the disk cache)."""
    with _LOCK:
        _MEMORY.clear()
        _FAST.clear()
