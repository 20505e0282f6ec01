"""The JIT pipeline: compile without a GPU, the disk cache (hit, miss, corruption, concurrency), resources."""

import multiprocessing as mp
import os
from pathlib import Path

import pytest

from gemmlab import registry
from gemmlab.errors import CompileError
from gemmlab.jit import cache as jcache
from gemmlab.jit.compiler import clear_memory_cache, compile_kernel, parse_resources
from gemmlab.jit.toolchain import cuda_include_dir, nvdisasm_path, nvrtc_version

SRC = "sgemm/k01_naive.cu"
EXPR = "sgemm_naive<16>"


def _entries(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file() and "tmp" not in p.name]


def test_toolchain_found():
    assert Path(cuda_include_dir(), "cuda_bf16.h").is_file()
    assert os.access(nvdisasm_path(), os.X_OK)
    major, minor = nvrtc_version()
    assert major >= 12


def test_cache_miss_then_hit(tmp_path):
    clear_memory_cache()
    first = compile_kernel(SRC, EXPR, arch="sm_90", cache_path=tmp_path)
    assert first.cache_status == "miss"
    assert first.cubin[:4] == b"\x7fELF"
    assert len(_entries(tmp_path)) == 1
    clear_memory_cache()
    second = compile_kernel(SRC, EXPR, arch="sm_90", cache_path=tmp_path)
    assert second.cache_status == "hit"
    assert second.cubin == first.cubin
    assert second.mangled_name == first.mangled_name
    assert second.resources == first.resources


def test_cache_key_depends_on_inputs():
    base = dict(sources={"a.cu": "x"}, options=("o",), arch="sm_90", name_expression="k<1>",
                nvrtc_version=(13, 0))
    k0 = jcache.cache_key(**base)
    for change in (dict(sources={"a.cu": "y"}), dict(sources={"a.cu": "x", "h.cuh": "z"}), dict(options=("p",)),
                   dict(arch="sm_90a"), dict(name_expression="k<2>"), dict(nvrtc_version=(13, 1))):
        assert jcache.cache_key(**{**base, **change}) != k0


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupted_entry_is_rebuilt(tmp_path, damage):
    clear_memory_cache()
    good = compile_kernel(SRC, EXPR, arch="sm_90", cache_path=tmp_path)
    (entry,) = _entries(tmp_path)
    blob = entry.read_bytes()
    if damage == "truncate":
        entry.write_bytes(blob[: len(blob) // 2])
    elif damage == "flip":
        entry.write_bytes(blob[:-10] + bytes(b ^ 0xFF for b in blob[-10:]))
    elif damage == "garbage":
        entry.write_bytes(b"not a cache entry at all")
    else:
        entry.write_bytes(b"")
    clear_memory_cache()
    again = compile_kernel(SRC, EXPR, arch="sm_90", cache_path=tmp_path)
    assert again.cache_status == "rebuilt"
    assert again.cubin == good.cubin
    clear_memory_cache()
    assert compile_kernel(SRC, EXPR, arch="sm_90", cache_path=tmp_path).cache_status == "hit"


def _compile_in_child(path: str) -> bytes:
    from gemmlab.jit.compiler import compile_kernel as ck

    return ck(SRC, EXPR, arch="sm_90", cache_path=Path(path)).cubin


def test_concurrent_compiles_do_not_corrupt(tmp_path):
    ctx = mp.get_context("spawn")
    with ctx.Pool(3) as pool:
        cubins = pool.map(_compile_in_child, [str(tmp_path)] * 3)
    assert len(set(cubins)) == 1
    clear_memory_cache()
    again = compile_kernel(SRC, EXPR, arch="sm_90", cache_path=tmp_path)
    assert again.cache_status == "hit"
    assert again.cubin == cubins[0]


def test_compile_error_names_kernel(tmp_path, monkeypatch):
    bad = Path(registry.__file__).parent / "kernels" / "sgemm" / "_broken_for_test.cu"
    bad.write_text("__global__ void broken() { this is not C++; }\n")
    try:
        with pytest.raises(CompileError, match="broken_kernel_name"):
            compile_kernel("sgemm/_broken_for_test.cu", "broken", arch="sm_90", name="broken_kernel_name",
                           cache_path=tmp_path)
    finally:
        bad.unlink()


def test_missing_source_is_clear():
    with pytest.raises(CompileError, match="not found"):
        compile_kernel("sgemm/does_not_exist.cu", "x", arch="sm_90", use_disk_cache=False)


def test_parse_resources():
    log = ("ptxas info    : Compiling entry function '_Zfoo' for 'sm_90a'\n"
           "ptxas info    : Function properties for _Zfoo\n"
           "ptxas         .     8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 1 barriers, 16 bytes smem, 400 bytes cmem[0]\n")
    r = parse_resources(log, "_Zfoo")
    assert (r.registers, r.stack_frame, r.spill_stores, r.spill_loads, r.static_shared, r.barriers) == \
        (168, 8, 4, 4, 16, 1)
    assert r.spills


def test_parse_resources_skips_warnings_that_name_the_function():
    log = ("ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are serialized "
           "... in the function '_Zbar' in line 0\n"
           "ptxas info    : Compiling entry function '_Zbar' for 'sm_90a'\n"
           "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
           "ptxas info    : Used 168 registers, used 16 barriers, 80 bytes smem\n")
    r = parse_resources(log, "_Zbar")
    assert (r.registers, r.barriers, r.static_shared) == (168, 16, 80)


def test_prepared_descriptors_are_64_byte_aligned_copies(monkeypatch):
    """MapSlot keeps each TMA descriptor in 64-byte aligned memory of its own (CUtensorMap's alignment,
    which cuTensorMapReplaceAddress checks; a driver.CUtensorMap object's storage is only 16-byte aligned),
    holding the encoded bytes, and hands that memory to the launcher."""
    import ctypes

    import numpy as np
    import torch
    from cuda.bindings import driver

    from gemmlab.jit import launch as L

    class FakeLauncher:
        device_index = 0

        def __init__(self):
            self.maps = {}

        def set_map(self, i, tmap):
            self.maps[i] = tmap

    for n in range(8):  # several allocations: the objects' own storage lands on every 16-byte offset
        encoded = [driver.CUtensorMap() for _ in range(n + 1)][-1]
        pattern = np.arange(128, dtype=np.uint8) ^ n
        ctypes.memmove(encoded.getPtr(), pattern.ctypes.data, 128)
        monkeypatch.setattr(L, "encode_tensor_map", lambda *a, e=encoded, **kw: e)
        launcher = FakeLauncher()
        slot = L.MapSlot(launcher, 2, 0x10000, 64, 64, 64, torch.bfloat16, (64, 64))
        assert launcher.maps[2] is slot.tmap and slot.tmap.getPtr() % 64 == 0
        got = np.ctypeslib.as_array((ctypes.c_uint8 * 128).from_address(slot.tmap.getPtr()))
        assert np.array_equal(got, pattern)


def test_context_retries_are_counted_once_per_missing_context(monkeypatch):
    """A descriptor's address replacement that finds no current context (a thread new to the driver, e.g.
    autograd's backward thread) makes the context current, retries, and is counted in CONTEXT_RETRIES;
    a replacement that succeeds, or an unchanged address, is not counted."""
    import torch
    from cuda.bindings import driver

    from gemmlab.jit import launch as L

    class FakeLauncher:
        device_index = 0

        def set_map(self, i, tmap):
            pass

    monkeypatch.setattr(L, "encode_tensor_map", lambda *a, **kw: driver.CUtensorMap())
    slot = L.MapSlot(FakeLauncher(), 0, 0x10000, 64, 64, 64, torch.bfloat16, (64, 64))
    current = {"made": 0}
    monkeypatch.setattr(L, "current_device", lambda index: current.__setitem__("made", current["made"] + 1))
    answers = [driver.CUresult.CUDA_ERROR_INVALID_CONTEXT, driver.CUresult.CUDA_SUCCESS]
    slot._replace = lambda tmap, ptr: (answers.pop(0) if answers else driver.CUresult.CUDA_SUCCESS,)
    before = L.CONTEXT_RETRIES
    slot.point_at(0x20000)  # no context: made current, retried
    slot.point_at(0x20000)  # unchanged address: no driver call
    slot.point_at(0x30000)  # context current now
    assert L.CONTEXT_RETRIES - before == 1 and current["made"] == 1 and slot.ptr == 0x30000


@pytest.mark.parametrize("raw, want", [("", 0), ("none", 0), ("0", 0), ("64", 64), ("128B", 128), ("256", 256)])
def test_l2_promotion_setting_parses(monkeypatch, raw, want):
    from gemmlab.jit import launch as L

    monkeypatch.setenv("GEMMLAB_TMA_L2_PROMOTION", raw)
    assert L._l2_promotion_from_env() == want


@pytest.mark.parametrize("raw", ["512", "big", "-1"])
def test_l2_promotion_setting_rejects_other_values(monkeypatch, raw):
    from gemmlab.jit import launch as L

    monkeypatch.setenv("GEMMLAB_TMA_L2_PROMOTION", raw)
    with pytest.raises(ValueError, match="GEMMLAB_TMA_L2_PROMOTION"):
        L._l2_promotion_from_env()


@pytest.mark.parametrize("bytes_, name", [(0, "CU_TENSOR_MAP_L2_PROMOTION_NONE"),
                                          (256, "CU_TENSOR_MAP_L2_PROMOTION_L2_256B")])
def test_encoded_descriptors_carry_the_l2_promotion(monkeypatch, bytes_, name):
    """The driver-encoded descriptors (the prepared launches' maps) ask for the configured promotion."""
    import torch
    from cuda.bindings import driver

    from gemmlab.jit import launch as L

    seen = {}

    def fake_encode(dtype, rank, ptr, dims, strides, box, elem_strides, interleave, swizzle, l2, oob):
        seen["l2"] = l2
        return driver.CUresult.CUDA_SUCCESS, driver.CUtensorMap()

    monkeypatch.setattr(driver, "cuTensorMapEncodeTiled", fake_encode)
    monkeypatch.setattr(L, "L2_PROMOTION", bytes_)
    L.encode_tensor_map(0x10000, 64, 64, 64, torch.bfloat16, (64, 64))
    assert seen["l2"] == getattr(driver.CUtensorMapL2promotion, name)


@pytest.mark.parametrize("value,on", [(None, True), ("1", True), ("0", False), ("off", False), ("no", False)])
def test_pdl_switch_is_read_from_the_environment(value, on):
    """GEMMLAB_PDL (read once at import): programmatic dependent launch for the launchers that ask for it,
    unless 0 / off / false / no."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "GEMMLAB_PDL"}
    if value is not None:
        env["GEMMLAB_PDL"] = value
    code = "from gemmlab.jit import launch; print(launch.PDL)"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert res.stdout.strip() == str(on)
