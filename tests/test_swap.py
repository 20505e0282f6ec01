"""Swap-AB plans of the engine kernel (``Plan.swap_ab``: out^T = W @ A^T, the weight as the wgmma's 64-row
operand, the tokens as its n), without a GPU: what the planner offers and when, the plan's geometry, the
launch arguments against the kernel's PTX parameters, the prepared launch's parameter block, and that every
swapped instantiation the planner can offer compiles clean with a transposed stmatrix."""

import dataclasses
import math
import re

import pytest
import torch

from gemmlab import devices, engine, engine2, planner, sass

from fakes import launch_arg_types, ptx_param_types, unsigned


def _swapped(M, N, K, **kw):
    return [p for p in planner.candidates(M, N, K, swap_ab=True, **kw) if p.swap_ab]


# What the planner offers ----------------------------------------------------------------------------------

def test_swapped_plans_are_offered_where_they_apply(monkeypatch):
    assert planner.SWAP_AB is True  # on by default since the H200 timed them (swap_probe.jsonl)
    assert any(p.swap_ab for p in planner.candidates(16, 14336, 4096))
    assert _swapped(16, 14336, 4096)
    past = _swapped(planner.SWAP_MAX_M + 1, 14336, 4096)  # past SWAP_MAX_M tokens: few columns of tiles
    assert past and all(math.ceil(p.M / p.bn) <= planner.SWAP_PAD_COLUMNS and p.schedule == "data_parallel"
                        for p in past)
    assert any(p.bn < p.M for p in past) and any(p.bn >= p.M for p in past)
    wide = _swapped(planner.SWAP_PAD_MAX_M + 1, 14336, 4096)  # SWAP_WIDE: any columns, DP and ping-pong
    assert wide and max(p.tiles_n for p in wide) > planner.SWAP_PAD_COLUMNS
    assert {p.schedule for p in wide} == {"data_parallel", "pingpong"}
    monkeypatch.setattr(planner, "SWAP_WIDE", False)
    assert not _swapped(planner.SWAP_PAD_MAX_M + 1, 14336, 4096)
    assert "SWAP_WIDE" in planner.swap_problem(planner.SWAP_PAD_MAX_M + 1, "bf16")
    monkeypatch.setattr(planner, "SWAP_WIDE", True)
    assert not _swapped(16, 14336, 4096, out_dtype="fp32")  # the transposed store writes 16-bit output
    assert planner.swap_problem(16, "bf16") is None and "16-bit" in planner.swap_problem(16, "fp32")
    monkeypatch.setattr(planner, "SWAP_AB", False)
    assert not any(p.swap_ab for p in planner.candidates(16, 14336, 4096))


@pytest.mark.parametrize("M", [1, 8, 16, 32])
def test_few_tokens_prefer_a_swapped_plan(M):
    """Up to SWAP_PREFER_M tokens the first candidate is swapped (the model's best of them), then the plain
    ones; past it the model alone ranks both kinds."""
    ps = planner.candidates(M, 14336, 4096)
    n_swapped = sum(p.swap_ab for p in ps)
    assert n_swapped and all(p.swap_ab for p in ps[:n_swapped])  # every swapped plan first
    swapped = [p for p in ps if p.swap_ab]
    assert swapped == sorted(swapped, key=planner.plan_key)
    assert planner.plan(M, 14336, 4096).swap_ab
    assert not planner.plan(M, 14336, 4096, out_dtype="fp32").swap_ab  # none applies: the plain plan


@pytest.mark.parametrize("M", [1, 16])
def test_a_streamed_best_swapped_plan_is_not_preferred(M):
    """Where the model's best swapped plan is stream-K (11008 weight rows: 172 swapped tiles, 1.3 waves) the
    model ranks both kinds: the swapped stream-K plans ran 0.90-0.92x torch.mm there, the plain 64 x 144
    data-parallel plan 0.99-1.01x (H200). A 128-row swapped tile would fill 86 of 132 SMs (_tall_fills: no)."""
    ps = planner.candidates(M, 11008, 4096)
    assert _swapped(M, 11008, 4096)[0].schedule == "stream_k"
    assert not any(p.bm > 64 for p in _swapped(M, 11008, 4096))
    keys = [planner.plan_key(p) for p in ps]
    assert keys == sorted(keys)
    assert not planner.plan(M, 11008, 4096).swap_ab
    assert planner.plan(M, 4096, 11008).swap_ab  # a split-K swapped plan is still preferred


@pytest.mark.parametrize("M, N, K", [(1, 8960, 1536), (4, 8960, 1536), (16, 8960, 1536), (2, 10240, 1024)])
def test_a_swapped_plan_priced_past_the_margin_is_not_preferred(M, N, K):
    """Where the model prices the best swapped plan at SWAP_PREFER_MARGIN times the best plain plan or more
    (140-160 swapped 64-row tiles: a second wave almost empty; 112-128 plain 64 x 80 tiles: one wave) the
    model ranks both kinds, and the plain plan runs: H200 0.90-0.96x torch.mm swapped, 1.04-1.12x plain."""
    ps = planner.candidates(M, N, K)
    best_swapped = min((p for p in ps if p.swap_ab), key=planner.plan_key)
    best_plain = min((p for p in ps if not p.swap_ab), key=planner.plan_key)
    assert best_swapped.predicted_s >= planner.SWAP_PREFER_MARGIN * best_plain.predicted_s
    assert best_swapped.tiles > 132 >= best_plain.tiles
    keys = [planner.plan_key(p) for p in ps]
    assert keys == sorted(keys)
    assert planner.plan(M, N, K) == best_plain
    # Under the margin the preference holds: 2 x 3072 x 3072's swapped plan priced ~1.3x the plain one.
    near = planner.candidates(2, 3072, 3072)
    assert near[0].swap_ab
    assert near[0].predicted_s < planner.SWAP_PREFER_MARGIN * min(
        (p for p in near if not p.swap_ab), key=planner.plan_key).predicted_s


@pytest.mark.parametrize("M, N, K", [(4, 10240, 8192), (8, 17408, 5120), (1, 11007, 4096), (8, 5120, 32768),
                                     (2, 18432, 2304)])
def test_a_swapped_plan_past_one_wave_is_preferred_only_within_the_narrow_margin(monkeypatch, M, N, K):
    """Where the best swapped plan runs past one wave (more tiles than CTAs, or more split-K clusters than
    the GPU holds) SWAP_PREFER_WAVES_MARGIN replaces SWAP_PREFER_MARGIN. Planned as for an H100 (no stream-K,
    ``engine.plan_profile``), where the swapped plans of these shapes ran 4-12% behind the plain one-wave
    plan (h100_engine_broad.jsonl); the plain plan goes first, and with the wide margin the swapped one would."""
    no_sk = dataclasses.replace(devices.H200, stream_k_offered=False)
    ps = planner.candidates(M, N, K, profile=no_sk)
    best_swapped = min((p for p in ps if p.swap_ab), key=planner.plan_key)
    best_plain = min((p for p in ps if not p.swap_ab), key=planner.plan_key)
    assert best_swapped.schedule != "stream_k" and planner.runs_past_one_wave(best_swapped, no_sk)
    assert not planner.runs_past_one_wave(best_plain, no_sk)
    assert (planner.SWAP_PREFER_WAVES_MARGIN * best_plain.predicted_s <= best_swapped.predicted_s
            < planner.SWAP_PREFER_MARGIN * best_plain.predicted_s)
    assert K >= planner.SWAP_PREFER_WAVES_MIN_K and ps[0] == best_plain
    monkeypatch.setattr(planner, "SWAP_PREFER_WAVES_MARGIN", planner.SWAP_PREFER_MARGIN)
    planner._CACHE.clear()
    assert planner.candidates(M, N, K, profile=no_sk)[0] == best_swapped
    planner._CACHE.clear()


def test_short_k_keeps_the_wide_margin(monkeypatch):
    """Under SWAP_PREFER_WAVES_MIN_K the wide margin holds past one wave too: 16 x 12288 x 1024's swapped
    ping-pong plan (192 tiles) ran 3% ahead of the plain 64 x 96 plan held out (H100), which the model prices
    1.2x faster."""
    no_sk = dataclasses.replace(devices.H200, stream_k_offered=False)
    first = planner.candidates(16, 12288, 1024, profile=no_sk)[0]
    assert first.swap_ab and first.schedule == "pingpong" and planner.runs_past_one_wave(first, no_sk)
    monkeypatch.setattr(planner, "SWAP_PREFER_WAVES_MIN_K", 1024)
    planner._CACHE.clear()
    assert not planner.candidates(16, 12288, 1024, profile=no_sk)[0].swap_ab
    planner._CACHE.clear()


def test_swapped_plans_past_one_wave_priced_even_stay_preferred():
    """1 x 24576 x 1536: 384 swapped 64 x 16 tiles (2.9 waves, 0.97 of their slots filled) priced even with
    the plain 64 x 208 plan; swapped, they ran 1.048-1.068x as fast (both GPUs), so the preference holds."""
    for prof in (devices.H200, dataclasses.replace(devices.H200, stream_k_offered=False)):
        first = planner.candidates(1, 24576, 1536, profile=prof)[0]
        assert first.swap_ab and (first.bm, first.bn, first.tiles) == (64, 16, 384)
        assert planner.runs_past_one_wave(first, prof)


def test_what_runs_past_one_wave():
    split = next(p for p in planner.candidates(8, 5120, 32768) if p.schedule == "split_k")
    prof = devices.H200
    assert planner.runs_past_one_wave(split, prof) == (split.tiles > prof.clusters(split.splits))
    small = dataclasses.replace(prof, cluster_capacity=((split.splits, split.tiles - 1),))
    assert planner.runs_past_one_wave(split, small)
    dp = planner.plan(4096, 4096, 4096)
    assert dp.schedule in ("data_parallel", "pingpong") and dp.tiles > dp.grid
    assert planner.runs_past_one_wave(dp, prof)
    streamed = _swapped(1, 11008, 4096)[0]  # 172 tiles, but stream-K spreads them: no wave left over
    assert streamed.schedule == "stream_k" and streamed.tiles > streamed.grid
    assert not planner.runs_past_one_wave(streamed, prof)


@pytest.mark.parametrize("M, N, K, bm", [
    (1, 14336, 4096, 128), (16, 14336, 4096, 128), (32, 14336, 4096, 128),  # 112 tiles: 0.85 of the SMs
    (32, 43008, 5376, 128),  # 336 tiles (the 256-row ones: 168, 1.27 waves)
    (8, 28672, 4096, 256), (8, 152064, 3584, 128),
    (32, 8192, 8192, 64), (1, 24576, 1536, 64)])  # taller tiles would idle SMs
def test_decode_weight_streams_take_the_tallest_tile_that_fills_the_sms(M, N, K, bm):
    """NARROW_TALL swapped tiles at the HBM floor: ranked by the model's unfloored time (fewer re-reads of
    the tokens, fewer tiles), offered where their waves fill the SMs (_tall_fills). Measured (H200,
    swap_tall_probe.jsonl, engine_broad.jsonl at 4188a14): 32x14336x4096 128 x 32 1.014x torch.mm against
    64 x 32's 0.926; 32x43008x5376 0.978 / 0.905; 1x24576x1536 256 x 16 (96 tiles) 0.969 / 1.044."""
    p = planner.plan(M, N, K)
    assert p.swap_ab and p.bm == bm and p.schedule == "data_parallel" and p.bn >= M, p
    tall = [c for c in _swapped(M, N, K) if (c.bm, c.bn) in planner.NARROW_TALL]
    assert all(planner._tall_fills(N, M, c.bm, c.bn, 132) for c in tall)
    assert not any(c.schedule != "data_parallel" or c.bn < M for c in tall)
    assert not any(c.bm > 64 for c in _swapped(16, 12288, 4096))  # 96 tall tiles: 0.73 of the SMs


def test_past_the_preference_the_model_ranks_both():
    M = planner.SWAP_PREFER_M + 32
    ps = planner.candidates(M, 3072, 3072)
    assert any(p.swap_ab for p in ps) and any(not p.swap_ab for p in ps)
    keys = [planner.plan_key(p) for p in ps]
    assert keys == sorted(keys)


@pytest.mark.parametrize("M, N, K, swapped", [
    (200, 8192, 5376, True),  # plain 128 x 128 pads 200 tokens to 256; swapped 64 x 208 (H200: 0.965 / 0.836)
    (200, 8192, 3072, True), (77, 6144, 4096, True), (150, 14336, 4096, True),
    (128, 5120, 5120, False),  # no padding to gain (swapped 0.854 / plain 0.922)
    (256, 5120, 5120, False), (100, 4096, 4096, False),  # swapped: 64 tiles only (0.858 / 0.895)
    (160, 5120, 5120, False),
    (77, 2560, 10240, False),  # the plain pick is split-K: the rule does not apply (1.046 / 1.006)
    (77, 32000, 4096, True),  # 128-row swapped tiles over 1.9 waves (broad set: 1.059 / 0.994)
    (77, 17920, 5120, False),  # 64-row swapped tiles over 2.1 waves: one consumer, not in one wave (0.851 / 1.049)
    # several columns of token tiles (swap_multi_probe.jsonl: swapped / plain)
    (200, 5376, 4096, True),  # 128 x 80 over 3 columns (240 tokens): 1.219 / 1.114
    (200, 4096, 4096, True),  # 64 x 112 over 2 (224): 1.080 / 0.986
    (300, 5120, 27648, False),  # plain 64 x 208 (320 rows): 1.069 / swapped 128 x 112 0.990 (one_consumer_probe)
    (300, 7168, 16384, True)])  # 128 x 160 over 2 (320): 0.964 / 0.878
def test_past_swap_max_m_the_padding_rule_ranks_swapped_tiles_of_few_columns(M, N, K, swapped):
    """SWAP_PAD_MAX_M: the best swapped plan of up to SWAP_PAD_COLUMNS token columns goes first where the best
    plain plan is data-parallel and the swapped price is below the plain one x (plain padded rows / swapped
    padded tokens) ** 0.75; the shapes are the probes' (swap_mid_probe.jsonl, swap_multi_probe.jsonl), each
    on the side it measured faster."""
    ps = planner.candidates(M, N, K)
    first = ps[0]
    assert first.swap_ab == swapped, first
    plain = next(p for p in ps if not p.swap_ab)
    rest = [p for p in ps if p is not first]
    keys = [planner.plan_key(p) for p in rest]
    assert keys == sorted(keys)  # only the rule's pick moves
    if swapped:
        assert first.tiles_n <= planner.SWAP_PAD_COLUMNS and first.schedule == plain.schedule == "data_parallel"
        padded = math.ceil(M / plain.bm) * plain.bm / (first.tiles_n * first.bn)
        assert first.predicted_s < plain.predicted_s * padded ** planner.SWAP_PAD_EXPONENT
        r = _route(M, N, K)  # gemmlab.matmul runs it, weighed against h11 at the plain plan's price
        assert r.kernel == "engine" and r.plan == first
    assert planner.candidates(M, N, K, swap_ab=False)[0] == plain


@pytest.mark.parametrize("M, N, K, swapped", [
    # swap_any_probe.jsonl (H200): the swapped pick / the plain one, ratios to torch.mm
    (12608, 768, 3072, True),  # 128 x 144 ping-pong over 99 token columns: 1.050 / 0.951
    (5000, 896, 4864, True),  # 128 x 144 ping-pong: 1.020 / 0.944
    (3000, 1024, 3072, True),  # 128 x 192 data-parallel: 1.020 / 0.953
    (4096, 4096, 4096, False),  # square, aligned: the plain and swapped plans priced alike
    (1536, 6144, 6144, False),  # swapped priced within the margin (it measured 1.008 / 1.037)
    (300, 3584, 14336, False)])  # at most SWAP_PAD_MAX_M tokens: the padding rule (split-K swapped: 0.996 / 1.199)
def test_past_swap_pad_max_m_a_swapped_plan_goes_first_only_priced_below_the_margin(M, N, K, swapped):
    """SWAP_WIDE: past SWAP_PAD_MAX_M tokens the best swapped plan goes first only where the model prices it
    below SWAP_WIDE_MARGIN x the best plain plan; otherwise the best plain plan does. Either way the rest
    stay in the model's order."""
    ps = planner.candidates(M, N, K)
    first = ps[0]
    assert first.swap_ab == swapped, first
    plain = next(p for p in ps if not p.swap_ab)
    best_swapped = next((p for p in ps if p.swap_ab), None)
    if M > planner.SWAP_PAD_MAX_M:
        assert best_swapped is not None
        assert (best_swapped.predicted_s < planner.SWAP_WIDE_MARGIN * plain.predicted_s) == swapped
    if swapped:
        assert first.schedule in ("data_parallel", "pingpong") and first.tiles_n > planner.SWAP_PAD_COLUMNS
        r = _route(M, N, K)  # gemmlab.matmul runs it at its own price
        assert r.kernel == "engine" and r.plan == first
    rest = [p for p in ps if p is not first]
    keys = [planner.plan_key(p) for p in rest]
    assert keys == sorted(keys)


def test_the_module_flag_and_the_cache_keep_the_two_apart(monkeypatch):
    monkeypatch.setattr(planner, "SWAP_AB", False)
    before = planner.plan(16, 8192, 1024)
    assert not before.swap_ab
    monkeypatch.setattr(planner, "SWAP_AB", True)
    p = planner.plan(16, 8192, 1024)  # the model prices the swapped 64 x 16 tiles ahead here
    assert p.swap_ab and p.predicted_s < before.predicted_s
    assert "swap AB" in repr(p) and "swap AB" not in repr(before)
    r = engine.plan(16, 8192, 1024)  # gemmlab.plan: what matmul runs
    assert r.kernel == "engine" and r.plan.swap_ab and "swap AB" in repr(r)
    monkeypatch.setattr(planner, "SWAP_AB", False)
    assert planner.plan(16, 8192, 1024) == before


@pytest.mark.parametrize("M", [1, 7, 16, 33, 64])
def test_swapped_plans_tile_the_transposed_problem(M):
    N, K = 4104, 1000
    ps = _swapped(M, N, K, schedules=planner.SCHEDULES)
    assert {p.schedule for p in ps} >= {"data_parallel", "stream_k"}
    for p in ps:
        assert (p.M, p.N, p.K) == (M, N, K) and (p.kernel_m, p.kernel_n) == (N, M)
        assert p.bn <= -(-M // 16) * 16 and p.bn % 16 == 0  # tokens as the wgmma's n, rounded to 16
        assert p.tiles == -(-N // p.bm) * -(-M // p.bn)
        assert p.a_rows == min(p.bm, -(-(N - (p.tiles_m - 1) * p.bm) // 8) * 8)  # weight rows of the last tile
        assert p.template_args()[13] == "true"  # TRANS_OUT
        box, tail, swz = p.store_boxes()
        assert box == (64, 64) and swz == 128  # W tile columns = out rows of one 128-byte swizzle row
        assert tail == ((p.bn % 64, 64) if p.bn % 64 else None)
        # Priced as the transposed problem.
        t = planner.plan_cost.predict_s(N, M, K, bm=p.bm, bn=p.bn, schedule=p.schedule, stages=p.stages,
                                        splits=p.splits, sk_tiles=p.sk_tiles, sk_ctas=p.sk_ctas, prof=planner.H200,
                                        misaligned=planner.plan_cost.misaligned_operands(M, N, K, p.a_mn,
                                                                                         p.b_mn)[::-1])
        assert p.predicted_s == t
    plain = [p for p in planner.candidates(M, N, K) if not p.swap_ab]
    assert all(p.template_args()[13] == "false" for p in plain)
    assert plain[0].store_boxes() == ((64, 64), ((64, plain[0].bn % 64) if plain[0].bn % 64 else None), 0)


def test_swapped_operand_layouts_follow_the_kernel_operands():
    # A stored (K, M) (a_mn) is the kernel's B: MN-major B needs 64-column boxes, so bn = 64 only.
    ps = _swapped(64, 4096, 4096, a_mn=True)
    assert ps and all(p.bn == 64 and p.kernel_b_mn and not p.kernel_a_mn for p in ps)
    assert all(p.template_args()[6:8] == ("false", "true") for p in ps)
    q = _swapped(16, 4096, 4096, b_mn=True)[0]  # B stored (K, N): the weight, the kernel's A, MN-major
    assert q.kernel_a_mn and not q.kernel_b_mn and q.template_args()[6:8] == ("true", "false")


# The launch ---------------------------------------------------------------------------------------------

def test_launch_arguments_match_the_kernel_parameters(monkeypatch):
    """engine2.launch of a swapped plan, captured on CPU tensors: the kernel's A map is over the weight
    (N x K, bm rows), its B map over the tokens (M x K, bn rows), the C maps over the real out with 64-column
    boxes of W out rows (128-byte swizzle, the tail too), the kernel's M x N = N x M, C's strides swapped,
    every argument in the kernel's PTX parameter order and size."""
    M, N, K = 33, 1000, 1024
    p = next(c for c in _swapped(M, N, K, has_c=True, bias_dtype="bf16") if c.bn == 48)
    captured = {}
    monkeypatch.setattr(engine2, "compile_plan", lambda p: "compiled")
    monkeypatch.setattr(engine2, "tensor_map_2d",
                        lambda t, box, swizzle_bytes=128: ("tmap", t.data_ptr(), tuple(t.shape), tuple(box), swizzle_bytes))
    monkeypatch.setattr(engine2, "plan_order", lambda p, dev: torch.zeros(p.tiles, dtype=torch.int32))
    monkeypatch.setattr(engine2, "_launch", lambda compiled, **kw: captured.update(kw))
    a, w = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
    out, c = torch.empty(M, N, dtype=torch.bfloat16), torch.empty(N, M, dtype=torch.bfloat16).t()
    engine2.launch(p, a, w.t(), out, beta=0.5, c=c, bias=torch.zeros(N, dtype=torch.bfloat16))
    args = captured["args"]
    assert launch_arg_types(args) == unsigned(ptx_param_types(planner.SOURCE, p.name_expression))
    assert captured["grid"] == p.grid and captured["block"] == p.threads and captured["smem"] == p.smem_bytes
    assert args[0] == ("tmap", w.data_ptr(), (N, K), (p.bm, 64), 128)
    assert args[1] == ("tmap", w.data_ptr(), (N, K), (p.a_rows, 64), 128) and p.a_rows == 1000 - 960
    assert args[2] == ("tmap", a.data_ptr(), (M, K), (p.bn, 64), 128)
    assert args[4] == ("tmap", out.data_ptr(), (M, N), (48, 64), 128)  # tail piece: 48 out rows
    assert [int(x) for x in args[6:9]] == [N, M, K]
    assert (int(args[12]), int(args[13])) == (c.stride(1), c.stride(0)) == (M, 1)
    assert int(args[16]) == out.stride(0) == N


class _Recorder:
    """jit.launch.Launcher / MapSlot stand-ins that record the parameter block."""

    def __init__(self, monkeypatch):
        rec = self
        self.values, self.maps = {}, {}

        class Launcher:
            def __init__(self, compiled, kinds, *, grid, block, smem=0, cluster=None, device_index=0, pdl=False):
                self.kinds = kinds
                self.lock = __import__("threading").Lock()
                rec.launches = 0
                rec.pdl = pdl

            def set_ptr(self, i, v):
                rec.values[i] = v

            set_i32 = set_i64 = set_f32 = set_ptr

            def set_map(self, i, tmap):
                rec.maps.setdefault(i, tmap)

            def launch(self, stream):
                rec.launches += 1

        class MapSlot:
            def __init__(self, launcher, index, ptr, rows, cols, stride, dtype, box, *, swizzle_bytes=128):
                self.tmap = (rows, cols, stride, tuple(box), swizzle_bytes)
                self.ptr = ptr
                rec.maps[index] = self.tmap
                rec.values[("map", index)] = ptr
                self.index = index

            def point_at(self, ptr):
                rec.values[("map", self.index)] = ptr

        monkeypatch.setattr(engine, "compile_kernel", lambda *a, **k: None)
        monkeypatch.setattr(engine, "Launcher", Launcher)
        monkeypatch.setattr(engine, "MapSlot", MapSlot)
        monkeypatch.setattr(engine, "device_order_table", lambda *a, **k: torch.zeros(4, dtype=torch.int32))
        monkeypatch.setattr(engine, "_index", lambda device: 0)


def test_prepared_launch_swaps_the_operands_and_only_addresses_change(monkeypatch):
    """Engine2Launch (gemmlab.matmul's prepared path) for a swapped plan: the kernel's M, N are N, M, its A
    map follows the weight and its B map the tokens from call to call, C's strides are swapped."""
    rec = _Recorder(monkeypatch)
    M, N, K = 16, 4096, 1024
    p = _swapped(M, N, K, has_c=True)[0]
    a, w = torch.randn(M, K).bfloat16(), torch.randn(N, K).bfloat16()
    out, c = torch.empty(M, N, dtype=torch.bfloat16), torch.empty(M, N, dtype=torch.bfloat16)
    call = engine.Engine2Launch(a, w.t(), out, bias=None, c=c, plan=p)
    assert rec.pdl is True  # engine_gemm waits (pdl_wait) before any global access: launched with PDL
    assert [rec.values[i] for i in (6, 7, 8)] == [N, M, K]
    assert (rec.values[12], rec.values[13]) == (1, N)  # ldc_row, ldc_col: C(r = out column, c = out row)
    assert rec.maps[engine._E2_A][:2] == (N, K) and rec.maps[engine._E2_A][3] == (p.bm, 64)
    assert rec.maps[engine._E2_B][:2] == (M, K) and rec.maps[engine._E2_B][3] == (p.bn, 64)
    assert rec.maps[engine._E2_C][:2] == (M, N) and rec.maps[engine._E2_C_TAIL][3:] == ((16, 64), 128)
    a2, w2, out2 = a.clone(), w.clone(), out.clone()
    call.run(0, a2, w2.t(), out2, None, c, 1.0, 0.5)
    assert rec.launches == 1
    assert rec.values[("map", engine._E2_A)] == w2.data_ptr() and rec.values[("map", engine._E2_B)] == a2.data_ptr()
    assert rec.values[("map", engine._E2_C)] == out2.data_ptr() == rec.values[engine._E2_OUT]


# Compiles (sm_90a, no GPU) --------------------------------------------------------------------------------

def _check(p: planner.Plan) -> None:
    ck = engine2.compile_plan(p)
    summary = sass.kernel_summary(ck)
    assert sass.check(engine2.sass_expect(p), summary, ck.resources) == [], p
    assert engine2.hgmma_shapes(ck) == {f"64x{p.bn}x16.F32" + (".BF16" if p.dtype == "bf16" else "")}, p
    assert not ck.resources.spills and ck.resources.stack_frame == 0, (p, ck.resources)
    for needle in ("serialized", "C7510", "C7519"):
        assert needle not in ck.log, f"{p}:\n{ck.log}"
    text = sass.disassemble(ck.cubin, ck.mangled_name)
    stsm = set(re.findall(r"\bSTSM\.\S+", text))
    if p.schedule == "split_k":  # stores from its DSMEM reduction, no slab
        assert not stsm, (p, stsm)
    else:  # the transposed stmatrix (MT88) only, for TMA and DIRECT stores alike
        assert stsm and all(".MT88" in s for s in stsm), (p, stsm)


def _offered(heavy_too: bool):
    """One swapped plan per (tile, schedule, epilogue) the planner offers at M = 1 .. 64, plain (bf16 out,
    TMA) and heavy (beta * C, bias, gelu, DIRECT, fp16)."""
    variants = [{}]
    if heavy_too:
        variants.append(dict(has_c=True, bias_dtype="fp32", activation="gelu", direct=True, dtype="fp16"))
    seen = {}
    for kw in variants:
        for M in (1, 16, 33, 48, 64, 65, 97, 129, 161, 193, 225, 256, 300, 384, 512):  # past 64: few columns
            for N, K in ((4104, 4096), (14336, 4096), (1000, 14336)):
                for p in _swapped(M, N, K, schedules=planner.SCHEDULES, **kw):
                    seen.setdefault((p.bm, p.bn, p.schedule, tuple(sorted(kw))), p)
    return list(seen.values())


REPRESENTATIVE = [(64, 16, "data_parallel", {}), (64, 48, "stream_k", {}), (64, 32, "split_k", {}),
                  (64, 64, "pingpong", {}), (128, 64, "data_parallel", {}), (64, 16, "split_k_global", {}),
                  (64, 48, "data_parallel", dict(has_c=True, bias_dtype="bf16", activation="silu", direct=True)),
                  (64, 16, "data_parallel", dict(dtype="fp16", direct=True)), (64, 208, "data_parallel", {}),
                  (128, 256, "data_parallel", dict(has_c=True, bias_dtype="fp32", activation="gelu", direct=True)),
                  (256, 96, "data_parallel", dict(has_c=True, bias_dtype="fp32", activation="gelu", direct=True)),
                  (128, 16, "data_parallel", {}),  # NARROW_TALL: one column of tokens under many weight rows
                  (256, 32, "data_parallel", dict(has_c=True, bias_dtype="fp32", activation="gelu", direct=True)),
                  (128, 112, "data_parallel", {})]  # three columns of tokens (300), the last one's box short


@pytest.mark.parametrize("bm, bn, schedule, kw", REPRESENTATIVE,
                         ids=[f"{r[0]}x{r[1]}-{r[2]}-{'-'.join(r[3])}" for r in REPRESENTATIVE])
def test_representative_swapped_plans_compile_clean(bm, bn, schedule, kw):
    M = {16: 16, 32: 32, 48: 33, 64: 64, 96: 90, 112: 300, 208: 200, 256: 256}[bn]
    N = 14336 if schedule == "pingpong" else 4104  # ping-pong needs more tiles than SMs
    if (bm, bn) in planner.NARROW_TALL:
        N = 28672  # tall tiles are offered where they fill the SMs (_tall_fills)
    p = next(c for c in _swapped(M, N, 4096, schedules=planner.SCHEDULES, **kw)
             if (c.bm, c.bn, c.schedule) == (bm, bn, schedule))
    _check(p)


@pytest.mark.slow
@pytest.mark.parametrize("p", _offered(heavy_too=True), ids=lambda p: p.compiled_name)
def test_every_swapped_plan_the_planner_offers_compiles_clean(p):
    _check(p)


def _route(M, N, K):
    a = torch.empty(M, K, dtype=torch.bfloat16, device="meta")
    b = torch.empty(N, K, dtype=torch.bfloat16, device="meta").t()  # a weight's (K, N) view
    out = torch.empty(M, N, dtype=torch.bfloat16, device="meta")
    return engine.route(a, b, out, bias=None, activation=None, has_c=False, sm_count=132)


@pytest.mark.parametrize("M, N, K", [(1, 4096, 11008), (1, 11008, 4096), (16, 11008, 4096), (16, 4096, 11008),
                                     (1, 4096, 4096), (32, 8192, 8192), (8, 1024, 1024), (16, 3072, 1000)])
def test_the_router_weighs_kernels_by_plain_prices_and_runs_the_swapped_plan(monkeypatch, M, N, K):
    """Up to SWAP_PREFER_M tokens the router picks decode / h11 / engine kernel exactly as without swapped
    plans (the plain plans' prices), and where the engine kernel runs, it runs the swapped plan unless the
    best swapped plan is stream-K."""
    on = _route(M, N, K)
    monkeypatch.setattr(planner, "SWAP_AB", False)
    off = _route(M, N, K)
    assert on.kernel == off.kernel
    if on.kernel == "engine":
        best = planner.candidates(M, N, K, a_mn=on.plan.a_mn, b_mn=on.plan.b_mn, swap_ab=True)[0]
        assert on.plan == best and not off.plan.swap_ab
        assert on.plan.swap_ab == (_swapped(M, N, K)[0].schedule != "stream_k")


def test_the_swapped_twin_goes_first_only_at_a_price_tie_where_the_weight_is_the_larger_operand(monkeypatch):
    """planner.swap_twin (SWAP_TWIN, off: a coin flip on two held-out H100 draws): where the plain pick is a
    64-row data-parallel plan wider than 64 and the model prices the same tile over the transposed problem within
    SWAP_TWIN_MARGIN, the twin goes first, past SWAP_PAD_MAX_M tokens too (where no 64-row swapped plan is
    listed otherwise); not where the tokens outnumber the weight's rows, not at a price gap, not at 64 columns
    or fewer (the twin would not have fewer readers a weight panel), not below SWAP_TWIN_MIN_M tokens."""
    assert planner.SWAP_TWIN is False  # off by default: the picks below are the plain ones

    def first(M, N, K, **kw):
        return planner.candidates(M, N, K, **kw)[0]

    for M, N, K in ((640, 1024, 5120), (813, 2048, 11008)):
        plain, twin = first(M, N, K), first(M, N, K, swap_twin=True)
        assert not plain.swap_ab and plain.bm == 64 and plain.schedule == "data_parallel" and plain.bn > 64
        assert twin.swap_ab and (twin.bm, twin.bn, twin.schedule, twin.mcast) == (64, plain.bn, "data_parallel", 1)
        assert twin.predicted_s <= planner.SWAP_TWIN_MARGIN * plain.predicted_s
        assert math.ceil(M / twin.bn) < math.ceil(M / plain.bm)  # fewer readers of each weight panel
        assert twin.kernel_m == N and twin.tiles_n == math.ceil(M / twin.bn)  # weight rows by token columns
    assert not any(p.swap_ab and p.bm == 64 for p in planner.candidates(813, 2048, 11008))  # listed only as a twin
    monkeypatch.setattr(planner, "SWAP_TWIN", True)  # the module's switch, as the keyword does
    assert first(640, 1024, 5120).swap_ab
    monkeypatch.setattr(planner, "SWAP_TWIN", False)
    assert not first(640, 1024, 5120).swap_ab
    # Not taken: the tokens outnumber the weight's rows; the twin priced past the margin (344x2560x18432:
    # +3.5%); a pick 64 columns wide (200x1024x2048: 64 x 32); fewer tokens than SWAP_TWIN_MIN_M.
    for M, N, K in ((1573, 1024, 4608), (344, 2560, 18432), (200, 1024, 2048), (100, 4096, 4096)):
        assert first(M, N, K, swap_twin=True) == first(M, N, K), (M, N, K)
    tokens_first = first(1573, 1024, 4608)
    assert not tokens_first.swap_ab and tokens_first.bm == 64 and tokens_first.bn > 64  # the rule's only bar: N > M


@pytest.mark.parametrize("M, N, K, plain_schedule, swapped_schedule", [
    # pad_any_heldout.jsonl (H100, a draw held out for the rule): swapped pick / the plain one it replaced
    (410, 27392, 4096, "pingpong", "data_parallel"),  # 128 x 144 over 3 columns: 1.170 / 0.982 (plain 512 rows)
    (313, 27392, 5120, "pingpong", "data_parallel"),  # 128 x 112 over 3 columns: 1.147 / 0.983
    (563, 4096, 12800, "data_parallel", "data_parallel"),  # past 512 tokens: 128 x 144 (576): 1.014 / 0.908
    (684, 12800, 4096, "pingpong", "pingpong"),  # 128 x 144 (720 tokens, plain 768 rows): 1.028 / 0.921
    # h100_fresh_losers.jsonl: the fresh draw's 515 tokens, the last plain row of tiles 3 rows of 128
    (515, 8192, 8192, "pingpong", "pingpong")])  # 128 x 144: 0.944 / 0.840
def test_swap_pad_any_ranks_swapped_tiles_where_the_plain_pick_pads_the_tokens(monkeypatch, M, N, K, plain_schedule,
                                                                                swapped_schedule):
    """SWAP_PAD_ANY: the padding rule where the best plain plan is ping-pong too, and past SWAP_PAD_MAX_M where
    the plain tiles pad SWAP_PAD_WIDE_MIN times the swapped tiles' tokens or more. Off, the plain plan the
    rule replaced goes first."""
    ps = planner.candidates(M, N, K)
    first = ps[0]
    plain = next(p for p in ps if not p.swap_ab)
    assert first.swap_ab and first.schedule == swapped_schedule and plain.schedule == plain_schedule, (first, plain)
    padded = math.ceil(M / plain.bm) * plain.bm / (first.tiles_n * first.bn)
    assert padded >= planner.SWAP_PAD_WIDE_MIN
    assert first.predicted_s < plain.predicted_s * padded ** planner.SWAP_PAD_EXPONENT
    r = _route(M, N, K)
    assert r.kernel == "engine" and r.plan == first
    monkeypatch.setattr(planner, "SWAP_PAD_ANY", False)
    assert planner.candidates(M, N, K)[0] == plain


@pytest.mark.parametrize("M, N, K", [(6000, 6000, 6000), (8224, 1024, 1024), (9232, 1408, 6144)])
def test_swap_pad_any_leaves_prefill_whose_tokens_pad_little(monkeypatch, M, N, K):
    """Past SWAP_PAD_MAX_M the rule needs the plain tiles to pad SWAP_PAD_WIDE_MIN times the swapped ones'
    tokens: these prefill shapes pad under 1% more, and keep the pick they had without the rule."""
    first = planner.candidates(M, N, K)[0]
    monkeypatch.setattr(planner, "SWAP_PAD_ANY", False)
    assert planner.candidates(M, N, K)[0] == first


@pytest.mark.parametrize("M, N, K", [
    # h100_fresh.jsonl / h100_span_heldout.jsonl (H100): the swapped pick the rule undoes against the plain plan
    # (ratios to torch.mm); each swapped plan's busiest CTA runs more tile area
    (322, 6144, 6144),  # 128 x 176 over 96 tiles against 128 x 144 over 129 (one wave both): 0.801 / 1.002
    (351, 6144, 16384),  # the same tiles: 0.767 / 0.922
    (422, 6144, 24576),  # 128 x 224 over 96 against 128 x 192 over 128: 0.762 / 0.885
    (683, 13824, 5120)])  # 128 x 176 over 432 tiles (4 a CTA) against 128 x 160 over 522 (4): 0.904 / 1.040
def test_swap_pad_span_keeps_the_plain_pick_where_the_swapped_one_runs_longer(monkeypatch, M, N, K):
    """SWAP_PAD_SPAN: the padding rule moves a pick only where the swapped plan's busiest CTA has no more tile
    area to run than the plain plan's; off, these shapes' picks go back to the swapped plans measured slower."""
    first = planner.candidates(M, N, K)[0]
    assert not first.swap_ab
    monkeypatch.setattr(planner, "SWAP_PAD_SPAN", None)
    swapped = planner.candidates(M, N, K)[0]
    assert swapped.swap_ab
    assert planner._tile_span(swapped) > planner._tile_span(first)
    assert math.ceil(M / first.bm) * first.bm > swapped.tiles_n * swapped.bn  # the swapped plan pads less


def test_swap_pad_span_leaves_picks_that_shorten_the_critical_path_or_have_few_k_steps(monkeypatch):
    """The rule's other picks stay: swapped tiles whose busiest CTA runs less tile area (410 tokens: 128 x 144
    over 3 columns), as much (802 tokens: 128 x 144 ping-pong over 240 tiles against 252, 2 a CTA both; the
    held-out draw's equal-span picks ran x0.978 where a stricter bound undid them), and short k-loops
    (K < SWAP_PAD_SPAN_MIN_K: 200x6144x1024's swapped 64 x 208 ran 2-3% faster than the plain 64 x 192 on
    both GPUs)."""
    for M, N, K in ((515, 8192, 8192), (410, 27392, 4096), (802, 5120, 5120), (2822, 1024, 6144), (200, 6144, 1024)):
        first = planner.candidates(M, N, K)[0]
        assert first.swap_ab, (M, N, K)
        monkeypatch.setattr(planner, "SWAP_PAD_SPAN", None)
        assert planner.candidates(M, N, K)[0] == first
        monkeypatch.setattr(planner, "SWAP_PAD_SPAN", 1.0)
    plain = next(p for p in planner.candidates(200, 6144, 1024) if not p.swap_ab)
    assert planner._tile_span(planner.candidates(200, 6144, 1024)[0]) > planner._tile_span(plain)


def test_tile_span_counts_the_busiest_ctas_tiles():
    p = planner.candidates(683, 13824, 5120)[0]
    assert p.tiles == 522 and p.grid == 132 and planner._tile_span(p) == 4 * p.bm * p.bn
