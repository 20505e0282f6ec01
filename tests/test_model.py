"""The analytic models against hand-computed cases (pure functions: no GPU needed)."""

import math

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
    import dataclasses

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
    assert model.step_efficiency(bf16, summ) == (model.DEFAULT_EFFICIENCY, "default")
