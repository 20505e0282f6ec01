"""The Hopper engine's host-side choices and the copy kernel's SASS; no GPU needed (the GPU side is
tests/test_engine_gpu.py)."""

import dataclasses
import json
import math
import threading

import pytest
import torch

from gemmlab import autotune, broad_shapes, decode, engine, planner, registry, sass
from gemmlab.devices import H200
from gemmlab.errors import UnsupportedProblem
from gemmlab.jit.compiler import compile_kernel

from fakes import ptx_param_types


@pytest.mark.parametrize("shape, plan", [
    ((1024, 1024, 1024), (64, 1)),  # 128 narrow tiles fill the GPU: no split (the reduction costs more)
    ((128, 1024, 4096), (64, 6)),  # 16 tiles: clusters of 6 (an H200 holds 17 of them at once)
    ((512, 1024, 8192), (128, 3)),  # 32 tiles: clusters of 4 would need two waves (30 at once)
    ((2048, 2048, 2048), (256, 1)),  # the tiles fill the GPU
    ((128, 8192, 8192), (128, 2)),
    ((16, 28672, 8192), (256, 1)),  # a weight stream: wide tiles, 112 of them, no split
])
def test_choose_plan_on_the_h200_table(shape, plan):
    M, N, K = shape
    assert engine.choose_plan(M, N, K, 132) == plan
    bn, splits = plan
    tiles = math.ceil(M / engine.BM) * math.ceil(N / bn)
    k_iters = math.ceil(K / engine.BK)
    assert splits == 1 or tiles <= engine.H200_CLUSTER_CAPACITY[splits]  # one wave of clusters
    assert splits == 1 or (k_iters // splits >= engine.MIN_SPLIT_K_STEPS
                           and (splits - 1) * math.ceil(k_iters / splits) < k_iters)  # no empty split


def test_split_k_stages_take_the_slabs_room():
    for bn in engine.SPLIT_WIDTHS:
        q, qs = engine._qsize(bn, 2), engine._qsize(bn, 2, split=True)
        assert qs >= q and engine.smem_bytes(bn, qs, 2, split=True) <= engine.SMEM_LIMIT
        assert engine.smem_bytes(bn, q, 2) <= engine.SMEM_LIMIT
    assert engine._qsize(128, 2, split=True) == 7 and engine._qsize(128, 2) == 6
    assert engine._qsize(64, 2, split=True) == engine.MAX_STAGES and engine._qsize(64, 2) == 8
    assert engine._qsize(256, 2) == engine._qsize(256, 2, split=True) == 4


@pytest.mark.parametrize("M, N, K", [(1, 4096, 4096), (64, 1024, 8192), (300, 700, 9000), (33, 5, 64 * 64)])
def test_choose_plan_is_the_least_modelled_time(M, N, K):
    bn, splits = engine.choose_plan(M, N, K, 132)
    best = engine.split_seconds(M, N, K, bn, splits, 132, engine.H200_CLUSTER_CAPACITY)
    for width in engine.SPLIT_WIDTHS:
        assert best <= engine.split_seconds(M, N, K, width, 1, 132, engine.H200_CLUSTER_CAPACITY)
    assert splits <= engine.MAX_CLUSTER


@pytest.mark.parametrize("elem, src_vec, dst_vec", [(2, 0, 1), (2, 1, 0), (4, 0, 1), (2, 0, 0), (4, 1, 1)])
def test_pad_copy_moves_16_byte_chunks_on_the_aligned_side(elem, src_vec, dst_vec):
    ck = compile_kernel(engine.PAD_COPY_SOURCE, f"pad_copy<{elem}, {src_vec}, {dst_vec}>", arch="sm_90a")
    summary = sass.kernel_summary(ck)
    scalar = r"\.U16" if elem == 2 else r"(\.CONSTANT)?$"
    expect = sass.SassExpect(
        contains=((r"^LDG\.E\.EF\.128$",) if src_vec else (rf"^LDG\.E{scalar}",))
        + ((r"^STG\.E\.128$",) if dst_vec else (rf"^STG\.E{scalar if elem == 2 else '$'}",)),
        no_local_memory=True)
    assert sass.check(expect, summary, ck.resources) == []


@pytest.mark.parametrize("elem, vec_a, vec_b", [(2, 0, 0), (2, 1, 0), (4, 0, 1)])
def test_pad_copy_operands_stores_16_byte_chunks(elem, vec_a, vec_b):
    """The operand copies' kernel: 16-byte stores into the aligned buffers, 16-byte loads where either job's
    source allows them, and PDL's wait (ACQBULK: griddepcontrol.wait) and trigger (PREEXIT:
    griddepcontrol.launch_dependents) after the block's last store: triggered before the copy, the GEMM's CTAs
    took the SMs as the copy drained and its plans without a cluster ran 2-12 us slower (session 39)."""
    ck = compile_kernel(engine.PAD_COPY_SOURCE, f"pad_copy_operands<{elem}, {vec_a}, {vec_b}>", arch="sm_90a")
    summary = sass.kernel_summary(ck)
    scalar = r"\.U16" if elem == 2 else r"(\.CONSTANT)?$"
    expect = sass.SassExpect(
        contains=(r"^STG\.E\.128$", rf"^LDG\.E{scalar}", r"^ACQBULK$", r"^PREEXIT$")
        + ((r"^LDG\.E\.EF\.128$",) if vec_a or vec_b else ()),
        absent=(() if vec_a or vec_b else (r"^LDG\.E\.EF\.128$",)), no_local_memory=True)
    assert sass.check(expect, summary, ck.resources) == []
    trigger = [i.address for i in summary.instructions if i.opcode == "PREEXIT"]
    stores = [i.address for i in summary.instructions if i.opcode.startswith("STG")]
    assert len(trigger) == 1 and trigger[0] > max(stores)


@pytest.mark.parametrize("case", ["both", "a-offset"])
def test_prepared_copies_share_one_pdl_launch_and_feed_the_gemm(monkeypatch, case):
    """Unaligned operands through Engine2Launch (driver faked): one ``pad_copy_operands`` launch with PDL
    copies them, from the call's tensors into 32-byte-aligned buffers, and the GEMM's A and B
    descriptors point at those buffers: views of the (device, stream, thread) copy space, the same from call
    to call, another on another stream or in another thread. "both": rows of 258 B on both sides (two
    jobs); "a-offset": A's base 2 bytes off (one job; B's job repeats A's addresses with no rows, and the
    grid is A's blocks)."""
    import fakes

    launchers = fakes.fake_driver(monkeypatch, engine)
    monkeypatch.setattr(engine, "_index", lambda device: 0)
    monkeypatch.setattr(engine, "_sm_count", lambda device: 132)
    monkeypatch.setattr(engine, "_memory_peak", lambda device: engine.H200.hbm_peak_bytes_per_s)
    monkeypatch.setattr(engine, "device_order_table", lambda *a, **k: torch.zeros(4, dtype=torch.int32))
    M, N, K = (33, 257, 129) if case == "both" else (100, 256, 128)

    def operands():
        if case == "both":
            return torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
        return torch.randn(M * K + 1).bfloat16()[1:].view(M, K), torch.randn(N, K).bfloat16()

    a, w = operands()
    out = torch.empty(M, N, dtype=torch.bfloat16)
    r = engine.route(a, w.t(), out, bias=None, activation=None, has_c=False, sm_count=132)
    assert r.kernel == "engine" and not r.plan.swap_ab
    call = engine.Engine2Launch(a, w.t(), out, bias=None, c=None, plan=r.plan)
    copy, gemm = launchers
    assert copy.config["pdl"] and gemm.config["pdl"]
    jobs = 2 if case == "both" else 1
    blocks = [engine._copy_blocks(M, K, 2, 132), engine._copy_blocks(N, K, 2, 132)][:jobs]
    assert copy.config["grid"] == sum(blocks)
    monkeypatch.setattr(engine, "_COPY_SPACE", {})
    seen = []
    for stream in (5, 5, 6, 6):  # new tensors each call: only addresses change
        a, w = operands()
        call.run(stream, a, w.t(), out, None, None, 1.0, 0.0)
        (launched_on, cv), (_, gv) = copy.launches[-1], gemm.launches[-1]
        assert launched_on == stream
        seen.append(cv[2][1])
        ldd = -(-K // 16) * 16  # 32-byte rows
        assert cv[0] == ("ptr", a.data_ptr()) and cv[1] == ("i64", K) and cv[3] == ("i64", ldd)
        assert cv[4:7] == [("i64", M), ("i32", K), ("i32", blocks[0])]
        da = cv[2][1]
        assert da % 32 == 0 and da != a.data_ptr()
        if jobs == 2:
            assert cv[7] == ("ptr", w.data_ptr()) and cv[8:13] == [("i64", K), cv[9], ("i64", ldd), ("i64", N),
                                                                   ("i32", K)]
            assert gv[engine._E2_B][2] == cv[9][1] != da
        else:
            assert cv[7] == cv[0] and cv[9] == cv[2] and cv[11] == ("i64", 0)
            assert gv[engine._E2_B][2] == w.data_ptr()
        assert gv[engine._E2_A][2] == da
    assert seen[0] == seen[1] != seen[2] == seen[3]  # one space per stream, its views made once
    other = []

    def in_another_thread():
        a, w = operands()
        call.run(5, a, w.t(), out, None, None, 1.0, 0.0)
        other.append(copy.launches[-1][1][2][1])

    thread = threading.Thread(target=in_another_thread)
    thread.start()
    thread.join()
    assert other and other[0] not in seen  # another thread: a space of its own
    assert len(engine._COPY_SPACE) == 3


def test_copy_space_grows_by_doubling_up_to_its_cap_and_starts_over_past_its_keys(monkeypatch):
    """``engine.copy_space``: the same bytes while they suffice, twice as many (at least what is asked, at most
    the cap) when not, one space per (device, stream, thread), and all of them dropped once a new key would
    pass ``_COPY_KEYS_MAX``."""
    monkeypatch.setattr(engine, "_COPY_SPACE", {})
    monkeypatch.setattr(engine, "COPY_SPACE_MAX_BYTES", 4096)
    cpu = torch.device("cpu")
    first = engine.copy_space(cpu, 5, 1000)
    assert first.numel() == 1000 and first.dtype == torch.uint8
    assert engine.copy_space(cpu, 5, 600) is first
    grown = engine.copy_space(cpu, 5, 1200)
    assert grown is not first and grown.numel() == 2000
    assert engine.copy_space(cpu, 5, 3000).numel() == 4000
    assert engine.copy_space(cpu, 5, 4090).numel() == 4096  # twice would pass the cap
    assert engine.copy_space(cpu, 7, 10).numel() == 10 and engine.copy_space(cpu, 7, 25).numel() == 25  # more than twice
    for stream in range(8, 8 + engine._COPY_KEYS_MAX - 2):
        engine.copy_space(cpu, stream, 10)
    assert len(engine._COPY_SPACE) == engine._COPY_KEYS_MAX
    engine.copy_space(cpu, 99, 10)  # one key too many: start over
    assert list(engine._COPY_SPACE) == [(cpu, 99, threading.get_ident())]


# Plans: forced, tuned, validated ----------------------------------------------------------------------

@pytest.mark.parametrize("plan, K, message", [
    ((96, 1), 4096, "not one of the tile widths"),
    ((128, 9), 4096, "not in 1..8"),
    ((128, 0), 4096, "not in 1..8"),
    ((128, 8), 1024, "fewer than 4 k-steps"),  # 16 k-steps: 2 per split
    ((64, 6), 1600, "a split would be empty"),  # 25 k-steps in ranges of 5: 5 splits, not 6
    ((128, "2"), 4096, "two integers"),
    ((128.0, 2), 4096, "two integers"),
    ((128,), 4096, "two integers"),
    (128, 4096, "two integers"),
])
def test_bad_plans_are_rejected_with_the_reason(plan, K, message):
    with pytest.raises(UnsupportedProblem, match=message):
        engine.validate_plan(plan, K)


def test_a_plan_whose_cluster_cannot_launch_is_rejected():
    assert engine.validate_plan((128, 4), 8192) == (128, 4)
    assert engine.validate_plan((256, 1), 64, {}) == (256, 1)  # no cluster: capacity not asked
    with pytest.raises(UnsupportedProblem, match="cannot launch a cluster of 4"):
        engine.validate_plan((128, 4), 8192, {**engine.H200_CLUSTER_CAPACITY, 4: 0})
    asked = []
    engine.validate_plan((128, 1), 8192, lambda: asked.append(1) or {})
    assert not asked


def test_gemm_validates_a_forced_plan_before_touching_a_gpu():
    a = torch.zeros(100, 1024, dtype=torch.bfloat16)
    b = torch.zeros(1024, 300, dtype=torch.bfloat16)
    out = torch.empty(100, 300, dtype=torch.bfloat16)
    with pytest.raises(UnsupportedProblem, match=r"plan \(BN=128, splits=8\) at K=1024: .*fewer than 4"):
        engine.gemm(a, b, out, plan=(128, 8))
    with pytest.raises(UnsupportedProblem, match="tile widths"):
        engine.gemm(a, b, out, plan=(32, 1))


FAKE = autotune.GpuKey("FAKE H200", 132, "570")
SHAPE = (200, 1024, 4096)  # choose_plan: (128, 6) on the H200 table


@pytest.fixture
def tuned(tmp_path, monkeypatch):
    """A fresh cache folder; ``tuned(config, gpu=FAKE, shape=SHAPE)`` saves an h11 entry there."""
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(tmp_path))

    def save(config, gpu=FAKE, shape=SHAPE):
        M, N, K = shape
        return autotune.save_entry(gpu, {"kernel": "hopper.h11_general", "M": M, "N": N, "K": K, "config": config})
    return save


def test_plan_for_prefers_the_tuned_plan(tuned):
    heuristic = engine.choose_plan(*SHAPE, 132)
    assert heuristic == (128, 6)
    assert engine.plan_for(*SHAPE, 132, gpu=FAKE) == heuristic  # nothing saved
    tuned({"BN": 64, "SPLITS": 4})
    assert engine.plan_for(*SHAPE, 132, gpu=FAKE) == (64, 4)
    assert engine.plan_for(*SHAPE, 132, engine.H200_CLUSTER_CAPACITY, gpu=FAKE) == (64, 4)
    tuned({"BN": 256, "SPLITS": 1})  # a new save is seen at once (the file's stat changed)
    assert engine.plan_for(*SHAPE, 132, gpu=FAKE) == (256, 1)
    assert engine.plan_for(*SHAPE, 132) == heuristic  # no GPU key: no lookup
    assert engine.plan_for(200, 1024, 4095, 132, gpu=FAKE) == engine.choose_plan(200, 1024, 4095, 132)  # exact shape only
    # The ladder step's own answer agrees (KernelSpec.config_for asks the same file).
    spec = registry.get("h11")
    assert spec.config_for(*SHAPE, 132, tuned=False) == {"BN": 128, "SPLITS": 6}


def test_plan_for_falls_back_for_another_gpu(tuned):
    tuned({"BN": 64, "SPLITS": 4}, gpu=autotune.GpuKey("FAKE H100", 132, "570"))
    tuned({"BN": 64, "SPLITS": 4}, gpu=autotune.GpuKey("FAKE H200", 132, "575"))  # another driver
    assert engine.plan_for(*SHAPE, 132, gpu=FAKE) == (128, 6)
    tuned({"BN": 64, "SPLITS": 4})
    assert engine.plan_for(*SHAPE, 114, gpu=FAKE) == engine.choose_plan(*SHAPE, 114)  # not this GPU's SM count


@pytest.mark.parametrize("config", [
    {"BN": 128, "QSIZE": 4},  # the spec's parameters before plans were tunable
    {"BN": 96, "SPLITS": 1},  # not a tile width
    {"BN": 64, "SPLITS": 8, "ORDER": 1},  # an unknown parameter
])
def test_plan_for_ignores_configs_that_no_longer_resolve(tuned, config):
    tuned(config)
    assert engine.plan_for(*SHAPE, 132, gpu=FAKE) == (128, 6)


def test_plan_for_ignores_plans_the_engine_would_not_run(tuned):
    shape = (128, 1024, 1600)  # 25 k-steps
    tuned({"BN": 64, "SPLITS": 6}, shape=shape)  # a split would be empty
    assert engine.plan_for(*shape, 132, gpu=FAKE) == engine.choose_plan(*shape, 132)
    tuned({"BN": 128, "SPLITS": 4})
    assert engine.plan_for(*SHAPE, 132, {**engine.H200_CLUSTER_CAPACITY, 4: 0}, gpu=FAKE) == (128, 6)
    assert engine.plan_for(*SHAPE, 132, gpu=FAKE) == (128, 4)


def test_plan_for_survives_a_damaged_file(tuned):
    path = tuned({"BN": 64, "SPLITS": 4})
    path.write_text("{not json")
    with pytest.warns(autotune.AutotuneCacheWarning):
        assert engine.plan_for(*SHAPE, 132, gpu=FAKE) == (128, 6)
    doc = {"format": autotune.FORMAT, "entries": {"hopper.h11_general@200x1024x4096": {
        "kernel": "hopper.h11_general", "M": 200, "N": 1024, "K": 4096, "config": {"BN": "64"}}}}
    path.write_text(json.dumps(doc))
    with pytest.warns(autotune.AutotuneCacheWarning, match="malformed"):
        assert engine.plan_for(*SHAPE, 132, gpu=FAKE) == (128, 6)


@pytest.mark.parametrize("M, a_mn, rows", [(1, False, 8), (13, False, 16), (64, False, 64), (65, False, 64),
                                           (128, False, 64), (150, False, 24), (192, False, 64),
                                           (200, False, 64), (13, True, 64)])
def test_short_a_box_holds_the_rows_left(M, a_mn, rows):
    """Tiles whose rows m0 + 64 .. lie past M load the rows left in the tile, rounded up to 8 (K-major A);
    64 where no tile takes the short box or A is MN-major."""
    assert engine.a_rows_loaded(M, a_mn) == rows


# The prepared launches' parameter blocks match the kernels' signatures ---------------------------------

_KIND_TYPES = {"ptr": {"u64", "b64"}, "i64": {"u64", "s64", "b64"}, "i32": {"u32", "s32", "b32"}, "f32": {"f32"},
               "tmap": {"b8[128]"}}


@pytest.mark.parametrize("source, expr, kinds", [
    (engine.SOURCE, "hopper_h11<__nv_bfloat16, __nv_bfloat16, float, 128, 6, 0, 1, 0, 0, 1>", engine._H11_PARAMS),
    (engine.PAD_COPY_SOURCE, "pad_copy<2, 1, 0>", ("ptr", "i64", "ptr", "i64", "i64", "i32")),
    (engine.PAD_COPY_SOURCE, "pad_copy_operands<2, 1, 0>", engine._COPY_PARAMS),
    ("engine/decode.cu", "engine_decode<__nv_bfloat16, __nv_bfloat16, float, 2, 2, 1, 2, 1, true, false, false, false, 0, true>", decode._PARAMS),
    (planner.SOURCE, planner.plan(3000, 3000, 3000, has_c=True, bias_dtype="fp32").name_expression, engine._E2_PARAMS),
])
def test_launcher_parameter_kinds_match_the_kernel(source, expr, kinds):
    """Each prepared launch writes its parameters by position and kind; a kernel signature that changes
    without them would pass garbage, so compare with the PTX entry's parameters."""
    types = ptx_param_types(source, expr)
    assert len(types) == len(kinds), (types, kinds)
    for i, (t, k) in enumerate(zip(types, kinds)):
        assert t in _KIND_TYPES[k], f"parameter {i}: PTX .{t}, launcher kind {k!r}"


# The router (engine.route): which kernel gemmlab.matmul runs, decided on metadata alone -------------------

def _meta(M, N, K, *, dtype=torch.bfloat16, out_dtype=None, b_mn=False):
    a = torch.empty(M, K, dtype=dtype, device="meta")
    b = torch.empty(K, N, dtype=dtype, device="meta") if b_mn else torch.empty(N, K, dtype=dtype, device="meta").t()
    return a, b, torch.empty(M, N, dtype=out_dtype or dtype, device="meta")


def _route(M, N, K, plan=None, sm=132, **kw):
    a, b, out = _meta(M, N, K, **kw)
    return engine.route(a, b, out, bias=None, activation=None, has_c=False, plan=plan, sm_count=sm)


@pytest.mark.parametrize("M, N, K", [(256, 4096, 4096), (2040, 3584, 3584), (300, 1600, 6400), (640, 3001, 2047),
                                     (16384, 3072, 1024), (4096, 4096, 4096), (64, 28672, 8192), (8192, 8192, 512)])
def test_route_runs_the_kernel_the_model_prices_cheaper(M, N, K):
    """Outside decode shapes the route weighs both kernels with one model: the engine kernel's best plan
    (``planner.plan``) against h11's ``choose_plan`` plan priced by ``h11_cost`` x ``h11_factor``."""
    r = _route(M, N, K)
    prof = engine.plan_profile(132)
    assert r.how == "model" and r.plan == planner.plan(M, N, K, profile=prof) and r.h11 == engine.choose_plan(M, N, K, 132)
    h11_s = prof.h11_factor * engine.h11_cost(M, N, K, prof=engine._weighing_profile(prof), plan=r.h11,
                                              direct=(N * 2) % 16 != 0)
    assert r.h11_s == pytest.approx(h11_s)
    assert r.engine_s is not None
    assert r.kernel == ("engine" if r.engine_s < h11_s else "h11")
    assert ("engine kernel" if r.kernel == "engine" else f"h11 BN={r.h11[0]}") in repr(r)


def test_route_splits_the_broad_set_by_what_was_measured():
    """The engine kernel gets the mid-size and partial-wave shapes where it ran faster
    on the H200 (2040x3584x3584: 79.0 against 88.5 us), h11 large shallow prefill ones where its
    overlapped epilogue wins (12608x1024x1024: 40.2 us against the engine kernel's 40.5 and its ping-pong
    plan's 43.1, sha 3f0f16e; 16384x3072x1024 went to the engine's ping-pong plan when its price lost the
    turn cost it did not pay: 147.3 us, 1.096x torch, against h11's 150.8 us, 1.070x). Since SWAP_WIDE the
    engine kernel's swapped ping-pong plan takes 12608x1024x1024 too (1.137x torch.mm against h11's 1.105,
    swap_any_probe.jsonl), and no shape of the set is priced to h11."""
    assert _route(2040, 3584, 3584).kernel == "engine"
    r = _route(12608, 1024, 1024)
    assert r.kernel == "engine" and r.plan.swap_ab and r.plan.schedule == "pingpong"
    assert r.plan.predicted_s < r.h11_s
    kinds = {_route(*c.shape).kernel for c in broad_shapes.broad_cases()}
    assert kinds == {"decode", "engine"}


@pytest.mark.parametrize("M, N, K, kernel", [
    (1, 1024, 1152, "decode"),  # H200 (sha ac16df0): decode 2.04x torch, the engine kernel's best plan 1.94x
    (1, 2048, 2048, "decode"),  # 1.13x against 0.96x
    (16, 12288, 4096, "engine"),  # a weight streamed from HBM: decode 0.75x, a 64-row plan 0.96x
    (32, 6144, 5120, "engine"),  # 0.72x against 0.97x
    (4, 10240, 8192, "engine"),  # 0.88x against 1.12x
    (32, 4800, 1600, "engine"),  # 0.67x against 0.95x
    # Split three ways it ran 0.92x against 1.29x (H200, c2b08e8); unsplit since its fix-up is priced as
    # measured (session 49): 6.33 us against the engine kernel's 6.59 (H100, facb4df).
    (2, 576, 7168, "decode"),
    # The decode price with its stream slowing by an NT column's share (session 49; H200 at 5aa5d67, the
    # decode kernel at today's plans): decode 1.015x against the engine kernel's 0.921x, 0.979 / 0.944,
    # 1.270 / 1.177, 1.129 / 1.092.
    (32, 1024, 1024, "decode"),
    (32, 896, 896, "decode"),
    (2, 2048, 11008, "decode"),
    (16, 3072, 768, "decode"),
    # Priced within 5% of the engine kernel's weighed price (decode_weighed_engine_share), which its plans run
    # under: the engine kernel 1.071x against the decode kernel's 0.996, 0.973 / 0.967 (5aa5d67).
    (8, 6400, 1600, "engine"),
    (1, 5120, 5120, "engine"),
])
def test_route_prices_the_decode_kernel_against_the_engine_kernel(M, N, K, kernel):
    """Where ``use_decode`` allows the decode kernel, it runs only if ``decode.cost_s`` is at most the engine
    kernel's best plan's price (at ``decode_weighed_engine_share`` of it); otherwise the call is routed as any
    other (here: to the engine kernel). The shapes are broad-set records where one kernel ran faster than the
    other on the H200. Where the decode kernel's plan splits K, the engine kernel runs whatever the prices
    say."""
    r = _route(M, N, K)
    prof = engine.plan_profile(132)
    assert r.plan == planner.plan(M, N, K, profile=prof)
    assert r.decode_s == pytest.approx(decode.cost_s(M, N, K, 132, prof))
    whole_k = decode.plan(M, N, K, 132).splits == 1
    _, price = engine._engine_plan(*_meta(M, N, K), None, False, None, False, prof)
    assert r.engine_s == pytest.approx(price)
    assert (r.kernel == "decode") == (r.decode_s <= price * prof.decode_weighed_engine_share and whole_k)
    assert r.kernel == kernel
    assert r.how == ("decode priced" if kernel == "decode" else "model")
    assert ("decode kernel" in repr(r)) == (kernel == "decode")


@pytest.mark.parametrize("M, N, K", [(1, 1536, 7168), (2, 3072, 3072), (2, 1536, 8960), (16, 1152, 1024)])
def test_route_weighs_the_engine_kernel_without_the_small_split_discount(M, N, K):
    """plan_cost.split_sync_s lets the engine kernel pick small split-K plans, but the router weighs its
    price against the decode kernel's (and h11's) as before the discount (engine._weighing_profile): on
    these decode shapes the engine kernel's discounted pick ran 6-11% slower than the decode kernel
    (1x1536x7168 1.208x torch.mm against 1.338; split_sync_probe.jsonl, the broad run be963b8)."""
    prof = engine.plan_profile(132)
    weigh = engine._weighing_profile(prof)
    assert weigh is engine._weighing_profile(prof) and weigh.cluster_sync_small_s == prof.cluster_sync_s
    r = _route(M, N, K)
    assert r.kernel == "decode"
    assert r.plan == planner.plan(M, N, K, profile=prof)  # the engine kernel's own pick is the discounted one
    assert r.decode_s > r.plan.predicted_s or r.plan != planner.plan(M, N, K, profile=weigh)


def test_route_plans_with_the_profile_it_is_given():
    """``route(profile=)`` (the benchmarks that replay the router on records under other constants) prices
    both kernels with that profile: a decode kernel priced 20 us dearer runs nowhere it ran before."""
    M, N, K = 2, 3072, 3072  # the decode kernel, 1.409x torch.mm against the engine kernel's 1.245 (7b947dc)
    assert _route(M, N, K).kernel == "decode"
    slow = dataclasses.replace(engine.plan_profile(132), decode_fixed_s=20e-6)
    r = engine.route(*_meta(M, N, K), bias=None, activation=None, has_c=False, sm_count=132, profile=slow)
    assert r.kernel == "engine" and r.decode_s == pytest.approx(decode.cost_s(M, N, K, 132, slow))


def test_route_prices_no_decode_kernel_where_it_cannot_run():
    """A weight that is not K-contiguous (use_decode: no) or past DECODE_MAX_WEIGHT_DIM is never priced."""
    assert _route(1, 2048, 2048, b_mn=True).decode_s is None
    assert _route(1, 2048, 2048, b_mn=True).kernel != "decode"
    r = _route(8, engine.DECODE_MAX_WEIGHT_DIM + 16, 4096)
    assert r.decode_s is None and r.kernel in ("engine", "h11")


def test_route_forces_the_decode_kernel_where_it_can_run():
    """``plan="decode"``: the decode kernel whatever the prices say (tests and the sanitizer driver use it);
    UnsupportedProblem where use_decode rules it out; any other string is refused."""
    r = _route(16, 12288, 4096, plan="decode")  # priced out: the engine kernel unforced
    assert (r.kernel, r.how, r.decode_s) == ("decode", "forced", None) and "forced" in repr(r)
    with pytest.raises(UnsupportedProblem, match="M=33 > 32"):
        _route(33, 1024, 1024, plan="decode")
    with pytest.raises(UnsupportedProblem, match="DECODE_MAX_WEIGHT_DIM"):
        _route(1, engine.DECODE_MAX_WEIGHT_DIM + 8, 1024, plan="decode")
    with pytest.raises(UnsupportedProblem, match="not K-contiguous"):
        _route(1, 1024, 1024, plan="decode", b_mn=True)
    with pytest.raises(UnsupportedProblem, match="unknown plan 'h11'"):
        _route(1, 1024, 1024, plan="h11")


def test_route_keeps_decode_tuned_and_forced_choices(tuned):
    assert _route(1, 2048, 2048).kernel == "decode"
    assert _route(1, 4096, 4096, plan=(64, 1)).kernel == "h11"  # forced h11, even at a decode shape
    p = planner.plan(1, 4096, 4096)
    r = _route(1, 4096, 4096, plan=p)
    assert (r.kernel, r.plan, r.how) == ("engine", p, "forced")
    tuned({"BN": 64, "SPLITS": 4})
    a, b, out = _meta(*SHAPE)
    r = engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=132, gpu=lambda: FAKE)
    assert (r.kernel, r.h11, r.how) == ("h11", (64, 4), "tuned")


def test_route_plans_for_the_layout_dtypes_and_epilogue():
    a = torch.empty(640, 2047, dtype=torch.float16, device="meta")
    b = torch.empty(2047, 3001, dtype=torch.float16, device="meta")  # N-contiguous, rows of 6002 B: a copy
    out = torch.empty(640, 3001, dtype=torch.float32, device="meta")
    bias = torch.empty(3001, dtype=torch.float32, device="meta")
    r = engine.route(a, b, out, bias=bias, activation="gelu", has_c=True, sm_count=132)
    p = r.plan
    assert (p.dtype, p.out_dtype, p.bias_dtype, p.activation, p.has_c) == ("fp16", "fp32", "fp32", "gelu", True)
    # B is copied (rows of 6002 B) in the order it is contiguous in: MN-major; output rows of 12004 B: direct.
    assert (p.a_mn, p.b_mn, p.direct) == (False, True, True) and p.bn % 64 == 0


def test_route_plans_for_the_gpus_sm_count():
    r = _route(2040, 3584, 3584, sm=114)
    assert r.plan.grid <= 114 and engine.plan_profile(114).sm_count == 114


@pytest.mark.parametrize("sm", [16, 78, 114])
@pytest.mark.parametrize("M, N, K", [(64, 4096, 3584), (32, 1024, 1024), (512, 1024, 8192), (8192, 8191, 1000),
                                     (256, 1536, 7168), (1, 4096, 4096)])
def test_plans_for_a_gpu_with_fewer_sms_fit_its_clusters(sm, M, N, K):
    """On a GPU of fewer SMs than the H200 (an H100 PCIe's 114, an H20's 78, a MIG slice) the plan's clusters
    are counted from that GPU's SMs, not the H200's table: a multicast plan's persistent grid and a split-K
    plan's waves of clusters fit what it holds at once (never more clusters of s than SMs // s)."""
    import gemmlab

    prof = engine.plan_profile(sm)
    for s, n in prof.cluster_capacity:
        assert 0 <= n <= sm // s and n <= dict(H200.cluster_capacity)[s]
    p = gemmlab.plan(M, N, K, sm_count=sm).plan
    assert p.grid <= (sm if p.schedule != "split_k" else p.tiles * p.splits)
    if p.mcast > 1:
        assert p.grid <= p.mcast * prof.clusters(p.mcast)
    if p.schedule == "split_k":
        assert prof.clusters(p.splits) >= 1


def test_route_sizes_the_engine_plan_by_the_gpus_own_cluster_table():
    """Where the GPU is not a 132-SM one, ``route`` asks it how many clusters it holds (the callable) and the
    engine kernel's plan is priced with that table; on a 132-SM GPU that plan keeps the H200's (the one
    fitted; h11's plan asks the GPU's either way)."""
    asked = []
    none_of_4 = {1: 114, 2: 57, 3: 38, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0}

    def capacity():
        asked.append(1)
        return none_of_4
    a, b, out = _meta(256, 1536, 7168)
    r = engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=114, capacity=capacity)
    assert asked and engine.plan_profile(114, none_of_4).clusters(4) == 0
    assert r.plan == planner.plan(256, 1536, 7168, profile=engine.plan_profile(114, none_of_4))
    assert not (r.plan.schedule == "split_k" and r.plan.splits >= 4)
    r = engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=132, capacity=capacity)
    assert r.plan == planner.plan(256, 1536, 7168, profile=H200) and engine.plan_profile(132) is H200


# The broad set's shapes whose H200 pick is stream-K (bb0d0cc's records), and the H100 SXM's memory peak.
STREAM_K_PICKS = ((8192, 8192, 28672), (16384, 4544, 18176), (5000, 5376, 21504), (4096, 57344, 8192))
H100_SXM_PEAK = 2 * 2619e6 * 5120 / 8  # 3.35 TB/s: HBM3 at 2619 MHz on a 5120-bit bus


def test_stream_k_is_offered_only_where_the_memory_is_as_fast_as_the_h200s():
    """On a GPU whose memory peaks under devices.STREAM_K_MIN_MEMORY_SHARE of the H200's (an H100 SXM: stream-K
    measured 0.53-0.98x torch.mm there) no plan the model lists is stream-K, and the route picks another;
    with the H200's peak, or an unknown one, the picks stay what they were (stream-K on these shapes)."""
    from gemmlab import devices

    assert devices.stream_k_offered(None) and devices.stream_k_offered(H200.hbm_peak_bytes_per_s)
    assert not devices.stream_k_offered(H100_SXM_PEAK)
    slow = engine.plan_profile(132, None, stream_k=False)
    assert not slow.stream_k_offered and engine.plan_profile(132, None, stream_k=False) is slow
    assert engine.plan_profile(132, None, stream_k=True) is H200 and slow.sm_count == 132
    for M, N, K in STREAM_K_PICKS:
        assert planner.plan(M, N, K, profile=H200).schedule == "stream_k"
        assert not [p for p in planner.candidates(M, N, K, profile=slow) if p.schedule == "stream_k"]
        a, b, out = _meta(M, N, K)
        routes = {peak: engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=132,
                                     memory_peak=lambda peak=peak: peak)
                  for peak in (None, H200.hbm_peak_bytes_per_s, H100_SXM_PEAK)}
        assert routes[None].plan == routes[H200.hbm_peak_bytes_per_s].plan == planner.plan(M, N, K, profile=H200)
        assert routes[H100_SXM_PEAK].plan.schedule != "stream_k"
        assert routes[H100_SXM_PEAK].plan == planner.plan(M, N, K, profile=slow)


def test_a_gpus_planning_profile_offers_stream_k_by_its_memory():
    from gemmlab import devices
    from gemmlab.gpu import GpuInfo

    def info(peak):
        return GpuInfo(name="a Hopper", capability=(9, 0), sm_count=132, l2_bytes=50 * 2**20,
                       memory_bytes=80 * 2**30, driver="-", torch="-", cuda_runtime="-", hbm_peak_bytes_per_s=peak)
    assert devices.gpu_profile(info(H200.hbm_peak_bytes_per_s)).stream_k_offered
    assert devices.gpu_profile(info(None)).stream_k_offered
    h100 = devices.gpu_profile(info(H100_SXM_PEAK))
    assert not h100.stream_k_offered
    M, N, K = STREAM_K_PICKS[0]
    assert planner.plan(M, N, K, profile=h100).schedule != "stream_k"


def test_gemmlab_plan_says_which_kernel_matmul_runs():
    import gemmlab

    assert gemmlab.plan(1, 2048, 2048).kernel == "decode"
    r = gemmlab.plan(2040, 3584, 3584)
    assert r.kernel == "engine" and "engine kernel" in repr(r) and "2040x3584x3584" in repr(r)
    r = gemmlab.plan(12608, 1024, 1024)  # h11's until SWAP_WIDE; a swapped ping-pong plan since
    assert r.kernel == "engine" and "swap AB" in repr(r)
    with pytest.raises(ValueError, match="M must be >= 1"):
        gemmlab.plan(0, 8, 8)


def test_gemmlab_plan_for_fp32_names_the_ladder_step_matmul_runs():
    import gemmlab
    from gemmlab import fp32

    for M, N, K in ((4096, 4096, 4096), (3, 5, 7), (77, 3000, 2000)):
        r = gemmlab.plan(M, N, K, dtype=torch.float32, bias_dtype=torch.float32, activation="gelu", sm_count=132)
        spec, cfg = fp32.K10, fp32.config_for(M, N, K, 132)  # what ops._run_fp32 launches
        assert (r.kernel, r.step, dict(r.config), r.plan) == ("sgemm", spec.name, dict(cfg), None)
        assert hash(r) == hash(gemmlab.plan(M, N, K, dtype=torch.float32, bias_dtype=torch.float32, activation="gelu",
                                            sm_count=132))  # a Route is a frozen, hashable value
        assert spec.name in repr(r) and f"{M}x{N}x{K}" in repr(r) and "BM=" in repr(r)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"dtype": torch.float8_e4m3fn}, TypeError, "scaled_mm"),
    ({"dtype": "bf16"}, TypeError, "must be a torch.dtype"),
    ({"dtype": torch.float64}, TypeError, "supported: bfloat16, float16"),
    ({"out_dtype": torch.int32}, TypeError, "out_dtype torch.int32 is not supported"),
    ({"bias_dtype": torch.float16}, TypeError, "bias must be torch.bfloat16"),
    ({"activation": "tanh"}, UnsupportedProblem, "unknown activation"),
    ({"M": 2**31}, UnsupportedProblem, "below 2\\^31"),
    ({"M": 2**30, "N": 2**11}, UnsupportedProblem, "limit is 2\\^40"),
    ({"M": 2**40, "K": 2**40}, UnsupportedProblem, "below 2\\^31"),  # before any tensor of that size is made
    ({"dtype": None}, TypeError, "dtype must be a torch.dtype"),
    ({"sm_count": 0}, ValueError, "sm_count must be a positive integer"),
    ({"sm_count": -4}, ValueError, "sm_count must be a positive integer"),
    ({"sm_count": True}, ValueError, "sm_count must be a positive integer"),
    ({"sm_count": 2.5}, TypeError, "integer"),
])
def test_gemmlab_plan_refuses_what_matmul_refuses(kwargs, error, match):
    import gemmlab

    sizes = {"M": kwargs.pop("M", 64), "N": kwargs.pop("N", 64), "K": kwargs.pop("K", 64)}
    with pytest.raises(error, match=match):
        gemmlab.plan(sizes["M"], sizes["N"], sizes["K"], **kwargs)


def test_a_forced_engine_plan_must_match_the_tensors():
    a, b, out = _meta(256, 512, 1024)
    wrong = planner.plan(256, 512, 2048)
    with pytest.raises(UnsupportedProblem, match="plan is for 256x512x2048"):
        engine.Engine2Launch(a, b, out, bias=None, c=None, plan=wrong)
    mn = planner.plan(256, 512, 1024, b_mn=True)
    with pytest.raises(UnsupportedProblem, match="b_mn=True"):
        engine.Engine2Launch(a, b, out, bias=None, c=None, plan=mn)
