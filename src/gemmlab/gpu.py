"""Facts about the GPU and its state while we measure: name, SMs, L2, driver; SM clock, power, temperature.

Read through torch and NVML (``nvidia-ml-py``). Nothing here is hard-coded for one GPU.
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class GpuInfo:
    name: str
    capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    memory_bytes: int
    driver: str
    torch: str
    cuda_runtime: str
    hbm_peak_bytes_per_s: float | None = None  # the device memory's peak (``memory_peak``); None: unknown

    def as_dict(self) -> dict:
        return asdict(self)


def gpu_info(index: int | None = None) -> GpuInfo:
    """Facts of GPU ``index`` (default: torch's current device, looked up on every call so that a
    multi-GPU process gets the device it is using, while the facts themselves are read once per GPU)."""
    from .jit.launch import require_gpu

    require_gpu("reading GPU properties")
    return _gpu_info(torch.cuda.current_device() if index is None else index)


@functools.lru_cache(maxsize=None)
def _gpu_info(idx: int) -> GpuInfo:
    p = torch.cuda.get_device_properties(idx)
    driver = "unknown"
    nv = _nvml()
    if nv is not None:
        try:
            driver = nv.nvmlSystemGetDriverVersion()
            driver = driver.decode() if isinstance(driver, bytes) else driver
        except Exception:  # noqa: BLE001
            pass
    return GpuInfo(name=p.name, capability=(p.major, p.minor), sm_count=p.multi_processor_count,
                   l2_bytes=int(getattr(p, "L2_cache_size", 50 * 2**20)), memory_bytes=int(p.total_memory),
                   driver=driver, torch=torch.__version__, cuda_runtime=str(torch.version.cuda),
                   hbm_peak_bytes_per_s=memory_peak(idx))


def memory_peak(idx: int) -> float | None:
    """GPU ``idx``'s device-memory peak in bytes/s: two transfers a clock (DDR) x the memory clock x the bus
    width, as the driver reports them (cuda.core's device properties); None where it reports neither."""
    try:
        from cuda.core import Device

        props = Device(idx).properties
        khz, bits = props.memory_clock_rate, props.global_memory_bus_width
    except Exception:  # noqa: BLE001 - a driver without the attributes: the profile keeps the H200's rates
        return None
    return 2 * khz * 1e3 * bits / 8 if khz > 0 and bits > 0 else None


@functools.lru_cache(maxsize=None)
def _nvml():
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # noqa: BLE001 - NVML missing or no driver: clocks are then unknown
        return None


@dataclass(frozen=True)
class ClockSample:
    sm_mhz: float | None
    mem_mhz: float | None
    power_w: float | None
    temp_c: float | None


def sample_clocks(index: int | None = None) -> ClockSample:
    """The SM and memory clock, board power and temperature now (None where NVML cannot say)."""
    nv = _nvml()
    if nv is None:
        return ClockSample(None, None, None, None)
    idx = torch.cuda.current_device() if index is None else index
    h = nv.nvmlDeviceGetHandleByIndex(idx)

    def read(fn, *a, scale=1.0):
        try:
            return fn(h, *a) * scale
        except Exception:  # noqa: BLE001
            return None

    return ClockSample(
        sm_mhz=read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
        mem_mhz=read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
        power_w=read(nv.nvmlDeviceGetPowerUsage, scale=1e-3),
        temp_c=read(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
    )


def median_sample(samples: list[ClockSample]) -> ClockSample:
    def med(vals):
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    return ClockSample(*(med([getattr(s, f) for s in samples]) for f in ("sm_mhz", "mem_mhz", "power_w", "temp_c")))
