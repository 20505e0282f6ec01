"""Where the CUDA pieces live: headers for NVRTC, the nvdisasm binary, the NVRTC version.

Nothing here is hard-coded to one machine: each lookup tries an environment override, then the
PyPI wheels (``nvidia/cu13/...``), then a CUDA toolkit (``CUDA_HOME``/``CUDA_PATH``, ``/usr/local/cuda``).
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

from ..errors import ToolchainError

_MARKER_HEADER = "cuda_bf16.h"


def _wheel_roots() -> list[Path]:
    roots = []
    try:
        import nvidia  # namespace package of NVIDIA's PyPI wheels

        for base in nvidia.__path__:
            for sub in ("cu13", "cu12", "cuda_runtime", "cuda_nvcc"):
                roots.append(Path(base) / sub)
    except ImportError:
        pass
    return roots


def _toolkit_roots() -> list[Path]:
    roots = [Path(os.environ[v]) for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)]
    roots.append(Path("/usr/local/cuda"))
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(nvcc).resolve().parent.parent)
    return roots


@functools.lru_cache(maxsize=None)
def cuda_include_dir() -> str:
    """The folder holding ``cuda_bf16.h`` and friends, for NVRTC's include path.

    ``GEMMLAB_CUDA_INCLUDE`` overrides the search.
    """
    override = os.environ.get("GEMMLAB_CUDA_INCLUDE")
    candidates = [Path(override)] if override else []
    candidates += [r / "include" for r in _wheel_roots() + _toolkit_roots()]
    for c in candidates:
        if (c / _MARKER_HEADER).is_file():
            return str(c)
    raise ToolchainError(
        f"no CUDA header folder with {_MARKER_HEADER} found (looked in: "
        + ", ".join(str(c) for c in candidates)
        + "). Install the 'nvidia-cuda-runtime' wheel or set GEMMLAB_CUDA_INCLUDE."
    )


@functools.lru_cache(maxsize=None)
def nvdisasm_path() -> str:
    """The nvdisasm executable: ``GEMMLAB_NVDISASM``, the PyPI wheel, PATH, or a toolkit."""
    override = os.environ.get("GEMMLAB_NVDISASM")
    candidates = [Path(override)] if override else []
    candidates += [r / "bin" / "nvdisasm" for r in _wheel_roots()]
    found = shutil.which("nvdisasm")
    if found:
        candidates.append(Path(found))
    candidates += [r / "bin" / "nvdisasm" for r in _toolkit_roots()]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return str(c)
    raise ToolchainError(
        "nvdisasm not found: install the 'nvidia-cuda-nvdisasm' wheel or set GEMMLAB_NVDISASM."
    )


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor), part of every cache key."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:  # pragma: no cover - dependency missing
        raise ToolchainError(f"cuda-bindings is not importable: {e}") from e
    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"nvrtcVersion failed: {err}")
    return int(major), int(minor)
