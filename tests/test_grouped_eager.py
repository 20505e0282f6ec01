"""``gemmlab.grouped_mm``'s eager path on CPU: the prepared launch (``grouped.GroupedLaunch``) against
``grouped.launch`` with the driver stubbed (tests/fakes.py's ``FakeLauncher`` / ``FakeMapSlot``: the same
parameters, descriptors of the same geometry, every address following the tensors of each call), and the
prepared calls behind ``grouped_mm`` with the launch replaced by the float64 reference (keyed on metadata,
never on the offsets' / counts' values, never stale, the op still seen by tracing, modes and autograd, the
same errors)."""

import pytest
import torch

import gemmlab
from gemmlab import engine, engine2, fp8, grouped, ops
from gemmlab.errors import UnsupportedProblem

import fakes
from fakes import FakeTmap
from test_grouped import BAD

BF16, FP32 = torch.bfloat16, torch.float32
MODES = ("bf16", "tensor", "block", "block-row")  # bf16; FP8 per-tensor (per group); block scales in place / re-laid


def _case(mode="bf16", layout="contiguous", T=100, G=4, N=200, K=256, seed=0, ends=False):
    """grouped_mm's arguments as a dict: fresh a, b, offsets (an empty group; ``ends``: torch's G ends) or
    counts, and the scales ``mode`` asks for ("block-row": a's block scales row-major, re-laid per call)."""
    torch.manual_seed(seed)
    shape = (T, K) if layout == "contiguous" else (G, T, K)
    if layout == "contiguous":
        offs = torch.tensor([0, 10, 10, 70, T], dtype=torch.int32)[:G + 1]
        kw = dict(offsets=offs[1:].clone() if ends else offs)
    else:
        kw = dict(counts=torch.tensor([3, 0, T, 40], dtype=torch.int32)[:G])
    if mode in ("bf16", "fp16", "bf16-mn"):
        dt = torch.float16 if mode == "fp16" else BF16
        if mode == "bf16-mn":  # b MN-major: the transpose of a (G, K, N) tensor
            return dict(a=torch.randn(shape).to(dt), b=torch.randn(G, K, N).to(dt).transpose(1, 2), **kw)
        return dict(a=torch.randn(shape).to(dt), b=torch.randn(G, N, K).to(dt), **kw)
    if mode == "tensor":
        a, sa = fp8.quantize_per_tensor(torch.randn(shape))
        qs = [fp8.quantize_per_tensor(torch.randn(N, K)) for _ in range(G)]
        b, sb = torch.stack([q for q, _ in qs]), torch.stack([s.reshape(()) for _, s in qs])
        return dict(a=a, b=b, scale_a=sa, scale_b=sb, **kw)
    if layout == "contiguous":
        a, sa = fp8.quantize_blocks(torch.randn(shape), 1)
    else:
        a, sa = fp8.quantize_expert_blocks(torch.randn(shape), 1)
    b, sb = fp8.quantize_expert_blocks(torch.randn(G, N, K), 128)
    return dict(a=a, b=b, scale_a=sa.contiguous() if mode == "block-row" else sa, scale_b=sb, **kw)


def _ranges(c):
    return c["offsets"] if "offsets" in c else c["counts"]


# The prepared launch against grouped.launch (driver stubbed) -------------------------------------------------

@pytest.fixture
def driver(monkeypatch):
    """grouped's launches on CPU tensors: fake Launcher / MapSlot (GroupedLaunch), descriptors and the
    cuda-core launch captured (grouped.launch), and every block-scale view ``scale_rows_mn_major``
    returns recorded (``relaid``)."""
    launchers = fakes.fake_driver(monkeypatch, engine, engine2, grouped)  # OutputMaps', scale_map's MapSlots
    monkeypatch.setattr(grouped, "MN_MAJOR_B_OFFERED", True)  # the "-mn" cases
    monkeypatch.setattr(grouped, "FIT_OFFERED", False)  # GroupedLaunch's plans (the fitted form's: below)
    captured = {}
    # Claimed tiles' counter (and stream-K's partials) live in engine's per-stream buffers: one CPU stand-in
    # for every stream here, so that launch (torch's stream) and GroupedLaunch.run (stream 11) agree.
    ws = (torch.empty(1 << 20), torch.zeros(512, dtype=torch.int32))
    monkeypatch.setattr(grouped, "raw_stream", lambda dev: 0)
    monkeypatch.setattr(grouped, "stream_k_workspace", lambda p, dev, stream: ws)
    monkeypatch.setattr(grouped, "_workspace", lambda p, device: ws)
    def tmap(swizzle):
        return lambda t, box: FakeTmap(t.data_ptr(), *t.shape, t.stride(0), t.dtype, box, swizzle)

    monkeypatch.setattr(grouped, "compile_plan", lambda p: "compiled")
    monkeypatch.setattr(grouped, "_index", lambda device: 0)
    monkeypatch.setattr(grouped, "_tensor_map", tmap(128))
    monkeypatch.setattr(grouped, "_tensor_map_flat", tmap(0))
    monkeypatch.setattr(grouped, "_launch_fn", lambda: lambda compiled, **kw: captured.update(kw))
    relaid = fakes.record_returns(monkeypatch, grouped, "scale_rows_mn_major")
    return type("Driver", (), dict(launchers=launchers, captured=captured, relaid=relaid))


def _planned(c, out_dtype=None, direct=None):
    """The plan grouped_mm runs for case ``c``, its problem, and a fresh output for it."""
    import dataclasses

    scales = dict(scale_a=c.get("scale_a"), scale_b=c.get("scale_b"))
    prob = grouped.validate(c["a"], c["b"], c.get("offsets"), c.get("counts"), None, out_dtype, **scales)
    p = grouped.plan_for(c["a"], c["b"], c.get("offsets"), c.get("counts"), out_dtype=prob.out_dtype, **scales)
    if direct is not None:
        p = dataclasses.replace(p, direct=direct)
    return p, prob, torch.empty(prob.out_shape, dtype=prob.out_dtype)


CASES = [("bf16", "contiguous", dict(), None, False),  # TMA-stored out
         ("bf16", "masked", dict(N=96), FP32, None),
         ("fp16", "contiguous", dict(ends=True, N=100), None, None),  # 200-byte rows: DIRECT; G ends
         ("tensor", "contiguous", dict(), None, False),
         ("tensor", "masked", dict(T=40), torch.float16, None),
         ("block", "contiguous", dict(), None, False),  # scales read in place
         ("block", "masked", dict(T=40), FP32, None),
         ("block-row", "contiguous", dict(N=300), None, None),  # a's scales re-laid per call
         ("block-row", "masked", dict(T=40), None, False),
         ("bf16-mn", "contiguous", dict(), None, False),  # b MN-major: (G K, N) rows, 64 x 64 boxes
         ("bf16-mn", "masked", dict(N=96), FP32, None)]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(CASES)])
def test_prepared_launch_passes_what_launch_passes(driver, case):
    """Every parameter of GroupedLaunch's launch equals grouped.launch's: the same scalars and pointers
    (ranges, lead, G, rows, N, K, panel, scales, sb_step, out, ldo) and descriptors of the same geometry
    (rows, columns, row stride, dtype, box, swizzle) at the same address; a re-laid scale's descriptor
    points at the copy made for that call."""
    mode, layout, kw, out_dtype, direct = case
    c = _case(mode, layout, **kw)
    p, prob, out = _planned(c, out_dtype, direct)
    args = (c["a"], c["b"], _ranges(c), prob.lead, out, c.get("scale_a"), c.get("scale_b"), prob.sb_step)
    grouped.launch(p, *args)
    want = fakes.as_params(driver.captured["args"])
    launch = grouped.GroupedLaunch(p, *args)
    launch.run(11, c["a"], c["b"], _ranges(c), out, c.get("scale_a"), c.get("scale_b"))
    L = driver.launchers[-1]
    stream, got = L.launches[-1]
    assert stream == 11 and len(got) == len(want) == len(grouped.PARAMS)
    assert L.config == dict(grid=p.grid, block=p.threads, smem=p.smem_bytes, cluster=None, pdl=True)
    assert (got[2] == got[0]) == p.direct  # DIRECT: A's descriptor stands in for out's
    for i, (g, w) in enumerate(zip(got, want)):
        if i == 3 and mode == "block-row":  # launch's copy and this call's differ
            assert g[1] == w[1] and g[2] == driver.relaid[-1].data_ptr() != c["scale_a"].data_ptr()
        else:
            assert g == w, (i, g, w)


@pytest.mark.parametrize("mode", ["bf16", "tensor"])
def test_short_a_boxes_follow_a(driver, mode):
    """A's four short boxes (the tile over a group's last rows loads the fewest rows that hold them): bm / 16
    .. bm / 2 rows (at least 8) of A's 128-byte rows, A's geometry otherwise, at A's address on every call."""
    c = _case(mode, T=40)
    p, prob, out = _planned(c, direct=False)
    launch = grouped.GroupedLaunch(p, c["a"], c["b"], _ranges(c), prob.lead, out, c.get("scale_a"),
                                   c.get("scale_b"), prob.sb_step)
    assert grouped.short_a_rows(64) == (8, 8, 16, 32) and grouped.short_a_rows(256) == (16, 32, 64, 128)
    for seed in (1, 2):
        c2 = _case(mode, T=40, seed=seed)
        launch.run(3, c2["a"], c2["b"], _ranges(c2), out, c2.get("scale_a"), c2.get("scale_b"))
        got = driver.launchers[-1].launches[-1][1]
        whole = got[grouped._P_A][1]
        for i, h in zip(grouped._P_A_SHORT, grouped.short_a_rows(p.bm)):
            assert got[i][2] == c2["a"].data_ptr() == got[grouped._P_A][2]
            assert got[i][1] == {**whole, "box": (h, whole["box"][1])}


def test_params_match_the_kernel_signature():
    """PARAMS (what GroupedLaunch's parameter block holds) has the kernel's parameters in order and size,
    for bf16 and block-scaled FP8 instantiations."""
    from fakes import ptx_param_types, unsigned

    ptx = {"tmap": "b8[128]", "ptr": "u64", "i32": "u32", "i64": "u64", "f32": "f32"}
    for mode in ("bf16", "block"):
        p = _planned(_case(mode))[0]
        assert [ptx[k] for k in grouped.PARAMS] == unsigned(ptx_param_types(grouped.SOURCE, p.name_expression))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", grouped.LAYOUTS)
def test_prepared_launch_follows_every_address(driver, mode, layout):
    """A launch built for one set of tensors and run with others passes theirs everywhere (A, B, out's
    descriptor and pointer, the ranges, both scale pointers and block scales' descriptors), replaces no
    descriptor address when run again with the same tensors, and takes the stream it is given."""
    c0 = _case(mode, layout, T=40)
    p, prob, out = _planned(c0, direct=False)
    launch = grouped.GroupedLaunch(p, c0["a"], c0["b"], _ranges(c0), prob.lead, out, c0.get("scale_a"),
                                   c0.get("scale_b"), prob.sb_step)
    L = driver.launchers[-1]
    sets = [(_case(mode, layout, T=40, seed=s), torch.empty_like(out)) for s in (1, 2)]
    for stream, (c, o) in zip((3, 5, 3), sets + sets[:1]):
        launch.run(stream, c["a"], c["b"], _ranges(c), o, c.get("scale_a"), c.get("scale_b"))
        s, got = L.launches[-1]
        ptr = [g[2] if g[0] == "tmap" else g[1] for g in got]
        assert s == stream
        assert ptr[:3] == [c["a"].data_ptr(), c["b"].data_ptr(), o.data_ptr()]
        assert ptr[5] == _ranges(c).data_ptr() and ptr[15] == o.data_ptr()
        if mode == "bf16":
            assert ptr[12] == ptr[13] == o.data_ptr() and ptr[3] == ptr[4] == c["a"].data_ptr()
        else:
            assert ptr[12:14] == [c["scale_a"].data_ptr(), c["scale_b"].data_ptr()]
        if mode.startswith("block"):
            sa_view = c["scale_a"] if mode == "block" else driver.relaid[-1]  # in place, or this call's copy
            assert ptr[3:5] == [sa_view.data_ptr(), c["scale_b"].data_ptr()]
            assert torch.equal(grouped.scale_rows_mn_major(c["scale_a"]), driver.relaid[-1])
    slots = [launch.map_a, launch.map_b, launch.maps_c.c] + ([launch.map_sb] if mode.startswith("block") else [])
    slots += [launch.map_sa] if mode == "block" else []  # a re-laid copy is wherever the allocator puts it
    replaced = [s.replaced for s in slots]
    assert all(r >= 2 for r in replaced)  # each of the three sets moved it
    c, o = sets[0]
    launch.run(3, c["a"], c["b"], _ranges(c), o, c.get("scale_a"), c.get("scale_b"))
    assert [s.replaced for s in slots] == replaced


@pytest.mark.parametrize("schedule", grouped.FIT_SCHEDULES)
def test_fitted_launch_passes_what_launch_passes_and_follows_every_address(driver, monkeypatch, schedule):
    """FitLaunch (the fitted form's prepared launch, either schedule) passes grouped.launch's parameters, and
    run with other tensors points every descriptor and pointer at them; run again with the same, it replaces
    nothing."""
    import dataclasses

    monkeypatch.setattr(grouped, "FIT_OFFERED", True)
    c0 = _case("bf16", "contiguous", T=40)
    p, prob, out = _planned(c0)
    assert p.fit
    p = dataclasses.replace(p, schedule=schedule, bn=grouped.fit_wmax(schedule, p.K))
    grouped.launch(p, c0["a"], c0["b"], _ranges(c0), prob.lead, out)
    want = fakes.as_params(driver.captured["args"])
    launch = grouped.FitLaunch(p, c0["a"], c0["b"], prob.lead, out)
    L = driver.launchers[-1]
    launch.run(11, c0["a"], c0["b"], _ranges(c0), out)
    stream, got = L.launches[-1]
    assert stream == 11 and got == want and len(got) == len(grouped.FIT_PARAMS)
    assert L.config == dict(grid=p.grid, block=p.threads, smem=p.smem_bytes, cluster=None, pdl=True)
    sets = [(_case("bf16", "contiguous", T=40, seed=s), torch.empty_like(out)) for s in (1, 2)]
    for stream, (c, o) in zip((3, 5), sets):
        launch.run(stream, c["a"], c["b"], _ranges(c), o)
        s, got = L.launches[-1]
        ptr = [g[2] if g[0] == "tmap" else g[1] for g in got]
        slots = grouped.FIT_MAP_SLOTS
        assert s == stream and ptr[0] == c["b"].data_ptr() and ptr[1:1 + slots] == [c["a"].data_ptr()] * slots
        assert ptr[1 + slots] == _ranges(c).data_ptr() and ptr[7 + slots] == o.data_ptr()
    before = [m.replaced for m in [launch.map_w, *launch.maps_t]]
    c, o = sets[1]
    launch.run(3, c["a"], c["b"], _ranges(c), o)
    assert [m.replaced for m in [launch.map_w, *launch.maps_t]] == before


# grouped_mm's eager path (the launches replaced by the float64 reference) -------------------------------------

@pytest.fixture
def eager(monkeypatch):
    """CPU tensors take grouped_mm's eager path (as CUDA tensors do); ``grouped.launch`` writes the float64
    reference into the rows the kernel writes (``fakes.route_grouped_launches`` runs it from the prepared
    calls); ``ran``: the plans launched; ``op_calls``: calls that went through a custom op."""
    ran = []

    def launch(p, a, b, ranges, lead, out, scale_a=None, scale_b=None, sb_step=0):
        assert p.layout == ("contiguous" if a.dim() == 2 else "masked") and out.dtype == grouped._DTYPES[p.out_dtype]
        kw = {"offsets": ranges} if a.dim() == 2 else {"counts": ranges}
        ref = grouped.reference_grouped_mm(a, b, **kw, scale_a=scale_a, scale_b=scale_b)
        out.copy_(torch.where(torch.isnan(ref), out.to(ref.dtype), ref).to(out.dtype))
        ran.append(p)

    monkeypatch.setattr(grouped, "launch", launch)
    monkeypatch.setattr(grouped, "MN_MAJOR_B_OFFERED", True)
    rec = fakes.route_grouped_launches(monkeypatch)
    monkeypatch.setattr(ops, "_fast_device", lambda a: True)
    rec.ran, rec.op_calls = ran, []
    for name in ("_grouped_mm_op", "_grouped_scaled_mm_op", "_grouped_mm_out_op"):
        def op(*args, real=getattr(grouped, name)):
            rec.op_calls.append(args)
            return real(*args)

        monkeypatch.setattr(grouped, name, op)
    return rec


def _ref(c, **kw):
    return grouped.reference_grouped_mm(c["a"], c["b"], c.get("offsets"), c.get("counts"), scale_a=c.get("scale_a"),
                                        scale_b=c.get("scale_b"), **kw)


def _close(y, c):
    ref = _ref(c)
    written = ~torch.isnan(ref)
    return torch.allclose(y.double()[written], ref.to(y.dtype).double()[written], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("layout", grouped.LAYOUTS)
def test_eager_calls_prepare_once_and_follow_each_calls_tensors(eager, mode, layout):
    for seed in range(3):
        c = _case(mode, layout, T=40, seed=seed)
        y = gemmlab.grouped_mm(**c)
        assert _close(y, c)
        run = eager.runs[-1]
        assert run["a"] is c["a"] and run["b"] is c["b"] and run["ranges"] is _ranges(c) and run["out"] is y
        assert run["sa"] is c.get("scale_a") and run["sb"] is c.get("scale_b")
    assert len(eager.prepared) == 1 and len(eager.runs) == 3 and not eager.op_calls


def test_eager_out_calls_write_the_given_tensor(eager):
    c = _case("bf16", T=100)
    for fill in (2.0 ** 100, -2.0 ** 100):  # exact in bf16; no product comes near
        out = torch.full((100, 200), fill, dtype=BF16)
        assert gemmlab.grouped_mm(**c, out=out) is out and eager.runs[-1]["out"] is out
        assert (out[70:] != fill).all() and _close(out, c)
    short = torch.tensor([0, 10, 10, 70, 90], dtype=torch.int32)  # rows 90.. in no group: kept
    gemmlab.grouped_mm(c["a"], c["b"], short, out=out.fill_(-2.0 ** 100))
    assert (out[90:] == -2.0 ** 100).all() and len(eager.prepared) == 1 and not eager.op_calls


CHANGES = ["T", "N", "offsets as G ends", "layout", "out_dtype", "out=", "out= off 16 bytes", "bf16 to fp16",
           "per-group to one scale_b", "per-tensor to block", "scale_a row-major", "scale_b row-major",
           "offsets off 16 bytes", "offsets' values", "a off 16 bytes"]
SAME_KEY = ("offsets' values", "a off 16 bytes")


@pytest.mark.parametrize("change", CHANGES)
def test_eager_calls_prepare_again_when_metadata_changes(eager, change):
    """Anything validation, the plan or the launch depends on is in the key, so a changed call never runs a
    stale preparation; the offsets' values (read on the device) and an address that keeps the 16-byte
    alignment share the key."""
    mode = ("tensor" if change in ("per-group to one scale_b", "per-tensor to block") else
            "block" if "scale" in change else "bf16")
    c, kw = _case(mode), {}
    gemmlab.grouped_mm(**c)
    if change == "T":
        c = _case(mode, T=64)
    elif change == "N":
        c = _case(mode, N=128)
    elif change == "offsets as G ends":
        c = _case(mode, ends=True)
    elif change == "layout":
        c = _case(mode, "masked", T=25)
    elif change == "out_dtype":
        kw = dict(out_dtype=FP32)
    elif change == "out=":
        kw = dict(out=torch.zeros(100, 200, dtype=BF16))
    elif change == "out= off 16 bytes":  # groups of ~256 rows: TMA stores, unless out's start forbids them
        c = _case(mode, T=1024)
        gemmlab.grouped_mm(**c, out=torch.zeros(1024, 200, dtype=BF16))
        kw = dict(out=torch.zeros(1024 * 200 + 1, dtype=BF16)[1:].view(1024, 200))
    elif change == "bf16 to fp16":
        c = _case("fp16")
    elif change == "per-group to one scale_b":
        c["scale_b"] = c["scale_b"][0].clone()
    elif change == "per-tensor to block":
        c = _case("block")
    elif change == "scale_a row-major":
        c["scale_a"] = c["scale_a"].contiguous()
    elif change == "scale_b row-major":
        c["scale_b"] = c["scale_b"].contiguous()
    elif change == "offsets off 16 bytes":
        c["offsets"] = torch.cat([torch.zeros(1, dtype=torch.int32), c["offsets"]])[1:]
    elif change == "offsets' values":
        c["offsets"] = torch.tensor([0, 30, 50, 50, 100], dtype=torch.int32)
    elif change == "a off 16 bytes":  # same metadata and alignment: the same key
        buf = torch.empty(100 * 256 + 8, dtype=BF16)
        c["a"] = buf[8:].view(100, 256).copy_(c["a"])
    before = len(eager.prepared)
    y = gemmlab.grouped_mm(**c, **kw)
    assert len(eager.prepared) == before + (change not in SAME_KEY)
    assert eager.runs[-1]["a"] is c["a"] and eager.runs[-1]["ranges"] is _ranges(c) and eager.runs[-1]["out"] is y
    assert y.dtype == kw.get("out_dtype", BF16 if mode != "bf16" or change != "bf16 to fp16" else torch.float16)
    assert _close(y, c)
    if change == "out= off 16 bytes":
        assert eager.ran[-1].direct and not eager.ran[-2].direct  # no TMA map over an odd start


class _Unreadable(torch.Tensor):
    """offsets / counts whose values cannot be read on the host."""

    def tolist(self):
        raise AssertionError("the ranges were read on the host")

    item = __int__ = __index__ = __bool__ = __iter__ = tolist


@pytest.mark.parametrize("layout", grouped.LAYOUTS)
def test_prepared_calls_never_read_the_ranges_on_the_host(driver, monkeypatch, layout):
    """Preparing a call (validation, the plan, the launch) and running it read only the offsets' / counts'
    metadata and address (their values are the device's): both work on ranges whose values refuse to be
    read, and the launch is given their address."""
    monkeypatch.setattr(grouped, "_runs_here", lambda a: True)
    monkeypatch.setattr(grouped, "_PREPARED", {})
    monkeypatch.setattr(ops, "_stream", lambda dev: 9)
    c = _case("block", layout, T=40)
    r = _ranges(c).as_subclass(_Unreadable)
    kw = {"offsets": r, "counts": None} if layout == "contiguous" else {"offsets": None, "counts": r}
    for _ in range(2):
        call = grouped._prepared(c["a"], c["b"], kw["offsets"], kw["counts"], None, None, c["scale_a"], c["scale_b"])
        call(c["a"], c["b"], kw["offsets"], kw["counts"], None, c["scale_a"], c["scale_b"])
        assert driver.launchers[-1].launches[-1][1][5] == ("ptr", r.data_ptr())
    assert len(driver.launchers) == 1 and len(driver.launchers[0].launches) == 2


def test_eager_calls_read_the_current_stream_every_call(eager, monkeypatch):
    c = _case("block")
    for stream in (3, 5, 3):
        monkeypatch.setattr(ops, "_stream", lambda dev, s=stream: s)
        gemmlab.grouped_mm(**c)
    assert [r["stream"] for r in eager.runs] == [3, 5, 3] and len(eager.prepared) == 1


@pytest.mark.parametrize("mode", MODES)
def test_eager_result_equals_the_ops_and_runs(eager, mode):
    c = _case(mode, "masked", T=40)
    y = gemmlab.grouped_mm(**c, out_dtype=FP32)
    args = (c["a"], c["b"], None, c["counts"])
    if mode == "bf16":
        by_op = torch.ops.gemmlab.grouped_mm(*args, FP32)
    else:
        by_op = torch.ops.gemmlab.grouped_scaled_mm(*args, c["scale_a"], c["scale_b"], FP32)
    by_run = grouped.run(c["a"], c["b"], counts=c["counts"], out_dtype=FP32, scale_a=c.get("scale_a"),
                         scale_b=c.get("scale_b"))  # grouped.launch, the plan made anew
    written = ~torch.isnan(_ref(c))
    assert torch.equal(y[written], by_op[written]) and torch.equal(y[written], by_run[written])
    assert _close(y, c) and not eager.op_calls and eager.ran[-1] == eager.prepared[-1]


def test_modes_the_profiler_and_gradients_take_the_op(eager):
    c = _case("bf16")
    with fakes.OpRecorder() as rec:
        gemmlab.grouped_mm(**c)
    assert any("gemmlab.grouped_mm" in name for name in rec.ops) and len(eager.op_calls) == 1
    with torch.autograd.profiler.profile():
        gemmlab.grouped_mm(**c)
    assert len(eager.op_calls) == 2
    c["a"].requires_grad_(True)
    y = gemmlab.grouped_mm(**c)  # needs a gradient: the prepared call in _EagerGrouped, the op's formula
    assert len(eager.op_calls) == 2 and type(y.grad_fn).__name__ == "_EagerGroupedBackward"
    with torch.no_grad():
        gemmlab.grouped_mm(**c)
    assert len(eager.op_calls) == 2  # no gradient wanted: eager
    out = torch.empty(100, 200, dtype=BF16)
    with fakes.OpRecorder() as rec:
        gemmlab.grouped_mm(c["a"].detach(), c["b"], c["offsets"], out=out)
    assert any("grouped_mm_out" in name for name in rec.ops) and len(eager.op_calls) == 3


def test_tracing_and_compile_see_the_op(eager):
    from torch.fx.experimental.proxy_tensor import make_fx

    c = _case("tensor")
    f = lambda a, b, o, sa, sb: gemmlab.grouped_mm(a, b, o, scale_a=sa, scale_b=sb, out_dtype=FP32)  # noqa: E731
    args = (c["a"], c["b"], c["offsets"], c["scale_a"], c["scale_b"])
    g = make_fx(f, tracing_mode="fake")(*args)
    assert [str(n.target) for n in g.graph.nodes if n.op == "call_function"] == ["gemmlab.grouped_scaled_mm.default"]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    y = torch.compile(lambda *t: f(*t) * 2, backend=backend, fullgraph=True)(*args)
    assert any("grouped_scaled_mm" in str(n.target) for n in graphs[-1].graph.nodes)
    assert _close(y / 2, c)


@pytest.mark.parametrize("make,exc,match", BAD, ids=[m for _, _, m in BAD])
def test_eager_bad_input_raises_as_before_and_prepares_nothing(eager, make, exc, match):
    a, b, o = _case("bf16", N=48, K=64)["a"], _case("bf16", N=48, K=64)["b"], _case("bf16")["offsets"]
    args, kw = make(a, b, o)
    with pytest.raises(exc, match=match):
        gemmlab.grouped_mm(*args, **kw)
    assert not grouped._PREPARED and not eager.prepared


def test_eager_fp8_out_and_misaligned_operands_are_refused(eager):
    c = _case("tensor")
    with pytest.raises(UnsupportedProblem, match="takes no out="):
        gemmlab.grouped_mm(**c, out=torch.empty(100, 200, dtype=BF16))
    c = _case("bf16")
    gemmlab.grouped_mm(**c)
    buf = torch.empty(100 * 256 + 1, dtype=BF16)
    with pytest.raises(UnsupportedProblem, match="16-byte aligned"):
        gemmlab.grouped_mm(buf[1:].view(100, 256), c["b"], c["offsets"])
    assert len(eager.prepared) == 1


def test_eager_empty_problems_launch_nothing(eager):
    c = _case("bf16", T=0)
    assert gemmlab.grouped_mm(**c).shape == (0, 200)
    assert not eager.prepared and not eager.ran and not eager.op_calls


def test_prepared_calls_start_over_past_the_bound(eager, monkeypatch):
    monkeypatch.setattr(grouped, "MAX_PREPARED", 2)
    c = _case("bf16")
    for T in (80, 90, 100):
        gemmlab.grouped_mm(c["a"][:T], c["b"], c["offsets"])
    assert len(grouped._PREPARED) == 1
    gemmlab.grouped_mm(c["a"][:80], c["b"], c["offsets"])  # forgotten: prepared again
    assert len(eager.prepared) == 4


@pytest.mark.parametrize("capturing", [False, True])
def test_nothing_prepared_under_graph_capture_is_kept(monkeypatch, capturing):
    """ops.keep_prepared (grouped_mm's and scaled_mm's cache): a CUDA call prepared while its stream is
    captured is not kept (its allocations belong to the graph); a CPU call never asks."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing)
    calls = {}
    ops.keep_prepared(calls, "k", "call", torch.device("cuda", 0), 8)
    ops.keep_prepared(calls, "c", "call", torch.device("cpu"), 8)
    ops.keep_prepared(calls, None, "call", torch.device("cpu"), 8)
    assert calls == ({"c": "call"} if capturing else {"k": "call", "c": "call"})


def _grad_case(layout, dtype, N, offsets):
    torch.manual_seed(3)
    G, T, K = 4, 100, 64
    if layout == "contiguous":
        a = torch.randn(T, K).to(dtype)
        kw = {"offsets": torch.tensor(offsets, dtype=torch.int32)}
        first = offsets[0] if len(offsets) == G + 1 else 0
        a[:first] = float("nan")  # rows no group covers: never read, in forward or backward
        a[offsets[-1]:] = float("nan")
    else:
        a = torch.randn(G, 48, K).to(dtype)
        a[1, 30:] = float("nan")  # past slab 1's count: never read, in forward or backward
        kw = {"counts": torch.tensor([3, 30, 0, 48], dtype=torch.int32)}
    return a.requires_grad_(True), (torch.randn(G, N, K) / 8).to(dtype).requires_grad_(True), kw


@pytest.mark.parametrize("layout,offsets", [("contiguous", [0, 10, 10, 70, 100]),  # G + 1 boundaries, one empty
                                            ("contiguous", [5, 10, 10, 70, 90]),  # rows before and after: none
                                            ("contiguous", [10, 10, 70, 100]),  # torch's G ends
                                            ("masked", None)])
@pytest.mark.parametrize("dtype", [BF16, torch.float16])
@pytest.mark.parametrize("N", [200, 203])  # 203: the fallback's da reduction padded to a multiple of 8
@pytest.mark.parametrize("torch_gmm", [True, False])
@pytest.mark.parametrize("mn_b", [False, True])  # MN-major b offered: da on the kernel (N = 192)
def test_gradients_match_float64_autograd(eager, monkeypatch, layout, offsets, dtype, N, torch_gmm, mn_b):
    """grouped_mm's backward (da on the grouped kernel with b read MN-major, here its float64 stand-in, where
    offered; else contiguous: torch._grouped_mm, which torch has on CPU too, leaving the rows past the last
    group unwritten, and without it da on the kernel over b's transposed copy; db by torch._grouped_mm or
    one GEMM per group; masked: batched GEMMs) against torch autograd through a float64 per-group
    reference; rows outside every group or past a count get a zero gradient, NaN there never leaks."""
    if not torch_gmm:
        monkeypatch.delattr(torch, "_grouped_mm", raising=False)
    monkeypatch.setattr(grouped, "MN_MAJOR_B_OFFERED", mn_b)
    if mn_b:
        N = 192 if N == 200 else N  # 192: a multiple of 64, the kernel's da; 203: torch's / the copy
    a, b, kw = _grad_case(layout, dtype, N, offsets)
    y = gemmlab.grouped_mm(a, b, **kw)
    ref = grouped.reference_grouped_mm(a.detach(), b.detach(), **kw)
    written = ~torch.isnan(ref)
    w = torch.where(written, torch.randn(ref.shape, dtype=torch.float64), 0.0)
    (y.double() * w).sum().backward()
    a64, b64 = a.detach().double().requires_grad_(True), b.detach().double().requires_grad_(True)
    if layout == "contiguous":
        o = kw["offsets"].tolist()
        starts, ends = (o[:-1], o[1:]) if len(o) == b.shape[0] + 1 else ([0] + o[:-1], o)
        y64 = torch.zeros(ref.shape, dtype=torch.float64)
        for g, (s, e) in enumerate(zip(starts, ends)):
            y64 = y64.index_put((torch.arange(s, e),), a64[s:e] @ b64[g].t())
    else:
        keep = torch.arange(a.shape[1])[None, :] < kw["counts"][:, None].long()
        y64 = torch.where(keep[..., None], torch.bmm(torch.where(keep[..., None], a64, 0.0), b64.transpose(1, 2)), 0.0)
    (y64 * w).sum().backward()
    kernel_da = [p for p in eager.ran if p.b_mn]
    assert bool(kernel_da) == (mn_b and N % 64 == 0)  # both layouts: da on the kernel, b read MN-major
    for got, want in ((a.grad, a64.grad), (b.grad, b64.grad)):
        assert got.dtype == dtype and got.shape == want.shape and not torch.isnan(got).any()
        assert torch.allclose(got.double(), want, rtol=2e-2, atol=2e-2 * want.abs().max().item())
    if layout == "contiguous":
        assert (a.grad[~written.any(-1)] == 0).all()  # rows no group covers
    else:
        assert (a.grad[1, 30:] == 0).all() and (a.grad[2] == 0).all()  # past the counts


def test_gradients_are_refused_with_out(eager):
    """out= calls are forward only: asked for a gradient they say so (before any launch)."""
    b = torch.randn(4, 200, 256).to(BF16).requires_grad_(True)
    a = torch.randn(100, 256).to(BF16)
    offs = torch.tensor([0, 10, 10, 70, 100], dtype=torch.int32)
    with pytest.raises(UnsupportedProblem, match="out="):
        gemmlab.grouped_mm(a, b, offs, out=torch.empty(100, 200, dtype=BF16))
    with torch.no_grad():
        gemmlab.grouped_mm(a, b, offs, out=torch.empty(100, 200, dtype=BF16))  # forward only: fine


def test_mn_major_b_is_its_own_plan_and_launch(driver):
    """b stored MN-major (the transpose of a (G, K, N) tensor, as torch._grouped_mm's mat_b): its own plan
    (B_MN, refused for e4m3 and for K not a multiple of 64 or N of 8), a B descriptor over the (G K, N) rows
    with 64 x 64 boxes at b's address, and a launch key of its own."""
    c = _case("bf16-mn", "contiguous")
    p, prob, out = _planned(c)
    assert prob.b_mn and p.b_mn and p.template_args()[7] == "true" and "MN-major b" in repr(p)
    G, N, K = c["b"].shape
    launch = grouped.GroupedLaunch(p, c["a"], c["b"], c["offsets"], prob.lead, out)
    t = launch.map_b.tmap
    assert t.ptr == c["b"].data_ptr() and t.geometry == dict(rows=G * K, cols=N, row_stride=N, dtype=BF16,
                                                              box=(64, 64), swizzle=128)
    k_major = _case("bf16", "contiguous")
    assert grouped._key(c["a"], c["b"], c["offsets"], None, None, None, None, None) != grouped._key(
        k_major["a"], k_major["b"], k_major["offsets"], None, None, None, None, None)
    with pytest.raises(UnsupportedProblem, match="plan is for MN-major b"):
        grouped.GroupedLaunch(p, k_major["a"], k_major["b"], k_major["offsets"], prob.lead, out)
    a, b = c["a"][:, :200], torch.randn(4, 200, 96).to(BF16).transpose(1, 2)  # K = 200: not whole k-steps
    with pytest.raises(UnsupportedProblem, match="multiple of 64"):
        grouped.validate(a.contiguous(), b, c["offsets"])
    with pytest.raises(ValueError, match="MN-major"):
        import dataclasses

        dataclasses.replace(p, bn=96)


def test_mn_major_b_refused_until_offered(monkeypatch):
    c = _case("bf16-mn", "contiguous")
    monkeypatch.setattr(grouped, "MN_MAJOR_B_OFFERED", False)
    with pytest.raises(UnsupportedProblem, match="not offered yet"):
        gemmlab.grouped_mm(**c)
    a8, _ = fp8.quantize_per_tensor(torch.randn(100, 256))
    b8 = fp8.quantize_per_tensor(torch.randn(4, 256, 200))[0].transpose(1, 2)
    monkeypatch.setattr(grouped, "MN_MAJOR_B_OFFERED", True)
    with pytest.raises(UnsupportedProblem, match="K-major"):
        grouped.validate(a8, b8, c["offsets"], scale_a=torch.ones(()), scale_b=torch.ones(()))
