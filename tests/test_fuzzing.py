"""The fuzz suite's own machinery on the CPU (``tests/fuzzing.py``; the GPU run is tests/test_fuzz_gpu.py):
the generator is deterministic and aims at every route, the tensors are laid out as described, the
fixed-seed part reaches every route of the engine, the checker passes an exact implementation and
catches each kind of fault it claims to, and the host side of every fixed-seed call runs (kernels
compiled and launched by stubs) without an exception, with a bounded number of kernel variants."""

import collections
import threading
import dataclasses
import math
import types

import pytest
import torch

import fuzzing
from fuzzing import DTYPES, Case, Layout

@pytest.fixture(autouse=True)
def one_thread():
    """Small float64 products on a machine others share: one thread avoids OpenMP spinning (10x here)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def small(c: Case, mnk: int = 2**21) -> bool:
    """Cases the CPU checks take (float64 products on a shared two-core machine)."""
    return c.M * c.N * c.K <= mnk and max(c.M * c.K, c.K * c.N, c.M * c.N) <= 2**18


def _fixed_cases(n=fuzzing.FIXED_CASES):
    return [c for fam in fuzzing.take(fuzzing.FIXED_SEED, n) for c in fam]


def test_generator_is_deterministic_per_seed():
    one = fuzzing.take(7, 300, quick=False)
    assert one == fuzzing.take(7, 300, quick=False)
    assert one != fuzzing.take(8, 300, quick=False)
    cases = [c for fam in one for c in fam]
    assert [c.index for c in cases] == list(range(len(cases)))


def test_generator_aims_at_every_route_with_valid_cases():
    cases = [c for fam in fuzzing.take(3, 4000, quick=False) for c in fam]
    assert set(fuzzing.ROUTES) <= {c.target for c in cases}
    assert set(fuzzing.MUTATIONS) <= {c.mutation for c in cases}
    assert {"matmul", "linear"} == {c.api for c in cases}
    assert {(d, o) for d in DTYPES for o in DTYPES} == {(c.dtype, c.out_dtype) for c in cases}
    assert set(fuzzing.ACTIVATIONS) == {c.activation for c in cases}
    assert {None, "in", "fp32"} == {c.bias for c in cases}
    assert any(c.out_is_c for c in cases) and any(c.stream for c in cases) and any(c.alias for c in cases)
    for c in cases:
        assert min(c.M, c.N, c.K) >= 0 and c.M * c.N * c.K <= fuzzing.MAX_MNK, c.describe()
        if c.api == "linear":
            assert c.c is None and c.out is None and c.alpha == 1.0 and c.out_dtype == c.dtype
            assert math.prod(c.lead) == c.M and (c.lead or c.M == 1)
        if c.out_is_c:
            assert c.out == c.c and c.c is not None
        if c.c is not None:
            assert c.beta != 0.0
        if c.target.startswith("decode") and not c.mutation:
            assert c.a.order == "row" and c.b.order == "col"
            assert c.K % 8 == 0 or c.target == "decode-unaligned"
    for fam in fuzzing.take(3, 2000, quick=False):
        assert len({(c.M, c.N, c.K) for c in fam}) == 1  # a family shares its shape


def _materialized(cases, device="cpu"):
    gen = torch.Generator().manual_seed(0)
    for fam_cases in cases:
        pool = {}
        for c in fam_cases:
            if small(c):
                yield c, fuzzing.materialize(c, device, gen, pool)


def test_tensors_are_views_into_nan_and_sentinel_buffers():
    fams = fuzzing.take(11, 500, quick=False)
    seen = 0
    for c, t in _materialized(fams):
        seen += 1
        assert t.a.shape == (c.M, c.K) and t.b.shape == (c.K, c.N), c.describe()
        assert t.a.stride() == c.a.strides(c.M, c.K) and t.a.storage_offset() == c.a.offset
        assert t.b.stride() == c.b.strides(c.K, c.N) and t.a.dtype == DTYPES[c.dtype]
        for name in ("a", "b", "bias", "c"):
            if name not in t.buffers:
                continue
            buf, view = t.buffers[name], t.views[name]
            assert view.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr()
            assert torch.isfinite(view.float()).all()
            if not (name == "c" and c.out_is_c):
                assert torch.isnan(buf[fuzzing.outside(buf, view)].float()).all()  # reads past the view: NaN
        if c.out is not None and not c.out_is_c:
            buf = t.buffers["out"]
            assert torch.isnan(t.out.float()).all()
            assert torch.isfinite(buf[fuzzing.outside(buf, t.out)].float()).all()  # sentinels
            assert t.out.dtype == DTYPES[c.out_dtype] and t.out.stride() == c.out.strides(c.M, c.N)
        if c.bias:
            assert t.bias.shape == (c.N,) and t.bias.dtype == (DTYPES[c.dtype] if c.bias == "in" else torch.float32)
        name, args, kw = fuzzing.call_args(c, t)
        assert name == c.api
    assert seen > 200


def test_aliased_cases_reuse_the_previous_pointers():
    """An ``alias`` case gets the previous call's buffers: the same data pointers, with new strides or a
    dtype of the same size (what stale cached launch state would get wrong)."""
    found = 0
    for fam in fuzzing.take(5, 1500, quick=False):
        if not any(c.alias for c in fam):
            continue
        pool, prev = {}, None
        gen = torch.Generator().manual_seed(1)
        for c in fam:
            if not small(c):
                break
            t = fuzzing.materialize(c, "cpu", gen, pool)
            if c.alias and prev is not None and prev.a.element_size() == t.a.element_size():
                assert t.a.data_ptr() == prev.a.data_ptr()
                found += 1
            prev = t
    assert found > 10


def test_fixed_seed_part_reaches_every_route():
    """What the GPU's fixed-seed run will hit, classified by the engine's own helpers on CPU tensors
    (the same alignment rules: CUDA allocations are 512-byte aligned, CPU ones at least 64)."""
    routes = collections.Counter()
    fams = fuzzing.take(fuzzing.FIXED_SEED, fuzzing.FIXED_CASES)
    for c, t in _materialized(fams):
        routes[fuzzing.classify(c, t)] += 1
    # The cases too large for CPU tensors (where the router still runs h11: large M x N, shallow K),
    # classified on meta tensors (their data pointers all read 0: only their "+copy" tags may differ).
    for fam in fams:
        pool = {}
        for c in fam:
            t = fuzzing.materialize(c, "meta", None, pool)
            if not small(c):
                routes[fuzzing.classify(c, t)] += 1
    tags = collections.Counter()
    for route, n in routes.items():
        for tag in fuzzing.route_tags([route]):
            tags[tag] += n
    assert "unknown" not in tags, routes
    # No "decode-splitk": the router sends no call to the decode kernel where its plan splits K (engine.py,
    # after DECODE_MAX_WEIGHT_DIM); that target's calls run the engine's swapped split-K plans, and the decode
    # kernel's split path is tested with the plan forced (test_decode_gpu.py).
    for tag in ("decode", "h11", "engine", "engine-splitk", "+copy", "+direct", "fp32", "empty", "epilogue-only"):
        assert tags[tag] >= 3, (tag, routes)


# The checker --------------------------------------------------------------------------------------------

def exact_impl(name, args, kw):
    """gemmlab's contract computed in float64 with torch: what a perfect library returns."""
    if name == "linear":
        x, w = args
        K, N = x.shape[-1], w.shape[0]
        y = fuzzing.exact(x.reshape(-1, K), w.t(), kw.get("bias"), kw.get("activation"))
        return y.to(x.dtype).reshape(*x.shape[:-1], N)
    a, b = args
    out = kw.get("out")
    y = fuzzing.exact(a, b, kw.get("bias"), kw.get("activation"), kw.get("alpha", 1.0), kw.get("beta", 0.0),
                      kw.get("c"))
    if out is not None:
        return out.copy_(y)
    return y.to(kw.get("out_dtype") or a.dtype)


def _checkable(n=160, mnk=2**21):
    fams = fuzzing.take(fuzzing.FIXED_SEED, n)
    return [[c for c in fam if small(c, mnk)] for fam in fams]


def test_checker_passes_an_exact_implementation():
    tally = fuzzing.Tally(seed=fuzzing.FIXED_SEED, mode="cpu")
    fuzzing.run_families(_checkable(fuzzing.FIXED_CASES), "cpu", tally, impl=exact_impl)
    assert tally.cases > 120
    assert not tally.failures, tally.report()
    tally = fuzzing.Tally(seed=fuzzing.FIXED_SEED, mode="cpu")
    fuzzing.run_families([fuzzing.regressions()], "cpu", tally, impl=exact_impl)
    assert tally.cases == len(fuzzing.regressions()) and not tally.failures, tally.report()


def _buffer_of(t):
    """A flat view of the whole storage behind ``t``."""
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (t.untyped_storage().nbytes() // t.element_size(),))


def _write_past_end(name, args, kw):
    y = exact_impl(name, args, kw)
    out = kw.get("out")
    if out is not None and out.numel():
        last = out.storage_offset() + sum((s - 1) * st for s, st in zip(out.shape, out.stride()))
        _buffer_of(out)[last + 1] = 0.0  # one element past the output view
    return y


def _skip_one(name, args, kw):
    y = exact_impl(name, args, kw)
    if y.numel():
        y[tuple(s // 2 for s in y.shape)] = float("nan")  # as if never written (outputs start as NaN)
    return y


def _touch_input(name, args, kw):
    y = exact_impl(name, args, kw)
    a = args[0]
    if a.numel():
        _buffer_of(a)[0] = 1.0  # the NaN before a's view (a stray write into an input's padding)
    return y


def _one_wrong_value(name, args, kw):
    """One element off by a quarter of the result's rms: far below the 2-norm bound of a large result,
    so only the element-wise bound can catch it."""
    y = exact_impl(name, args, kw)
    if y.numel():
        idx = tuple(s // 2 for s in y.shape)
        y[idx] = y[idx] + 0.25 * float(y.double().pow(2).mean().sqrt()) + 0.01
    return y


def _read_padding(name, args, kw):
    """Reads one element past the end of ``a``'s last row (NaN padding) into the product."""
    a = args[0]
    if name == "linear" or a.numel() == 0:
        return exact_impl(name, args, kw)
    wide = a.as_strided((a.shape[0], a.shape[1]), a.stride(), a.storage_offset() + 1)  # shifted by one
    return exact_impl(name, (wide, args[1]), kw)


def _new_tensor_for_out(name, args, kw):
    y = exact_impl(name, args, kw)
    return y.clone() if kw.get("out") is not None else y


def _low_precision(name, args, kw):
    """Inputs rounded to fp8 first: a systematic error far above cuBLAS's on every element."""
    if name == "linear":
        x, w = args
        args = (x.to(torch.float8_e4m3fn).to(x.dtype), w)
    else:
        args = (args[0].to(torch.float8_e4m3fn).to(args[0].dtype), args[1])
    return exact_impl(name, args, kw)


FAULTS = {
    "write-past-the-output": (_write_past_end, "written outside the output view"),
    "missed-element": (_skip_one, "non-finite"),
    "input-changed": (_touch_input, "changed"),
    "one-wrong-value": (_one_wrong_value, "past their bound|bound"),
    "read-out-of-bounds": (_read_padding, "non-finite|bound"),
    "out-not-returned": (_new_tensor_for_out, "did not return out"),
    "low-precision": (_low_precision, "bound"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_checker_catches(fault):
    """Each fault, injected into the exact implementation, fails the cases where it can show (and only
    with the problem it causes)."""
    impl, message = FAULTS[fault]
    tally = fuzzing.Tally(seed=fuzzing.FIXED_SEED, mode="cpu")
    fams = _checkable(80, mnk=2**20)
    fuzzing.run_families(fams, "cpu", tally, impl=impl)
    can_show = [c for fam in fams for c in fam if c.M * c.N > 0 and (
        (fault != "write-past-the-output" or (c.out is not None))
        and (fault != "out-not-returned" or c.out is not None)
        and (fault != "read-out-of-bounds" or (c.api == "matmul" and c.K > 0))
        and (fault != "low-precision" or c.K >= 16 and c.alpha != 0.0 and c.c is None)
        and (fault != "input-changed" or c.K > 0))]
    failed = {o.case.index for o in tally.failures}
    assert {c.index for c in can_show} <= failed, [c.describe() for c in can_show if c.index not in failed][:5]
    import re
    assert all(re.search(message, o.problem) for o in tally.failures), [o.problem for o in tally.failures][:5]


def test_selected_case_runs_its_family_up_to_it():
    fams = fuzzing.take(2, 200)
    fam = next(f for f in fams if len(f) >= 3)
    sel = fuzzing.selected(fams, fam[1].index)
    assert sel == [fam[:2]]
    with pytest.raises(ValueError):
        fuzzing.selected(fams, 10**6)


def test_record_has_what_the_issue_asks_for(tmp_path):
    tally = fuzzing.Tally(seed=123, mode="soak")
    fuzzing.run_families(_checkable(40), "cpu", tally, impl=exact_impl)
    path = tmp_path / "results" / "fuzz.jsonl"
    fuzzing.write_record(path, tally.record(duration_s=1.5))
    fuzzing.write_record(path, tally.record(duration_s=2.5))
    import json

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2
    rec = lines[0]
    assert rec["seed"] == 123 and rec["cases"] == tally.cases > 0 and rec["failures"] == 0
    assert sum(rec["routes"].values()) == rec["cases"] and rec["duration_s"] == 1.5


# The host side of every fixed-seed call, with kernels stubbed ---------------------------------------------

class HostOnly:
    """Stands in for the GPU under ``gemmlab.matmul``: compiles and launches are recorded (with the
    launch configuration and TMA descriptors checked against the hardware's rules), device queries
    answer as an H200 does. CPU tensors then run the real host path of the engine and the decode
    kernel. (If the engine's call path is refactored, the patched names below may need updating.)"""

    def __init__(self, monkeypatch):
        from gemmlab import decode, engine, ops, tuned
        import gemmlab.jit.compiler as jc
        import gemmlab.jit.launch as jl

        self.kernels = collections.Counter()
        self.launches = 0
        host = self

        class Launcher:  # jit.launch.Launcher's interface, checking the launch shape instead of launching
            def __init__(self, compiled, kinds, *, grid, block, smem=0, cluster=None, device_index=0, pdl=False):
                grid = grid if isinstance(grid, tuple) else (grid,)
                assert all(g >= 1 for g in grid) and grid[0] < 2**31 and all(g < 2**16 for g in grid[1:]), grid
                assert 32 <= block <= 1024 and 0 <= smem <= 227 * 1024, (block, smem)
                if cluster is not None:
                    assert 1 <= cluster <= 8 and grid[0] % cluster == 0, (grid, cluster)
                self.kinds, self.cluster, self.lock = kinds, cluster, threading.Lock()

            def set_args(self, args):
                assert len(args) == len(self.kinds)

            def set_ptr(self, i, v):
                assert self.kinds[i] == "ptr" and isinstance(v, int), (i, v)

            def set_i32(self, i, v):
                assert self.kinds[i] == "i32" and -2**31 <= v < 2**31, (i, v)

            def set_i64(self, i, v):
                assert self.kinds[i] == "i64", i

            def set_f32(self, i, v):
                assert self.kinds[i] == "f32", i

            def set_map(self, i, tmap):
                assert self.kinds[i] == "tmap", i

            def launch(self, stream):
                host.launches += 1

        class MapSlot:  # TMA's rules (CUDA driver API, cuTensorMapEncodeTiled), checked at encode
            def __init__(self, launcher, index, ptr, rows, cols, row_stride, dtype, box, *, swizzle_bytes=128):
                es = torch.empty((), dtype=dtype).element_size()
                assert ptr % 16 == 0 and (row_stride * es) % 16 == 0, (ptr % 16, row_stride)
                assert all(1 <= b <= 256 for b in box) and (box[1] * es) % 16 == 0, box
                assert swizzle_bytes in (0, 32, 64, 128) and (not swizzle_bytes or box[1] * es <= swizzle_bytes), box
                self.tmap = object()
                launcher.set_map(index, self.tmap)

            def point_at(self, ptr):
                assert ptr % 16 == 0

        for mod in (jc, engine):
            monkeypatch.setattr(mod, "compile_kernel", self.compile, raising=False)
        for mod in (jl, engine):
            monkeypatch.setattr(mod, "Launcher", Launcher, raising=False)
            monkeypatch.setattr(mod, "MapSlot", MapSlot, raising=False)
            monkeypatch.setattr(mod, "raw_stream", lambda index: 0, raising=False)
        monkeypatch.setattr(engine, "_sm_count", lambda device: 132)
        monkeypatch.setattr(engine, "_memory_peak", lambda device: engine.H200.hbm_peak_bytes_per_s)
        monkeypatch.setattr(engine, "_index", lambda device: 0)
        monkeypatch.setattr(engine, "stream_k_workspace", lambda p, index, stream: (
            torch.empty(max(1, p.workspace_floats)), torch.zeros(2 * max(256, p.sk_ctas), dtype=torch.int32)))
        monkeypatch.setattr(engine, "cluster_capacity", lambda device: dict(engine.H200_CLUSTER_CAPACITY))
        monkeypatch.setattr(engine, "hopper_available", lambda device: None)
        monkeypatch.setattr(tuned, "device_gpu", lambda index: None)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        monkeypatch.setattr(decode, "split_buffers", lambda device, ws, ctr, stream: (
            torch.empty(max(ws, 1)), torch.zeros(max(ctr, 1), dtype=torch.int32)))
        monkeypatch.setattr(ops, "_check_device", lambda device: None)
        monkeypatch.setattr(ops, "_sm_count", lambda device: 132)
        monkeypatch.setattr(ops, "_stream", lambda dev: 0)
        ops.clear_prepared_calls()
        monkeypatch.setattr(ops, "_CALLS", ops._CallCache())  # nothing prepared here outlives the test

    def compile(self, source, name_expression, *, arch, name=None, **kw):
        self.kernels[name_expression] += 1
        return types.SimpleNamespace(name=name or name_expression, name_expression=name_expression, source=source)


def test_host_path_of_every_fixed_seed_call(monkeypatch):
    """The fixed-seed calls with 16-bit inputs (the engine's), on CPU tensors, through gemmlab.matmul /
    linear with the GPU stubbed: no exception (the decode planner's assert was one), legal launches and
    TMA descriptors, and few enough kernel variants that the GPU run compiles in well under a minute."""
    import gemmlab

    host = HostOnly(monkeypatch)
    fams = fuzzing.take(fuzzing.FIXED_SEED, fuzzing.FIXED_CASES)
    errors, ran = [], 0
    for fam in [fuzzing.regressions()] + fams:
        gen, pool = torch.Generator().manual_seed(0), {}
        for c in fam:
            if c.dtype == "fp32" or c.M * c.N * c.K > 2**31:
                continue
            t = fuzzing.materialize(c, "cpu", gen, pool)
            name, args, kw = fuzzing.call_args(c, t)
            try:
                getattr(gemmlab, name)(*args, **kw)
                ran += 1
            except Exception as e:  # noqa: BLE001 - collected and reported together
                errors.append(f"{c.describe()}: {type(e).__name__}: {e}")
    assert not errors, "\n".join(errors[:10])
    assert ran > 150 and host.launches >= ran - 20
    assert len(host.kernels) <= 140, len(host.kernels)
    assert any(k.startswith("engine_decode") for k in host.kernels)
    assert any(k.startswith("hopper_h11") for k in host.kernels)
    assert any(k.startswith("pad_copy") for k in host.kernels)


def test_case_description_names_everything():
    c = Case(index=3, family=1, target="h11", M=5, N=6, K=7, bias="fp32", activation="gelu", alpha=0.5,
             beta=2.0, c=Layout("col", 1, 17), out=Layout("row", 0, 16), stream=1, mutation="layout")
    d = c.describe()
    for part in ("#3", "M=5 N=6 K=7", "bias=fp32", "act=gelu", "alpha=0.5", "beta=2.0", "c=col+1@17",
                 "out=row+0@16", "side-stream", "h11/layout"):
        assert part in d
    assert dataclasses.replace(c, out_is_c=True, out=c.c).describe().count("out=c") == 1
