"""Launch compiled kernels on PyTorch's current stream, with checked CUDA calls.

Two ways to launch:

- ``launch(compiled, grid=..., block=..., args=...)``: cuda-core's ``launch``, which packs the arguments
  anew on every call. Simple; what the ladder steps use. About 20 us of host time per call on the H200's
  host (benchmarks/results/eager.jsonl, "mechanisms").
- ``Launcher``: one kernel at one launch shape with its parameter block built once; a call writes only the
  values that changed (pointers, scalars, a descriptor's address) and calls the driver's
  ``cuLaunchKernel``/``cuLaunchKernelEx`` with the block's address. About 4.5 us per call. What the
  engine behind ``gemmlab.matmul`` uses, since its eager calls must cost no more than ``torch.mm``'s.

Everything here needs a GPU; every entry point says so clearly (``NoGPUError``) when there is none.
"""

from __future__ import annotations

import functools
import os
import threading
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

# L2 promotion of every TMA descriptor the package encodes, in bytes (0: none, 64, 128, 256): how much
# the L2 fetches from DRAM around each request a box makes. Read once from GEMMLAB_TMA_L2_PROMOTION so
# a benchmark can compare settings in separate processes.
_L2_PROMOTION_BYTES = (0, 64, 128, 256)


def _l2_promotion_from_env() -> int:
    raw = os.environ.get("GEMMLAB_TMA_L2_PROMOTION", "0").strip().lower().removesuffix("b")
    value = 0 if raw in ("", "none") else int(raw) if raw.isdigit() else -1
    if value not in _L2_PROMOTION_BYTES:
        raise ValueError(f"GEMMLAB_TMA_L2_PROMOTION must be one of none, 64, 128, 256; got "
                         f"{os.environ['GEMMLAB_TMA_L2_PROMOTION']!r}")
    return value


L2_PROMOTION = _l2_promotion_from_env()

# Programmatic dependent launch for the launchers that ask for it (``Launcher(pdl=True)``: kernels that
# call ``pdl_wait()`` before touching global memory, kernels/common/ptx.cuh). GEMMLAB_PDL=0 launches them
# plainly (read once, so a benchmark compares the two in separate processes).
PDL = os.environ.get("GEMMLAB_PDL", "1").strip().lower() not in ("0", "off", "false", "no")


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

    dtypes = {torch.bfloat16: ml_dtypes.bfloat16, torch.float16: np.float16, torch.float32: np.float32,
              torch.uint8: np.uint8}  # uint8: fp8 operands, passed as a byte view (the TMA copies bytes)
    swz = {0: TensorMapSwizzle.NONE, 32: TensorMapSwizzle.SWIZZLE_32B, 64: TensorMapSwizzle.SWIZZLE_64B,
           128: TensorMapSwizzle.SWIZZLE_128B}[swizzle_bytes]
    from_dlpack = getattr(StridedMemoryView, "from_dlpack", None)
    view = from_dlpack(t, stream_ptr=-1) if from_dlpack else StridedMemoryView(t, stream_ptr=-1)
    extra = {}
    if L2_PROMOTION:
        from cuda.core._tensor_map import TensorMapL2Promotion

        extra["l2_promotion"] = getattr(TensorMapL2Promotion, f"L2_{L2_PROMOTION}B")
    try:
        desc = view.as_tensor_map(box_dim=tuple(box), data_type=dtypes[t.dtype], swizzle=swz, **extra)
    except Exception as e:  # noqa: BLE001
        raise LaunchError(f"building a TMA descriptor for shape {tuple(t.shape)} box {box} failed: {e}") from e
    _TMA_CACHE[key] = desc
    if len(_TMA_CACHE) > _TMA_CACHE_SIZE:
        _TMA_CACHE.popitem(last=False)
    return desc


# The driver path: prebuilt parameter blocks ------------------------------------------------------------

def raw_stream(device_index: int) -> int:
    """The handle of torch's current stream on ``device_index`` (0.1 us, against ~4.5 us for
    ``torch.cuda.current_stream().cuda_stream``, which builds a Python stream object)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


_TMA_DTYPES = {torch.bfloat16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16", torch.float16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
               torch.float32: "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
               torch.uint8: "CU_TENSOR_MAP_DATA_TYPE_UINT8"}  # uint8: fp8 operands as bytes (the TMA copies bytes)


def encode_tensor_map(ptr: int, rows: int, cols: int, row_stride_elems: int, dtype: torch.dtype,
                      box: tuple[int, int], *, swizzle_bytes: int = 128):
    """A 2-D TMA descriptor (``driver.CUtensorMap``) for a row-major (rows, cols) tensor at ``ptr`` whose
    rows are ``row_stride_elems`` apart, loaded in (box rows, box cols) boxes with the given swizzle.

    The same descriptor ``tensor_map_2d`` gets from cuda-core (``L2_PROMOTION``, zero fill past the
    edges), encoded by the driver directly: ~3.4 us instead of ~13, and its address can later be replaced
    in place (``cuTensorMapReplaceAddress``, ~0.8 us), which cuda-core's descriptor offers only through a
    new memory view of the tensor."""
    from cuda.bindings import driver

    es = _ELEM_SIZE[dtype]
    if ptr % 16 or (row_stride_elems * es) % 16:
        raise LaunchError("TMA needs 16-byte aligned rows and base pointer")
    swz = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B", 64: "CU_TENSOR_MAP_SWIZZLE_64B",
           128: "CU_TENSOR_MAP_SWIZZLE_128B"}[swizzle_bytes]
    u64, u32 = driver.cuuint64_t, driver.cuuint32_t
    err, tmap = driver.cuTensorMapEncodeTiled(
        getattr(driver.CUtensorMapDataType, _TMA_DTYPES[dtype]), 2, ptr,
        [u64(cols), u64(rows)], [u64(row_stride_elems * es)], [u32(box[1]), u32(box[0])], [u32(1), u32(1)],
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, getattr(driver.CUtensorMapSwizzle, swz),
        getattr(driver.CUtensorMapL2promotion,
                f"CU_TENSOR_MAP_L2_PROMOTION_L2_{L2_PROMOTION}B" if L2_PROMOTION else "CU_TENSOR_MAP_L2_PROMOTION_NONE"),
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"encoding a TMA descriptor for ({rows}, {cols}) rows of {row_stride_elems} "
                          f"elements, box {box}, failed: {err}")
    return tmap


_ELEM_SIZE = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4, torch.uint8: 1}


class Launcher:
    """``compiled`` at one launch shape, launched through the driver from a parameter block built once.

    ``kinds`` names each kernel parameter in order: ``"ptr"`` (a device pointer), ``"i32"``, ``"i64"``,
    ``"f32"`` or ``"tmap"`` (a ``__grid_constant__ CUtensorMap`` passed by value). Every parameter has an
    8-byte slot (a descriptor has its own 128 bytes, see ``set_map``) and the driver reads each through
    the array of slot addresses, so a call sets what changed (``set_*``) and launches (``launch``).
    ``grid`` counts blocks, also with clusters (it is divided by the cluster shape here).

    The block is host memory that the driver copies at launch (CUDA's kernel parameters are copied when a
    launch is enqueued, so the next call may overwrite it at once); a lock makes set-and-launch atomic
    for callers that share a launcher across threads (``locked``).

    ``pdl``: launch with programmatic dependent launch (``PDL``), for kernels that call ``pdl_wait()``
    before any global access: the kernel's CTAs may be scheduled while the previous kernel on the stream
    finishes, which hides part of the gap between back-to-back launches."""

    def __init__(self, compiled, kinds, *, grid, block: int, smem: int = 0, cluster: int | None = None,
                 device_index: int, pdl: bool = False):
        import numpy as np

        from cuda.bindings import driver

        self.name = compiled.name
        self.kinds = tuple(kinds)
        self.kernel = prepare(compiled, smem, device_index)
        self.handle = self.kernel.handle
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (int(grid),)
        grid = grid + (1,) * (3 - len(grid))
        if cluster is not None and cluster > 1:
            if grid[0] % cluster:
                raise LaunchError(f"{self.name}: grid {grid} is not a multiple of cluster {cluster}")
        self.grid, self.block, self.smem, self.cluster = grid, int(block), int(smem), cluster
        self.pdl = bool(pdl and PDL)
        self.device_index = device_index
        n = len(self.kinds)
        self._slots = np.zeros(max(1, n), dtype=np.uint64)
        self._i64 = self._slots.view(np.int64)
        self._i32 = self._slots.view(np.int32)
        self._f32 = self._slots.view(np.float32)
        base = self._slots.ctypes.data
        self._addrs = np.array([base + 8 * i for i in range(max(1, n))], dtype=np.uint64)
        self._params = int(self._addrs.ctypes.data)
        self._maps: list = [None] * n
        self.lock = threading.Lock()
        self._success = driver.CUresult.CUDA_SUCCESS
        self._launch_plain = driver.cuLaunchKernel
        self._launch_ex = driver.cuLaunchKernelEx
        self._config = None
        attrs = []
        if cluster is not None and cluster > 1:
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster, 1, 1
            attrs.append(attr)
        if self.pdl:
            # The kernel may start while the one before it on the stream finishes (its pdl_wait() holds
            # every global access until that one has completed).
            attr = driver.CUlaunchAttribute()
            attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        if attrs:
            cfg = driver.CUlaunchConfig()
            # With a cluster attribute, the grid is still given in blocks (a multiple of the cluster).
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block, 1, 1
            cfg.sharedMemBytes = self.smem
            cfg.attrs = attrs
            cfg.numAttrs = len(attrs)
            self._config = cfg

    # Setters: index = the parameter's position in the kernel's signature.
    def set_ptr(self, i: int, value: int) -> None:
        self._slots[i] = value

    def set_i64(self, i: int, value: int) -> None:
        self._i64[i] = value

    def set_i32(self, i: int, value: int) -> None:
        self._i32[2 * i] = value  # the slot's low 4 bytes (little-endian)

    def set_f32(self, i: int, value: float) -> None:
        self._f32[2 * i] = value

    def set_map(self, i: int, tmap) -> None:
        """Parameter ``i`` is ``tmap`` (a ``driver.CUtensorMap``): the driver reads its 128 bytes where
        they are, so a later ``cuTensorMapReplaceAddress`` on it changes what the next launch passes."""
        self._maps[i] = tmap  # kept alive with the launcher
        self._addrs[i] = tmap.getPtr()

    def set_args(self, args) -> None:
        """Set every parameter from ``args`` (tensors as their data pointers, descriptors as ``set_map``),
        following ``kinds``. For the first call and for tests; calls after it set only what changes."""
        for i, (kind, v) in enumerate(zip(self.kinds, args)):
            if kind == "tmap":
                self.set_map(i, v)
            elif kind == "ptr":
                self.set_ptr(i, v.data_ptr() if isinstance(v, torch.Tensor) else int(v))
            elif kind == "i64":
                self.set_i64(i, int(v))
            elif kind == "i32":
                self.set_i32(i, int(v))
            elif kind == "f32":
                self.set_f32(i, float(v))
            else:
                raise LaunchError(f"{self.name}: unknown parameter kind {kind!r}")

    def launch(self, stream: int) -> None:
        """Enqueue the kernel on ``stream`` (a raw handle, see ``raw_stream``) with the block as it is."""
        err = self._enqueue(stream)
        if err != self._success:
            self._failed(err, stream)

    def _enqueue(self, stream: int):
        cfg = self._config
        if cfg is None:
            gx, gy, gz = self.grid
            (err,) = self._launch_plain(self.handle, gx, gy, gz, self.block, 1, 1, self.smem, stream,
                                        self._params, 0)
        else:
            cfg.hStream = stream
            (err,) = self._launch_ex(cfg, self.handle, self._params, 0)
        return err

    def _failed(self, err, stream: int) -> None:
        if _invalid_context(err):
            # A thread that has not used this device through the driver yet (torch's runtime calls do not
            # always make its context current): make it current once and retry.
            _count_context_retry()
            current_device(self.device_index)
            err = self._enqueue(stream)
            if err == self._success:
                return
        raise LaunchError(f"{self.name}: launch failed (grid={self.grid}, block={self.block}, smem={self.smem}, "
                          f"cluster={self.cluster}, pdl={self.pdl}): {err}")


# How often a driver call found no current context and was retried after making it current (both paths
# above). Once per thread is expected (autograd's backward thread, say); a count that grows with every
# call would mean the context does not stay current there (benchmarks/eager_host.py reports it).
CONTEXT_RETRIES = 0


def _count_context_retry() -> None:
    global CONTEXT_RETRIES
    CONTEXT_RETRIES += 1


def _invalid_context(err) -> bool:
    from cuda.bindings import driver

    return err == driver.CUresult.CUDA_ERROR_INVALID_CONTEXT


@functools.cache
def _success():
    from cuda.bindings import driver

    return driver.CUresult.CUDA_SUCCESS


class MapSlot:
    """A descriptor parameter of a ``Launcher`` that follows a tensor's address from call to call: encoded
    once for the first tensor's shape and strides, then only its address is replaced when it changes
    (the caller guarantees shape, strides and dtype stay those it was built for).

    The 128 bytes live in a buffer of our own, 64-byte aligned as ``CUtensorMap`` is declared
    (``alignas(64)``): the driver's ``cuTensorMapReplaceAddress`` refuses a descriptor that is not, and a
    ``driver.CUtensorMap`` object's own storage is only 16-byte aligned (3 of 4 failed on the H200)."""

    __slots__ = ("tmap", "ptr", "_buf", "_replace", "_device_index")

    def __init__(self, launcher: Launcher, index: int, ptr: int, rows: int, cols: int, row_stride_elems: int,
                 dtype: torch.dtype, box: tuple[int, int], *, swizzle_bytes: int = 128):
        import ctypes

        import numpy as np
        from cuda.bindings import driver

        encoded = encode_tensor_map(ptr, rows, cols, row_stride_elems, dtype, box, swizzle_bytes=swizzle_bytes)
        self._buf = np.zeros(128 + 64, dtype=np.uint8)
        at = -self._buf.ctypes.data % 64
        ctypes.memmove(self._buf.ctypes.data + at, encoded.getPtr(), 128)
        self.tmap = driver.CUtensorMap(_ptr=self._buf.ctypes.data + at)
        self.ptr = ptr
        self._replace = driver.cuTensorMapReplaceAddress
        self._device_index = launcher.device_index
        launcher.set_map(index, self.tmap)

    def point_at(self, ptr: int) -> None:
        if ptr != self.ptr:
            (err,) = self._replace(self.tmap, ptr)
            if err != _success() and _invalid_context(err):
                # The driver wants a current context here too; a thread that has not used the device
                # through the driver has none (autograd runs backward in a thread of its own).
                _count_context_retry()
                current_device(self._device_index)
                (err,) = self._replace(self.tmap, ptr)
            if err != _success():
                raise LaunchError(f"replacing a TMA descriptor's address (at {self.tmap.getPtr():#x}) by "
                                  f"{ptr:#x} failed: {err}")
            self.ptr = ptr
