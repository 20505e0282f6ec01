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
    from gemmlab.ladders.sgemm import K10_LARGE

    spec = registry.get("k10")
    big = spec.config_for(4096, 4096, 4096, 132, tuned=False)
    assert big == K10_LARGE and spec.check_config(big) is None
    assert spec.config_for(1024, 1024, 1024, 132, tuned=False) == spec.default_config()  # 32 tiles of 256 x 128
    assert spec.config_for(4096, 4096, 4096, 1000, tuned=False) == spec.default_config()  # a (made-up) wide GPU
