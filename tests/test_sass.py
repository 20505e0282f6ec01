"""gemmlab.sass: the disassembly cache next to the cubins, and the SASS features the ladder table shows."""

import pytest

from gemmlab import registry, sass


@pytest.fixture
def counted(monkeypatch, tmp_path):
    """nvdisasm runs counted, a fresh cache folder and an empty in-process memo."""
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(sass, "_MEMO", {})
    calls = []
    real = sass._run_nvdisasm

    def run(exe, cubin):
        calls.append(len(cubin))
        return real(exe, cubin)

    monkeypatch.setattr(sass, "_run_nvdisasm", run)
    return calls


def test_an_unchanged_cubin_is_disassembled_once(counted, tmp_path, monkeypatch):
    ck = registry.get("k02").compile()
    first = sass.disassemble(ck.cubin, ck.mangled_name)
    assert sass.disassemble(ck.cubin, ck.mangled_name) == first and len(counted) == 1  # the memo
    monkeypatch.setattr(sass, "_MEMO", {})  # a new process: the file next to the cubins
    assert sass.disassemble(ck.cubin, ck.mangled_name) == first and len(counted) == 1
    assert len(list((tmp_path / "cache" / "sass").glob("*.sass"))) == 1
    other = registry.get("k03").compile()
    sass.disassemble(other.cubin)
    assert len(counted) == 2


def test_an_unwritable_cache_folder_only_costs_the_cache(counted, tmp_path, monkeypatch):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    monkeypatch.setenv("GEMMLAB_CACHE_DIR", str(blocker))
    ck = registry.get("k01").compile(use_disk_cache=False)
    text = sass.disassemble(ck.cubin, ck.mangled_name)
    assert "FFMA" in text and len(counted) == 1


def test_the_memo_is_bounded(counted, monkeypatch):
    monkeypatch.setattr(sass, "_MEMO_SIZE", 2)
    for name in ("k01", "k02", "k03"):
        sass.disassemble(registry.get(name).compile().cubin)
    assert len(sass._MEMO) == 2


def test_features_of_two_steps():
    def feats(name):
        return sass.features(sass.kernel_summary(registry.get(name).compile()))

    k06, h07 = feats("k06"), feats("h07")
    assert {"LDG.128", "STG.128", "LDS.128", "STS.128", "FFMA"} <= set(k06) and "HGMMA" not in " ".join(k06)
    assert {"TMA load", "TMA multicast", "mbarrier", "cluster barrier", "setmaxnreg"} <= set(h07)
    assert "HGMMA 64x256x16" in h07 and "LDL/STL" not in h07


# An outer loop (a persistent kernel's units) around an inner k-loop that issues the wgmmas: the claim looks
# at the inner one only, so the outer loop's R2UR (per unit) do not count against it.
NESTED = """
        /*0000*/                   MOV R1, RZ ;
.L_x_0:
        /*0010*/                   R2UR UR4, R1 ;
.L_x_1:
        /*0020*/                   %s UR8, R2 ;
        /*0030*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8], R24 ;
        /*0040*/                   ISETP.NE.AND P0, PT, R3, RZ, PT ;
        /*0050*/              @P0  BRA `(.L_x_1) ;
        /*0060*/                   ISETP.NE.AND P1, PT, R4, RZ, PT ;
        /*0070*/              @P1  BRA `(.L_x_0) ;
        /*0080*/                   EXIT ;
"""


def test_the_wgmma_loop_claim_looks_at_the_innermost_wgmma_loop():
    expect = sass.SassExpect(wgmma_loop_absent=(r"^R2UR",))
    uniform = sass.summarize(sass.parse(NESTED % "MOV"))
    moved = sass.summarize(sass.parse(NESTED % "R2UR"))
    assert len(uniform.loops) == 2 and [lp.instructions for lp in sass.wgmma_loops(uniform)] == [4]
    assert sass.check(expect, uniform) == []
    fails = sass.check(expect, moved)
    assert len(fails) == 1 and "1 instruction(s) matching '^R2UR' in the wgmma k-loop at 0x20" in fails[0]
    assert "no ^R2UR in the wgmma k-loop" in expect.describe()
