"""The analytic models against hand-computed cases (pure functions: no GPU needed), and the Hopper pipeline
model against the committed H200 records."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from gemmlab import model, registry


def test_flops_bytes_intensity():
    assert model.flops(4096, 4096, 4096) == 2 * 4096**3
    # bf16 in and out: 2 B x (MK + KN + MN)
    assert model.min_bytes(4096, 4096, 4096, "bf16") == 2 * 3 * 4096**2
    assert model.min_bytes(10, 20, 30, "fp32", read_c=True) == 4 * (300 + 600 + 2 * 200)
    assert model.arithmetic_intensity(4096, 4096, 4096, "bf16") == pytest.approx(4096 / 3)


def test_tile_intensity_prefers_square_tiles():
    # 128 x 256 bf16: 2*128*256 / (384 * 2) = 85.33 FLOP/B, whatever BK
    assert model.tile_intensity(128, 256, 64, "bf16") == pytest.approx(85.333, rel=1e-4)
    assert model.tile_intensity(128, 256, 16, "bf16") == pytest.approx(85.333, rel=1e-4)
    # same area, square is best
    assert model.tile_intensity(128, 128, 8, "fp32") > model.tile_intensity(64, 256, 8, "fp32")
    assert model.tile_intensity(128, 128, 8, "fp32") == pytest.approx(32.0)


def test_speed_of_light():
    assert model.speed_of_light(1320) / 1e12 == pytest.approx(713.6, abs=0.1)
    assert model.speed_of_light(1980) / 1e12 == pytest.approx(1070.5, abs=0.1)
    assert model.speed_of_light(1545) / 1e12 == pytest.approx(835.3, abs=0.1)
    assert model.speed_of_light(1980, 132, 256) / 1e12 == pytest.approx(66.9, abs=0.05)  # fp32 FFMA
    assert model.H200.peak_flops("bf16") / 1e12 == pytest.approx(713.6, abs=0.1)


def test_roofline():
    peak, bw = 713.6e12, 4.3e12
    assert model.ridge_point(peak, bw) == pytest.approx(165.95, rel=1e-3)
    assert model.roofline(10, peak, bw) == pytest.approx(43e12)
    assert model.roofline(1000, peak, bw) == peak


def test_wave_quantization_4096_cube_128x256():
    w = model.wave_quantization(4096, 4096, 128, 256, sm_count=132)
    assert (w.tiles_m, w.tiles_n, w.tiles) == (32, 16, 512)
    assert w.waves == pytest.approx(3.88, abs=0.005)
    assert w.full_waves == 3 and w.wave_count == 4
    assert w.last_wave_tiles == 116
    assert w.last_wave_utilization == pytest.approx(0.88, abs=0.005)
    assert w.efficiency == pytest.approx(3.879 / 4, abs=1e-3)


def test_wave_quantization_edges():
    w = model.wave_quantization(128 * 132, 256, 128, 256, sm_count=132)
    assert w.waves == 1.0 and w.last_wave_utilization == 1.0 and w.efficiency == 1.0
    w = model.wave_quantization(4100, 4100, 128, 128, sm_count=132, blocks_per_sm=2)
    assert w.tiles == 33 * 33 and w.slots == 264
    assert model.tile_quantization(4100, 4100, 128, 128) == pytest.approx(4100**2 / (33 * 128) ** 2)


def test_occupancy_hand_cases():
    # 256 threads, 64 regs, no smem: 64*32 = 2048 regs per warp; 65536 / 2048 = 32 warps = 4 blocks;
    # threads allow 8 -> registers limit to 4 blocks
    o = model.occupancy(256, 64, 0)
    assert (o.blocks_per_sm, o.limiter, o.by_threads, o.by_registers) == (4, "registers", 8, 4)
    assert o.fraction == pytest.approx(0.5)
    # register rounding: 90 regs -> 2880 per warp -> 3072 (unit 256); 16384 / 3072 = 5 warps per SM
    # quarter -> 20 warps -> 5 blocks of 4 warps
    assert model.occupancy(128, 90, 0).by_registers == 5
    # warps are placed per quarter: 40 regs -> 1280 per warp -> 12 per quarter -> 48 warps -> 16 blocks of
    # 3 warps (counting the whole SM, 65536 / 1280 = 51 warps, would say 17)
    assert model.occupancy(96, 40, 0).by_registers == 16
    # shared memory: 100 KB + 1 KB reserved per block -> 2 blocks in 228 KB
    o = model.occupancy(128, 32, 100 * 1024)
    assert (o.blocks_per_sm, o.limiter) == (2, "shared memory")
    # 227 KB fits one block; 228 KB does not fit at all
    assert model.occupancy(384, 168, 227 * 1024).blocks_per_sm == 1
    assert model.occupancy(384, 168, 228 * 1024).blocks_per_sm == 0
    # 1024 threads: 2 blocks; 1025 threads: none
    assert model.occupancy(1024, 32, 0).blocks_per_sm == 2
    assert model.occupancy(1025, 32, 0).blocks_per_sm == 0
    # tiny blocks hit the 32 blocks-per-SM limit
    o = model.occupancy(32, 16, 0)
    assert (o.blocks_per_sm, o.limiter) == (32, "blocks")


def test_pipeline_one_stage_serializes_many_stages_overlap():
    one = model.pipeline_timeline(8, 1, t_load=1.0, t_compute=2.0)
    assert max(s.end for s in one) == pytest.approx(8 * 3.0)
    four = model.pipeline_timeline(8, 4, t_load=1.0, t_compute=2.0)
    assert max(s.end for s in four) == pytest.approx(1.0 + 8 * 2.0)
    assert model.pipeline_utilization(four) == pytest.approx(16 / 17)
    # memory bound: the consumers wait on every load
    slow = model.pipeline_timeline(8, 4, t_load=3.0, t_compute=1.0)
    assert max(s.end for s in slow) == pytest.approx(8 * 3.0 + 1.0)
    # a slot is reused only after its previous tile was consumed
    for s in four:
        if s.lane == "producer" and s.k >= 4:
            prev = next(c for c in four if c.lane == "consumer 0" and c.k == s.k - 4)
            assert s.start >= prev.end - 1e-12


def test_predict_compute_bound_hand_case():
    # 4096^3 bf16, 128x256x64 tiles, one 384-thread block per SM, at 1320 MHz with efficiency 1:
    # compute 137.4 GFLOP / 713.7 TFLOP/s = 192.6 us, divided by the wave efficiency 0.9697
    p = model.predict(4096, 4096, 4096, tile=(128, 256, 64), threads=384, registers=168, smem_bytes=200 * 1024,
                      dtype="bf16", clock_mhz=1320, efficiency=1.0, l2_hit=0.9)
    assert p.occupancy.blocks_per_sm == 1
    assert p.waves.tiles == 512
    assert p.bound == "compute"
    t = 2 * 4096**3 / 713.687e12 / (3.8788 / 4)
    assert p.time_s == pytest.approx(t, rel=1e-3)
    assert p.tflops == pytest.approx(713.687 * 3.8788 / 4, rel=1e-3)
    # memory: A read 16x, B read 32x, plus C: 2 B * (16M*16 + 16M*32 + 16M), 10% of the loads reach HBM
    traffic = 2 * (4096**2 * 16 + 4096**2 * 32) + 2 * 4096**2
    assert p.traffic_bytes == traffic
    assert p.hbm_bytes == pytest.approx(max(2 * 3 * 4096**2, traffic * 0.1))


def test_predict_memory_bound_decode():
    # M = 16 decode on an 8192 x 8192 weight: the weight read dominates
    p = model.predict(16, 8192, 8192, tile=(64, 128, 64), threads=128, registers=90, smem_bytes=30000,
                      dtype="bf16", efficiency=0.9, l2_hit=0.9)
    assert p.bound == "memory"
    assert p.t_memory_s == pytest.approx(model.min_bytes(16, 8192, 8192) / 4.3e12)


def test_device_profile_default_is_h200_without_gpu():
    import torch

    if torch.cuda.is_available():
        prof = model.device_profile()
        assert prof.source == "gpu" and prof.sm_count > 0
    else:
        assert model.device_profile() is model.H200
    assert model.device_profile("H200").sm_count == 132
    with pytest.raises(ValueError, match="unknown device profile"):
        model.device_profile("Z100")


H100_SXM_PEAK = 2 * 2619e6 * 5120 / 8  # HBM3: 2619 MHz memory clock, 5120-bit bus: 3.35 TB/s


def test_a_gpu_with_other_memory_has_the_hbm_rates_in_proportion():
    from gemmlab import devices

    h100 = devices.with_memory(model.H200, H100_SXM_PEAK)
    r = H100_SXM_PEAK / model.H200.hbm_peak_bytes_per_s
    assert 0.67 < r < 0.69 and h100.hbm_peak_bytes_per_s == H100_SXM_PEAK
    for name in devices.HBM_RATES:
        assert getattr(h100, name) == pytest.approx(getattr(model.H200, name) * r), name
    assert h100.hbm_bytes_per_s == pytest.approx(2.93e12, rel=0.01)
    # Nothing else moves: the SM count, the L2 rates, the fitted k-step factors.
    scaled = devices.HBM_RATES + ("hbm_peak_bytes_per_s",)
    rest = [f.name for f in dataclasses.fields(model.H200) if f.name not in scaled]
    assert rest and all(getattr(h100, f) == getattr(model.H200, f) for f in rest)
    # An unknown peak, or the H200's own, leaves the profile as it is.
    for peak in (None, 0.0, model.H200.hbm_peak_bytes_per_s):
        assert devices.with_memory(model.H200, peak) is model.H200
    # A memory-bound prediction follows the rate.
    t200 = model.predict(16, 8192, 8192, tile=(64, 128, 64), threads=128, registers=90, smem_bytes=30000,
                         dtype="bf16", efficiency=0.9, l2_hit=0.9).t_memory_s
    t100 = model.predict(16, 8192, 8192, tile=(64, 128, 64), threads=128, registers=90, smem_bytes=30000,
                         dtype="bf16", efficiency=0.9, l2_hit=0.9, profile=h100).t_memory_s
    assert t100 == pytest.approx(t200 / r)


def test_the_visible_gpus_profile_reads_its_memory_peak(monkeypatch):
    """device_profile(): the visible GPU's SM count, L2 and memory peak (its HBM rates in proportion); a GPU
    whose driver does not report the memory keeps the H200's rates."""
    import types

    import torch

    from gemmlab import devices, gpu

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    info = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", sm_count=132, l2_bytes=50 * 2**20,
                                 hbm_peak_bytes_per_s=H100_SXM_PEAK)
    monkeypatch.setattr(gpu, "gpu_info", lambda *a: info)
    prof = devices.device_profile()
    assert prof.name == info.name and prof.source == "gpu" and prof.sm_count == 132
    assert prof.hbm_bytes_per_s == pytest.approx(model.H200.hbm_bytes_per_s * 0.6819, rel=1e-3)
    info.hbm_peak_bytes_per_s = None
    assert devices.device_profile().hbm_bytes_per_s == model.H200.hbm_bytes_per_s
    # The engine's planner keeps the H200's rates whatever the GPU (its picks are fitted to them).
    from gemmlab import engine

    assert engine.plan_profile(132).hbm_read_bytes_per_s == model.H200.hbm_read_bytes_per_s


def test_a_gpu_of_fewer_sms_holds_fewer_clusters(monkeypatch):
    """device_profile() and the planners' profile of a named GPU (planner._profile: engine2, fp8, grouped)
    for an H100 PCIe (114 SMs): the H200's cluster table in proportion, never past sm_count // size."""
    import types

    import torch

    from gemmlab import devices, gpu, planner

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    info = types.SimpleNamespace(name="NVIDIA H100 PCIe", sm_count=114, l2_bytes=50 * 2**20,
                                 hbm_peak_bytes_per_s=2.0e12)
    monkeypatch.setattr(gpu, "gpu_info", lambda *a: info)
    for prof in (devices.device_profile(), planner._profile(None, 0)):
        assert prof.sm_count == 114 and prof.name == info.name
        h200 = dict(model.H200.cluster_capacity)
        for size, n in prof.cluster_capacity:
            assert n == min(114 // size, h200[size] * 114 // 132)
        assert prof.clusters(2) == 57 and prof.clusters(4) == 25
    assert devices.with_sm_count(model.H200, 132) is model.H200
    assert dict(devices.with_sm_count(model.H200, 132, {2: 60, 4: 28}).cluster_capacity) == {2: 60, 4: 28}


def test_memory_peak_from_the_driver(monkeypatch):
    """gpu.memory_peak: 2 x memory clock x bus width; None where the driver reports nothing or fails."""
    import types

    import cuda.core

    from gemmlab import gpu

    def fake(khz, bits):
        return lambda idx: types.SimpleNamespace(
            properties=types.SimpleNamespace(memory_clock_rate=khz, global_memory_bus_width=bits))

    monkeypatch.setattr(cuda.core, "Device", fake(3201000, 6144))
    assert gpu.memory_peak(0) == pytest.approx(model.H200.hbm_peak_bytes_per_s)
    monkeypatch.setattr(cuda.core, "Device", fake(2619000, 5120))
    assert gpu.memory_peak(0) == pytest.approx(H100_SXM_PEAK)
    monkeypatch.setattr(cuda.core, "Device", fake(0, 5120))
    assert gpu.memory_peak(0) is None

    def broken(idx):
        raise RuntimeError("no driver")

    monkeypatch.setattr(cuda.core, "Device", broken)
    assert gpu.memory_peak(0) is None


def test_device_constants_live_in_the_profile():
    """Issue 14: one device profile holds the device constants every model uses. No module of the package
    but gemmlab.devices defines a rate, latency or bandwidth at module level (names ending PER_S,
    LATENCY_S, _S of a cost, BYTES_PER_S), and the decode kernel's and h11's split models read theirs from
    the profile: changing the profile's value changes their times."""
    import ast
    import dataclasses
    from pathlib import Path

    from gemmlab import decode, engine

    src = Path(model.__file__).resolve().parent
    bad = []
    for path in src.rglob("*.py"):
        if path.name == "devices.py":
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for t in targets:
                name = getattr(t, "id", "")
                if name.isupper() and name.endswith(("PER_S", "LATENCY_S", "REDUCE_S", "OVERHEAD_S", "PER_SM")):
                    bad.append(f"{path.relative_to(src)}: {name}")
    assert not bad, bad

    v = decode.default_variant(decode.token_tiles(16))
    base = decode.plan_time(16, 8192, 8192, 132, 1, 1, v)[0]
    slow = dataclasses.replace(model.H200,
                               decode_split_hbm_bytes_per_s=model.H200.decode_split_hbm_bytes_per_s / 4)
    old, decode._PROF = decode._PROF, slow
    try:
        assert decode.plan_time(16, 8192, 8192, 132, 1, 1, v)[0] > 2 * base
    finally:
        decode._PROF = old
    k = engine.kstep_seconds(128, 128, 4, 0.5)
    old, engine.H200 = engine.H200, dataclasses.replace(model.H200, h11_l2_latency_s=1e-5, h11_hbm_latency_s=1e-5)
    try:
        assert engine.kstep_seconds(128, 128, 4, 0.5) > 2 * k
    finally:
        engine.H200 = old


@pytest.mark.parametrize("spec", registry.all_kernels(), ids=lambda s: s.name)
def test_predict_every_registered_step(spec):
    M = N = K = 4096
    p = model.predict_step(spec, M, N, K, profile=model.H200)
    assert p.occupancy.blocks_per_sm >= 1, p.occupancy
    assert 0 < p.tflops <= p.peak_tflops
    assert math.isfinite(p.time_s)


@pytest.mark.gpu
def test_occupancy_matches_cuda_core():
    for spec in registry.all_kernels():
        cfg = spec.default_config()
        ck = spec.compile(cfg)
        ours = model.occupancy(spec.threads(cfg), ck.resources.registers,
                               spec.smem_bytes(cfg) + ck.resources.static_shared, model.device_profile())
        theirs = model.gpu_occupancy(ck, spec.threads(cfg), spec.smem_bytes(cfg))
        if theirs is None:
            pytest.skip("cuda-core cannot load this cubin here")
        assert ours.blocks_per_sm == theirs, spec.name


def test_ffma_issue_share_and_step_efficiency():
    from gemmlab import sass

    summ = sass.SassSummary(instructions=[], loops=[sass.Loop(0, 10, 10, {"ffma": 2, "other": 8}),
                                                    sass.Loop(20, 100, 80, {"ffma": 64, "other": 16})])
    assert model.ffma_issue_share(summ) == pytest.approx(0.8)
    assert model.ffma_issue_share(sass.SassSummary(instructions=[])) is None
    fp32 = registry.all_kernels("sgemm")[0]
    assert model.step_efficiency(fp32, summ) == (0.8, "FFMA share of the main loop's instructions (80%)")
    assert model.step_efficiency(fp32, None)[1] == "default"
    stated = dataclasses.replace(fp32, extra={"model_efficiency": 0.42})
    assert model.step_efficiency(stated, summ) == (0.42, "stated by the step")
    bf16 = registry.all_kernels("hopper")[0]
    assert model.step_efficiency(bf16, summ)[0] == model.H200.mma_efficiency


# The TMA -> smem -> wgmma pipeline model (predict_pipelined) -------------------------------------------

US = 1e-6
H = model.H200  # 10 TB/s L2->SMEM, 0.6 us TMA latency, 0.25 us ring handoff, eta 0.94, 200 clk, 14.5 GB/s


def test_stage_and_l2_bytes():
    assert model.stage_bytes(128, 256, 64) == (128 + 256) * 64 * 2 == 49152
    assert model.stage_bytes(128, 256, 64, cluster=2) == (128 + 128) * 64 * 2  # half of B by multicast
    # 4096^3 with 128 x 256 tiles: 512 tiles x 64 k-steps x 48 KB = 1.61 GB
    assert model.l2_smem_bytes(4096, 4096, 4096, 128, 256) == 512 * 64 * 49152 == pytest.approx(1.61e9, rel=1e-3)
    # ragged edges load whole boxes: 4100 -> 33 x 17 tiles, 65 k-steps
    assert model.l2_smem_bytes(4100, 4100, 4100, 128, 256) == 33 * 17 * 65 * 49152


def test_kstep_in_flight_ring_is_tensor_bound_with_four_stages():
    # h06-like at 1515 MHz: t = 1024 clk / 0.94 = 0.7191 us; x = 48 KB / (10 TB/s / 132) = 0.6488 us;
    # L = 0.6 + 0.25 + 0.6488 = 1.4988 us; four stages: max(L / 3, (L + t) / 4) = 0.5545 < t
    loop = model.MainLoop(stages=4, persistent=True, wgmma_in_flight=1, producer_warp=True)
    k = model.kstep_time(128, 256, 64, loop, 1515)
    assert k.t_mma == pytest.approx(1024 / 1515e6 / 0.94)
    assert k.t_transfer == pytest.approx(49152 * 132 / 10e12)
    assert k.t_load == pytest.approx(0.6 * US + 0.25 * US + 49152 * 132 / 10e12)
    assert k.t_turnaround == 0.0
    assert (k.limiter, k.period) == ("tensor cores", k.t_mma)
    # two stages: one load in flight, the k-step is a whole refill (the QSIZE = 2 collapse of h08/h09)
    two = model.kstep_time(128, 256, 64, dataclasses.replace(loop, stages=2), 1515)
    assert (two.limiter, two.period) == ("load latency", pytest.approx(1.4988 * US, rel=1e-4))
    # three stages: L / 2 = 0.749 us > t at 1980 MHz (0.550 us), < t at 1320 MHz (0.825 us)
    three = dataclasses.replace(loop, stages=3)
    assert model.kstep_time(128, 256, 64, three, 1980).limiter == "load latency"
    assert model.kstep_time(128, 256, 64, three, 1320).limiter == "tensor cores"


def test_kstep_drained_ring_pays_the_turnaround():
    # h04/h05-like: wait_group 0 + token barriers: t + g = 0.7191 + 200 clk / 1515 MHz (0.1320) us
    loop = model.MainLoop(stages=4, producer_warp=True)
    k = model.kstep_time(128, 256, 64, loop, 1515)
    assert k.t_turnaround == pytest.approx(200 / 1515e6)
    assert k.period == pytest.approx((1024 / 0.94 + 200) / 1515e6)
    assert k.limiter == "tensor cores + k-step turnaround"


def test_kstep_one_stage_latency_and_bandwidth():
    # h02-like: 128 x 128, 3 CTAs per SM, 1515 MHz. One CTA's chain: L + t + g = (0.6 + 0.43254) + 0.35953
    # + 0.13201 = 1.5241 us; the SM's shared terms: 3 t = 1.079, 3 x = 1.298 us -> latency bound
    h02 = model.MainLoop(stages=1, ctas_per_sm=3)
    k = model.kstep_time(128, 128, 64, h02, 1515)
    x, t, g = 32768 * 132 / 10e12, 512 / 1515e6 / 0.94, 200 / 1515e6
    assert k.period == pytest.approx(0.6 * US + x + t + g) == pytest.approx(1.5241 * US, rel=1e-4)
    assert k.limiter == "load latency"
    # h01-like: 64 x 128, 5 CTAs: 5 x 24 KB per k-step at 75.8 GB/s per SM = 1.622 us > chain 1.236 us
    h01 = model.MainLoop(stages=1, ctas_per_sm=5)
    k = model.kstep_time(64, 128, 64, h01, 1515)
    assert (k.limiter, k.period) == ("L2->SMEM bandwidth", pytest.approx(5 * 24576 * 132 / 10e12))
    # the same SM alone on the GPU (68 CTAs, one per SM) gets 1/68 of the bandwidth: latency bound again
    k = model.kstep_time(64, 128, 64, h01, 1515, active_sms=68, ctas=1)
    assert (k.limiter, k.period) == ("load latency", pytest.approx(0.6 * US + 24576 * 68 / 10e12 + 256 / 1515e6 / 0.94
                                                                  + 200 / 1515e6))


def test_epilogue_and_pipeline_time_persistent():
    assert model.epilogue_time(128, 256) == pytest.approx(65536 / 14.5e9) == pytest.approx(4.52 * US, rel=1e-3)
    # h06-like, 4096^3 at 1515 MHz: 512 tiles on 132 persistent CTAs -> 3 full rounds + 116 tiles; each
    # round 64 k-steps of t and one epilogue; one fill (L) for the whole run
    loop = model.MainLoop(stages=4, persistent=True, wgmma_in_flight=1, producer_warp=True)
    pt = model.pipeline_time(4096, 4096, 4096, 128, 256, 64, loop, 1515)
    t, E, L = 1024 / 1515e6 / 0.94, 65536 / 14.5e9, 0.85 * US + 49152 * 132 / 10e12
    assert pt.rounds == 4
    assert pt.time_s == pytest.approx(L + 4 * (64 * t + E))
    assert pt.time_s == pytest.approx(203.66 * US, rel=1e-4)
    # clusters of 2: 66 slots walk 16 x 16 cluster tiles -> 3 full rounds + 58; same time on the SM side
    pt2 = model.pipeline_time(4096, 4096, 4096, 128, 256, 64, dataclasses.replace(loop, cluster=2), 1515)
    assert pt2.rounds == 4 and pt2.kstep.t_transfer == pytest.approx(32768 * 132 / 10e12)


def test_pipeline_time_rounds_of_co_resident_ctas():
    # h01-like, 4096^3 at 1515 MHz: 2048 tiles of 64 x 128 on 132 x 5 slots -> 3 full rounds (5 CTAs per
    # SM, bandwidth bound at 1.622 us per k-step) + 68 CTAs (one per SM: latency bound, 1.079 us)
    loop = model.MainLoop(stages=1, ctas_per_sm=5)
    pt = model.pipeline_time(4096, 4096, 4096, 64, 128, 64, loop, 1515)
    E = 16384 / 14.5e9
    full = 5 * 24576 * 132 / 10e12
    last = 0.6 * US + 24576 * 68 / 10e12 + 256 / 1515e6 / 0.94 + 200 / 1515e6
    assert pt.rounds == 4 and pt.t_fill_s == 0.0
    assert pt.time_s == pytest.approx(3 * (64 * full + E) + 64 * last + E)


def test_main_loop_facts_from_the_registry():
    def loop(name, cfg=None, regs=None):
        spec = registry.get(name)
        c = spec.resolve(cfg)
        ck = spec.compile(c)
        return model.main_loop(spec, c, regs or ck.resources.registers, spec.smem_bytes(c) + ck.resources.static_shared)

    assert loop("h01", regs=90) == model.MainLoop(stages=1, ctas_per_sm=5)  # registers limit it to 5 CTAs
    assert loop("h03") == model.MainLoop(stages=4, ctas_per_sm=1, producer_warp=True)
    assert loop("h05").persistent and loop("h05").wgmma_in_flight == 0
    assert loop("h06") == model.MainLoop(stages=4, persistent=True, wgmma_in_flight=1, producer_warp=True)
    assert loop("h07").cluster == 2 and loop("h08").stages == 3
    assert loop("h10").cluster == 1 and loop("h10", {"CLUSTER": 2}).cluster == 2


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _hopper_records():
    recs = []
    for name in ("hopper_ladder.jsonl", "hopper_sweep.jsonl"):
        recs += [json.loads(line) for line in (RESULTS / name).read_text().splitlines() if line.strip()]
    return [r for r in recs if r["kernel"].startswith("hopper.")]


def _config_today(spec, config: dict) -> dict:
    """A record's config as the step takes it now. h11's records from before its plan (BN, SPLITS) became
    its config name a QSIZE that the plan now derives: dropped, after checking it is the derived one."""
    if "QSIZE" in config and "QSIZE" not in spec.param_names():
        today = spec.resolve({k: v for k, v in config.items() if k != "QSIZE"})
        assert spec.extra["stages"](today) == config["QSIZE"], (spec.name, config)
        return today
    return config


# The one known model miss, with its reason: h03 has a single consumer warpgroup, so nothing overlaps its
# k-step turnaround, which the model prices at the 200 clocks read off the two-consumer steps h05/h06
# (docs/worklog.md, "Model vs measurement": ~270 would fit h03). It read 1.078-1.082 in the closing run
# and 1.100 at 8192^3 in the run of sha 5e60ab7.
HOPPER_BAND = {"h03_warp_specialized": 1.12}


def test_hopper_steps_within_10_percent_of_the_h200_records():
    """Every Hopper record of the closing H200 run (ladder at 4096^3 and 8192^3, h10 sweep 2048..16384)
    against ``predict_step`` at the record's own SM clock: measured / predicted time in [0.9, 1.1]
    (h03: [0.9, 1.12], see HOPPER_BAND).

    This is a regression test of the model against committed data, and a fair one because nothing in
    the model is fitted per step: the steps differ only by structural facts (tile, stages, CTAs per SM
    from ptxas and occupancy, persistence, wgmma groups in flight, cluster size), and the six pipeline
    constants are device constants of the H200 profile. Those constants were read off a few of these
    records (h01, h02, h05/h06, the two ends of the h10 sweep; the arithmetic is in ``DeviceProfile``'s
    docstring), so for those records the check is one of consistency; every other row is a prediction.
    Run with ``-s`` to see the table."""
    rows, bad = [], []
    for r in _hopper_records():
        spec = registry.get(r["kernel"])
        prof = dataclasses.replace(model.H200, sm_count=int(r.get("sm_count") or 132))
        p = model.predict_step(spec, r["M"], r["N"], r["K"], _config_today(spec, r["config"]), profile=prof,
                               clock_mhz=r["sm_clock_mhz"])
        ratio = r["time_ms"] / (p.time_s * 1e3)
        rows.append(f"{spec.short:24s} {r['M']:>6d}^3 {r['sm_clock_mhz']:>6.0f} MHz  predicted {p.time_s * 1e3:8.4f} ms"
                    f"  measured {r['time_ms']:8.4f} ms  ratio {ratio:5.3f}  {p.limiter}")
        if not 0.9 <= ratio <= HOPPER_BAND.get(spec.short, 1.1):
            bad.append(rows[-1])
    table = "\n".join(["measured / predicted time, Hopper records of the closing run", *rows])
    print("\n" + table)
    assert len(rows) >= 29
    assert not bad, "outside the band:\n" + "\n".join(bad) + "\n\n" + table


# The CUDA-core (fp32) k-tile model (predict_cuda_core) -------------------------------------------------

def test_cuda_core_period_hand_cases():
    # k05-like: 8 warps, 645 instructions (48 memory) per 8-deep tile, barriers, one block per SM, 1980 MHz:
    # R = 8 x 645 / 4 / 0.75 = 1720 clk; alone on the SM the tile latency adds 0.75 us
    mix = model.LoopMix(instructions=645, ffma=512, memory=48, global_loads=8, l1_wavefronts=8, barrier=True)
    per = model.cuda_core_period(mix, warps=8, blocks=1, clock_mhz=1980)
    assert per.t_block == pytest.approx(1720 / 1980e6)
    assert (per.limiter, per.period) == ("tile latency", pytest.approx(1720 / 1980e6 + 0.75 * US))
    # two blocks: max(2 R, R + L) = 2 R; with prefetch a lone block waits max(R, L)
    assert model.cuda_core_period(mix, 8, 2, 1980).period == pytest.approx(max(2 * 1720 / 1980e6, 1720 / 1980e6 + 0.75 * US))
    assert model.cuda_core_period(mix, 8, 1, 1980, prefetch=True).period == pytest.approx(1720 / 1980e6)  # R > L
    # k01-like: no barrier, 32 LDG.32 touching 16.5 lines each on average: L1-bound, 32 warps x 528 clk
    naive = model.LoopMix(instructions=88, ffma=16, memory=32, global_loads=32, l1_wavefronts=528, barrier=False)
    per = model.cuda_core_period(naive, warps=32, blocks=2, clock_mhz=1980)
    assert (per.limiter, per.period) == ("L1 wavefronts", pytest.approx(2 * 32 * 528 / 1980e6))


def test_loop_mix_fast_path_from_sass():
    # k10 at its default: the interior iteration (vector loads, tiles staged) skips the scalar fallback
    spec = registry.get("sgemm.k10_double_buffered")
    from gemmlab.sass import kernel_summary

    summ = kernel_summary(spec.compile(spec.resolve(None)))
    mix = model.loop_mix(summ)
    assert mix.ffma == 2048 and mix.barrier
    assert 2048 < mix.instructions < max(lp.instructions for lp in summ.loops)
    assert mix.global_loads == 8 and mix.l1_wavefronts == 32  # 8 LDG.128: 4 lines each


def _sgemm_records():
    return [json.loads(line) for line in (RESULTS / "sgemm_ladder.jsonl").read_text().splitlines() if line.strip()]


def test_sgemm_steps_within_25_percent_of_the_h200_records():
    """Every fp32 record of the closing H200 run (k01-k10 at 4096^3, k04-k10 at 8192^3, 1980 MHz) against
    ``predict_step``: measured / predicted time in [0.9, 1.25].

    A regression test against committed data, legitimate because the model's constants are device-level
    (``issue_efficiency`` 0.75, ``tile_latency_s`` 0.75 us, one L1 line and one LSU dispatch per clock
    per SM; where they come from is in ``DeviceProfile``'s docstring: the first two were read off k10 and
    k05, so those rows check consistency). Per step the model uses only its SASS main loop (fast path:
    instructions, memory instructions, load widths, barriers), occupancy, tile and two structural facts
    from the registry (k01's lines per load, k10's prefetch). k06 (1.24-1.25) is the worst: its
    bank-conflicted transposing store and 4-wavefront B reads are not in the model (see docs/worklog.md)."""
    rows, bad = [], []
    for r in _sgemm_records():
        spec = registry.get(r["kernel"])
        p = model.predict_step(spec, r["M"], r["N"], r["K"], r["config"], profile=model.H200,
                               clock_mhz=r["sm_clock_mhz"])
        ratio = r["time_ms"] / (p.time_s * 1e3)
        rows.append(f"{spec.short:22s} {r['M']:>5d}^3 predicted {p.time_s * 1e3:9.3f} ms measured {r['time_ms']:9.3f} ms"
                    f" ratio {ratio:5.3f}  {p.limiter}")
        if not 0.9 <= ratio <= 1.25:
            bad.append(rows[-1])
    table = "\n".join(["measured / predicted time, sgemm records", *rows])
    print("\n" + table)
    assert len(rows) >= 17
    assert not bad, "outside [0.9, 1.25]:\n" + "\n".join(bad) + "\n\n" + table
