"""Launch compiled kernels on PyTorch's current stream, with checked CUDA calls.

Everything here needs a GPU; every entry point says so clearly (``NoGPUError``) when there is none.
"""

from __future__ import annotations

import functools
from collections import OrderedDict

import numpy as np
import torch

from ..errors import LaunchError, NoGPUError


def require_gpu(what: str = "this operation", min_capability: tuple[int, int] | None = None) -> None:
    """Raise ``NoGPUError`` with a clear message if no (suitable) CUDA GPU is visible."""
    if not torch.cuda.is_available():
        raise NoGPUError(f"{what} needs an NVIDIA GPU, and torch sees none "
                         f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). "
                         "The compile, SASS and model tools work without one.")
    if min_capability is not None:
        cap = torch.cuda.get_device_capability()
        if cap < min_capability:
            name = torch.cuda.get_device_name()
            raise NoGPUError(f"{what} needs compute capability >= {min_capability[0]}.{min_capability[1]}; "
                             f"{name} is {cap[0]}.{cap[1]}")


@functools.lru_cache(maxsize=None)
def _device(index: int):
    from cuda.core import Device

    dev = Device(index)
    dev.set_current()  # the primary context, the one torch uses
    return dev


def current_device(index: int | None = None):
    """The ``cuda.core.Device`` for ``index`` (default: torch's current device), made current."""
    require_gpu("loading a kernel")
    if index is None:
        index = torch.cuda.current_device()
    dev = _device(index)
    dev.set_current()
    return dev


_STREAMS: dict[tuple[int, int], object] = {}


def torch_stream(device_index: int | None = None):
    """A ``cuda.core.Stream`` wrapping torch's current stream (works during graph capture)."""
    ts = torch.cuda.current_stream(device_index)
    key = (ts.device.index, ts.cuda_stream)
    s = _STREAMS.get(key)
    if s is None:
        dev = current_device(ts.device.index)
        s = dev.create_stream(ts)
        _STREAMS[key] = s
    return s


def _set_max_dynamic_smem(kernel, nbytes: int, device_id: int, name: str) -> None:
    from cuda.bindings import driver

    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        dev = driver.CUdevice(device_id)
        (err,) = driver.cuKernelSetAttribute(attr, nbytes, handle, dev)
    else:
        (err,) = driver.cuFuncSetAttribute(handle, attr, nbytes)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"{name}: setting max dynamic shared memory to {nbytes} B failed: {err}")


_SMEM_SET: set[tuple[int, int, int]] = set()


def prepare(compiled, smem: int, device_id: int):
    """The loaded kernel, allowed ``smem`` bytes of dynamic shared memory (needed above 48 KB, and before
    an occupancy query about such a launch)."""
    kernel = compiled.load(device_id)
    if smem > 48 * 1024:
        key = (id(kernel), device_id, smem)
        if key not in _SMEM_SET:
            _set_max_dynamic_smem(kernel, smem, device_id, compiled.name)
            _SMEM_SET.add(key)
    return kernel


def launch(compiled, *, grid, block, args, smem: int = 0, cluster=None) -> None:
    """Launch ``compiled`` (a ``CompiledKernel``) on torch's current stream.

    ``grid`` counts blocks (also with clusters: it is divided by the cluster shape here).
    ``args`` are passed as given: tensors become their data pointers, Python floats become fp32;
    wrap integers in ``np.int32``/``np.int64`` (a bare int is packed as a pointer).
    """
    from cuda.core import LaunchConfig
    from cuda.core import launch as _cc_launch

    dev = current_device()
    kernel = prepare(compiled, smem, dev.device_id)
    grid = tuple(grid) if isinstance(grid, (tuple, list)) else (int(grid),)
    if cluster is not None:
        cluster = tuple(cluster) if isinstance(cluster, (tuple, list)) else (int(cluster),)
        for g, c in zip(grid, cluster):
            if g % c:
                raise LaunchError(f"{compiled.name}: grid {grid} is not a multiple of cluster {cluster}")
        grid = tuple(g // c for g, c in zip(grid, cluster)) + grid[len(cluster):]
    packed = []
    for a in args:
        if isinstance(a, torch.Tensor):
            packed.append(a.data_ptr())
        elif isinstance(a, float):
            packed.append(np.float32(a))
        elif isinstance(a, bool):
            packed.append(np.int32(a))
        else:
            packed.append(a)
    cfg = LaunchConfig(grid=grid, block=block, shmem_size=smem, cluster=cluster)
    try:
        _cc_launch(torch_stream(), cfg, kernel, *packed)
    except Exception as e:  # noqa: BLE001 - re-raised with the kernel's name
        raise LaunchError(f"{compiled.name}: launch failed (grid={grid}, block={block}, smem={smem}, "
                          f"cluster={cluster}): {e}") from e


_CLUSTERS: dict[tuple[int, int, int, int, int], int] = {}


def max_active_clusters(compiled, *, block: int, smem: int, cluster: int) -> int:
    """How many clusters of ``cluster`` CTAs (``block`` threads, ``smem`` bytes of dynamic shared memory
    each) the current GPU can hold at once (the driver's occupancy query, through cuda-core). Cached."""
    from cuda.core import LaunchConfig

    dev = current_device()
    kernel = prepare(compiled, smem, dev.device_id)
    key = (id(kernel), dev.device_id, block, smem, cluster)
    if key not in _CLUSTERS:
        cfg = LaunchConfig(grid=(1,), block=block, shmem_size=smem, cluster=(cluster,))
        try:
            n = kernel.occupancy.max_active_clusters(cfg, stream=torch_stream())
        except Exception as e:  # noqa: BLE001 - re-raised with the kernel's name
            raise LaunchError(f"{compiled.name}: occupancy query for clusters of {cluster} failed: {e}") from e
        _CLUSTERS[key] = int(n)
    return _CLUSTERS[key]


# TMA descriptors ---------------------------------------------------------------------------------

_TMA_CACHE: OrderedDict = OrderedDict()
_TMA_CACHE_SIZE = 256


def tensor_map_2d(t: torch.Tensor, box: tuple[int, int], *, swizzle_bytes: int = 128):
    """A TMA descriptor for a 2-D tensor whose last dimension is contiguous.

    ``box`` is (rows, cols) in elements, in the tensor's own (row-major) order. The descriptor is cached
    by (pointer, shape, strides, dtype, box, swizzle), so the same tensor reuses it.
    """
    from cuda.core.utils import StridedMemoryView

    if t.dim() != 2 or t.stride(1) != 1:
        raise LaunchError(f"tensor_map_2d needs a 2-D tensor with unit inner stride, got shape "
                          f"{tuple(t.shape)} strides {t.stride()}")
    if (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
        raise LaunchError("TMA needs 16-byte aligned rows and base pointer")
    key = (t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, tuple(box), swizzle_bytes, t.device.index)
    desc = _TMA_CACHE.get(key)
    if desc is not None:
        _TMA_CACHE.move_to_end(key)
        return desc
    import ml_dtypes
    from cuda.core._tensor_map import TensorMapSwizzle

    dtypes = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16, torch.float32: np.float32}
    swz = {0: TensorMapSwizzle.NONE, 32: TensorMapSwizzle.SWIZZLE_32B, 64: TensorMapSwizzle.SWIZZLE_64B,
           128: TensorMapSwizzle.SWIZZLE_128B}[swizzle_bytes]
    from_dlpack = getattr(StridedMemoryView, "from_dlpack", None)
    view = from_dlpack(t, stream_ptr=-1) if from_dlpack else StridedMemoryView(t, stream_ptr=-1)
    try:
        desc = view.as_tensor_map(box_dim=tuple(box), data_type=dtypes[t.dtype], swizzle=swz)
    except Exception as e:  # noqa: BLE001
        raise LaunchError(f"building a TMA descriptor for shape {tuple(t.shape)} box {box} failed: {e}") from e
    _TMA_CACHE[key] = desc
    if len(_TMA_CACHE) > _TMA_CACHE_SIZE:
        _TMA_CACHE.popitem(last=False)
    return desc
