"""The inspector against tiny kernels with known properties, compiled from strings (no GPU needed)."""

import pytest

from gemmlab import inspect as gi
from gemmlab import registry
from gemmlab.errors import CompileError

SRC = r"""
template <int V>
__global__ void copy_scalar(const float* __restrict__ a, float* __restrict__ b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) b[i] = a[i] * 2.0f;
}

template <int V>
__global__ void copy_float4(const float4* __restrict__ a, float4* __restrict__ b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { float4 v = a[i]; v.x *= 2.f; v.y *= 2.f; v.z *= 2.f; v.w *= 2.f; b[i] = v; }
}

// A local array indexed at run time cannot live in registers: it goes to the stack (LDL/STL).
template <int N>
__global__ void local_array(const float* __restrict__ a, float* __restrict__ b, int idx) {
    float buf[N];
    for (int i = 0; i < N; ++i) buf[(i * idx) % N] = a[threadIdx.x + i * 32];
    b[threadIdx.x] = buf[idx % N];
}

// 64 live accumulators under a 32-register cap (1024 threads, 2 blocks per SM): ptxas spills.
template <int N>
__global__ void __launch_bounds__(1024, 2) pressure(const float* __restrict__ a, float* __restrict__ b, int n) {
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; ++j) acc[j] = a[j * 1024 + threadIdx.x];
    for (int k = 0; k < n; ++k) {
        float x = a[k];
#pragma unroll
        for (int j = 0; j < N; ++j) acc[j] = acc[j] * x + acc[(j + 1) % N];
    }
#pragma unroll
    for (int j = 0; j < N; ++j) b[j * 1024 + threadIdx.x] = acc[j];
}

template <int UNROLL>
__global__ void dot(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ out, int n) {
    float acc = 0.f;
#pragma unroll UNROLL
    for (int k = 0; k < n; ++k) acc += a[k * 32 + threadIdx.x] * b[k];
    out[threadIdx.x] = acc;
}
"""


def report(expr: str) -> gi.Report:
    return gi.inspect_compiled(gi.compile_source(SRC, expr, "sm_90a"))


def test_scalar_vs_float4_loads():
    scalar, vec = report("copy_scalar<0>"), report("copy_float4<0>")
    assert scalar.widths()["global_load"] == {32: 1}
    assert vec.widths()["global_load"] == {128: 1}
    assert vec.summary.has(r"^LDG\.E\.128") and not scalar.summary.has(r"^LDG\.E\.128")
    assert vec.widths()["global_store"] == {128: 1}
    assert any("global_load.128" in line for line in gi.annotate(vec))
    assert "global loads 1x128-bit" in vec.highlights()


def test_diff_shows_the_width_change():
    d = gi.diff(report("copy_scalar<0>"), report("copy_float4<0>"))
    assert ("global_load", 32, 1, 0) in d.widths
    assert ("global_load", 128, 0, 1) in d.widths
    assert any(op.startswith("LDG.E.128") for op in d.opcodes_added)
    assert not gi.diff(report("dot<1>"), report("dot<1>")).widths


def test_local_array_goes_to_the_stack():
    r = report("local_array<64>")
    assert r.resources.stack_frame >= 64 * 4
    assert r.summary.class_counts["local"] > 0
    assert r.summary.has(r"^STL") and r.summary.has(r"^LDL")
    assert any(h.startswith("LOCAL MEMORY") for h in r.highlights())


def test_register_pressure_spills():
    r = report("pressure<64>")
    assert r.resources.registers <= 32
    assert r.resources.spill_stores > 0 and r.resources.spill_loads > 0
    assert r.resources.stack_frame > 0
    assert r.widths()["local"]


def test_unrolled_vs_not():
    rolled, unrolled = report("dot<1>"), report("dot<8>")
    assert [lp.mix.get("ffma", 0) for lp in rolled.loops] == [1]
    assert "not unrolled" in rolled.loops[0].unrolled
    best = max(unrolled.loops, key=lambda lp: lp.compute)
    assert best.own["ffma"] == 8 and best.unrolled.startswith("unrolled: 8 FFMA")
    d = gi.diff(rolled, unrolled)
    assert ("FFMA in the busiest loop", 1, 8) in d.loops


def test_annotated_listing_marks_loops():
    r = report("dot<1>")
    lines = gi.annotate(r)
    assert len([ln for ln in lines if "┌ loop" in ln]) == len(r.loops) == 1
    assert any(" L0 " in ln and " ffma " in ln and "FFMA" in ln for ln in lines)
    assert any(ln.endswith("↰ loop L0") and "BRA" in ln for ln in lines)
    assert len([ln for ln in lines if not ln.startswith("┌")]) == len(r.summary.instructions)


def test_ptx_of_a_source_and_of_a_step():
    ptx = gi.ptx_for_source(SRC, "copy_float4<0>")
    assert ".entry" in ptx and "ld.global.nc.v4.f32" in ptx
    assert ".target sm_90a" in ptx
    h = gi.ptx_for_step(registry.get("h01"))
    assert "wgmma.mma_async" in h and "cp.async.bulk.tensor" in h


def test_compile_errors_are_clear(tmp_path):
    with pytest.raises(CompileError, match="undefined"):
        gi.ptx_for_source("__global__ void f() { nope; }", "f")
    with pytest.raises(CompileError, match="undefined"):
        gi.compile_source("template <int X> __global__ void g() { nope; }", "g<1>")
    f = tmp_path / "mine.cu"
    f.write_text('#include "my_helpers.cuh"\n__global__ void k() {}\n')
    with pytest.raises(CompileError, match="not a header under"):
        gi.compile_file(f, "k")
    with pytest.raises(CompileError, match="no such file"):
        gi.compile_file(tmp_path / "absent.cu", "k")


def test_user_file_may_include_gemmlab_headers(tmp_path):
    f = tmp_path / "mine.cu"
    f.write_text('#include "common/ptx.cuh"\ntemplate <int V> __global__ void k(float* p) { p[threadIdx.x] = V; }\n')
    r = gi.inspect_compiled(gi.compile_file(f, "k<3>"))
    assert r.summary.class_counts["global_store"] == 1
    assert r.name == "mine.cu:k<3>"


def test_registered_step_report():
    r = gi.inspect_step("h01")
    assert r.checks == [] and r.claims
    assert r.summary.class_counts["hgmma"] > 0
    best = max(r.loops, key=lambda lp: lp.compute)
    assert best.own.get("hgmma", 0) >= 1
    assert r.dynamic_smem and r.threads == 128
    assert any(t == "barrier.mbarrier" for t in map(gi.tag, r.summary.instructions))
    assert r.barrier_kinds()["mbarrier"] > 0


def test_step_diff_between_ladder_neighbours():
    a, b = gi.inspect_step("k01"), gi.inspect_step("h01")
    d = gi.diff(a, b)
    assert any(m[0] == "hgmma" and m[1] == 0 and m[2] > 0 for m in d.mix)
    assert any(r[0] == "registers" for r in d.resources)
