"""Every registered kernel compiles for its target without a GPU and its SASS meets its expectations."""

import pytest

from gemmlab import registry, sass
from gemmlab.errors import UnsupportedProblem

KERNELS = registry.all_kernels()


def test_both_ladders_registered():
    assert {k.ladder for k in KERNELS} == {"sgemm", "hopper"}
    for lad in ("sgemm", "hopper"):
        steps = [k.step for k in registry.all_kernels(lad)]
        assert steps == sorted(set(steps)), f"{lad}: steps must be unique"


@pytest.mark.parametrize("spec", KERNELS, ids=lambda s: s.name)
def test_kernel_compiles_and_meets_sass_expectations(spec):
    ck = spec.compile()
    assert ck.cubin[:4] == b"\x7fELF"
    assert ck.arch == spec.arch
    summary = sass.kernel_summary(ck)
    assert summary.instructions, "empty disassembly"
    assert sass.check(spec.sass_expect(), summary, ck.resources) == []
    assert "serialized" not in ck.log, f"ptxas serialized wgmma:\n{ck.log}"


@pytest.mark.parametrize("spec", KERNELS, ids=lambda s: s.name)
def test_spec_facts_are_complete(spec):
    assert spec.technique and spec.constraints and spec.source.endswith(".cu")
    cfg = spec.default_config()
    assert spec.resolve(cfg) == cfg
    assert spec.threads(cfg) > 0 and spec.smem_bytes(cfg) >= 0
    bm, bn, bk = spec.tile(cfg)
    assert bm > 0 and bn > 0 and bk > 0
    assert spec.configs(), "no valid config"
    assert spec.smem_bytes(cfg) <= 227 * 1024


def test_lookup_by_short_names():
    assert registry.get("k01").name == "sgemm.k01_naive"
    assert registry.get("h01_tma_wgmma").name == "hopper.h01_tma_wgmma"
    with pytest.raises(KeyError, match="no kernel named"):
        registry.get("k99_nope")


def test_bad_config_rejected():
    spec = registry.get("k01")
    with pytest.raises(UnsupportedProblem, match="not in"):
        spec.resolve({"BLOCK": 7})
    with pytest.raises(UnsupportedProblem, match="unknown parameter"):
        spec.resolve({"NOPE": 1})


def test_sass_checker_catches_failures():
    ck = registry.get("k01").compile()
    summ = sass.kernel_summary(ck)
    fails = sass.check(sass.SassExpect(contains=(r"^HGMMA",), absent=(r"^FFMA",), min_loop_ffma=10_000), summ,
                       ck.resources)
    assert len(fails) == 3


def test_configs_pin_parameters_that_do_not_matter():
    spec = registry.get("h09")
    cfgs = spec.configs()
    assert len({tuple(c.items()) for c in cfgs}) == len(cfgs)
    assert all(c["GROUP_M"] == 8 for c in cfgs if c["ORDER"] != 1)  # GROUP_M only shapes the grouped order
    assert {c["GROUP_M"] for c in cfgs if c["ORDER"] == 1} == {8, 4, 16}


def test_k10_takes_the_tuned_tile_only_when_it_fills_the_gpu_twice():
    from gemmlab.fp32 import K10_LARGE

    spec = registry.get("k10")
    big = spec.config_for(4096, 4096, 4096, 132, tuned=False)
    assert big == K10_LARGE and spec.check_config(big) is None
    assert spec.config_for(1024, 1024, 1024, 132, tuned=False) == spec.default_config()  # 32 tiles of 256 x 128
    assert spec.config_for(4096, 4096, 4096, 1000, tuned=False) == spec.default_config()  # a (made-up) wide GPU


def test_h11_configs_are_the_engines_plans():
    """h11's space is every (BN, SPLITS) the engine runs; each config names the instantiation the engine
    launches for the ladder's plain TN bf16 call (QSIZE and the split/overlap flags derived as it does)."""
    from gemmlab import autotune, engine

    spec = registry.get("h11")
    cfgs = spec.configs()
    assert sorted((c["BN"], c["SPLITS"]) for c in cfgs) == sorted(
        (bn, s) for bn in engine.SPLIT_WIDTHS for s in range(1, engine.MAX_CLUSTER + 1))
    assert len({autotune.variant_key(spec, c) for c in cfgs}) == len(cfgs)
    for c in cfgs:
        split = c["SPLITS"] > 1
        q = engine._qsize(c["BN"], 2, split=split)
        assert spec.name_expression(c) == (f"hopper_h11<__nv_bfloat16, __nv_bfloat16, float, {c['BN']}, {q}, "
                                           f"0, 0, 0, {int(split)}, {int(not split)}>")
        assert spec.smem_bytes(c) == engine.smem_bytes(c["BN"], q, 2, split=split) <= engine.SMEM_LIMIT
        assert spec.tile(c) == (engine.BM, c["BN"], engine.BK) and spec.threads(c) == 384
        assert (r"^UTMASTG" in spec.sass_expect(c).contains) != split  # split-K stores without TMA


def test_h11_split_instantiation_meets_its_own_sass_expectations():
    cfg = {"BN": 256, "SPLITS": 8}
    spec = registry.get("h11")
    ck = spec.compile(cfg)
    assert sass.check(spec.sass_expect(cfg), sass.kernel_summary(ck), ck.resources) == []
    assert sass.check(spec.sass_expect(), sass.kernel_summary(ck), ck.resources) != []  # not the default's


@pytest.mark.parametrize("shape, cfg, message", [
    ((200, 1024, 1024), {"BN": 128, "SPLITS": 8}, "fewer than 4 k-steps"),
    ((128, 1024, 1600), {"BN": 64, "SPLITS": 6}, "a split would be empty"),
    ((1, 2**23, 64), {"BN": 128, "SPLITS": 1}, "out of range"),
])
def test_h11_rejects_plans_the_engine_would_not_run(shape, cfg, message):
    spec = registry.get("h11")
    assert message in spec.why_unsupported(*shape, cfg)


def test_h11_heuristic_is_the_engines_plan():
    from gemmlab import engine

    spec = registry.get("h11")
    for shape in ((200, 1024, 4096), (4096, 4096, 4096), (16, 28672, 8192), (300, 700, 9000)):
        bn, splits = engine.choose_plan(*shape, 132)
        assert spec.config_for(*shape, 132, tuned=False) == {"BN": bn, "SPLITS": splits}
        assert spec.why_unsupported(*shape, {"BN": bn, "SPLITS": splits}) is None
    with pytest.raises(UnsupportedProblem, match="not in"):
        spec.resolve({"BN": 96})
    with pytest.raises(UnsupportedProblem, match="unknown parameter"):
        spec.resolve({"QSIZE": 4})  # derived from the plan, not chosen


def test_a_ladder_must_state_the_dtype_its_steps_check():
    """A step checks its operands against ``kernelspec.LADDER_DTYPES`` (the runtime's fp32 route runs k10
    without the registry), so a ladder registered with another dtype is refused."""
    import dataclasses

    from gemmlab.kernelspec import LADDER_DTYPES

    lad = registry.ladders()["sgemm"]
    assert lad.dtype == LADDER_DTYPES["sgemm"] and all(k.dtype == LADDER_DTYPES[k.ladder] for k in KERNELS)
    with pytest.raises(ValueError, match="must be kernelspec.LADDER_DTYPES"):
        registry.register_ladder(dataclasses.replace(lad, dtype="bf16"))
    assert registry.ladders()["sgemm"] is lad
