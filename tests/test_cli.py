"""The gemmlab command: every subcommand's help, the CPU paths end to end, and the bench paths with the GPU
faked. Errors at the boundary and the output forms are in tests/test_cli_errors.py."""

import argparse
import json

import pytest
import torch

from gemmlab import cli, log, matmul_suites, registry, suites
from gemmlab.cli import parser
from gemmlab.errors import UnsupportedProblem
from gemmlab.reports import records as rec_reports

_REAL_ADD_MODEL = rec_reports.add_model

SUBCOMMANDS = parser.COMMANDS


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_top_level_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for sub in SUBCOMMANDS:
        assert sub in text
    assert "examples:" in text


@pytest.mark.parametrize("sub", SUBCOMMANDS)
def test_subcommand_help(capsys, sub):
    with pytest.raises(SystemExit) as e:
        cli.main([sub, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith(f"usage: gemmlab {sub}")
    assert len(text) > 300


def test_parse_helpers():
    assert parser.parse_shape("4096") == (4096, 4096, 4096)
    assert parser.parse_shape("1,2,3") == parser.parse_shape("1x2x3") == (1, 2, 3)
    for bad in ("1,2", "0", "131073,1,1", "a,b,c"):
        with pytest.raises(argparse.ArgumentTypeError):
            parser.parse_shape(bad)
    assert parser.parse_config(["BN=128", "QSIZE=3,BM=64"]) == {"BN": 128, "QSIZE": 3, "BM": 64}
    assert parser.parse_config(None) is None
    with pytest.raises(parser.UsageError):
        parser.parse_config(["BN"])
    with pytest.raises(parser.UsageError):
        parser.parse_config(["BN=x"])
    assert parser.parse_clock("1320") == 1320.0
    for bad in ("0", "-1", "nan", "inf", "99", "3001", "fast"):
        with pytest.raises(argparse.ArgumentTypeError):
            parser.parse_clock(bad)


def test_parse_bench_helpers():
    assert parser.parse_sizes("2048,4096") == [(2048,) * 3, (4096,) * 3]
    assert parser.parse_shapes("1,2,3;4x5x6;") == [(1, 2, 3), (4, 5, 6)]
    assert parser.parse_configs("WM=32,WN=64;BK=8") == [{"WM": 32, "WN": 64}, {"BK": 8}]
    for fn, text in ((parser.parse_sizes, "0"), (parser.parse_sizes, "a"), (parser.parse_shapes, ";"),
                     (parser.parse_configs, "BN=x")):
        with pytest.raises(argparse.ArgumentTypeError):
            fn(text)


def test_parser_lists_match_their_owners():
    """The parser keeps the figure and suite names itself (so --help imports neither matplotlib nor the
    registry); they must be the owners' lists."""
    from gemmlab import figures

    assert parser.FIGURE_NAMES == tuple(figures.FIGURES)
    assert parser.MATMUL_SUITES == tuple(matmul_suites.SUITES)
    assert sorted(parser.LADDERS) == sorted(registry.ladders())


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_bench_without_gpu_says_so(capsys):
    rc, out, err = run(capsys, "bench", "--suite", "square")
    assert rc == cli.EXIT_NO_GPU == 3
    assert "needs an NVIDIA GPU" in err and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_ladder_static_view(capsys):
    rc, out, _ = run(capsys, "ladder", "--ladder", "sgemm")
    assert rc == 0
    assert "k01" in out and "model" in out
    assert "No GPU visible" in " ".join(out.split())
    # piped (capsys is not a terminal): every column, nothing cut at 80 columns
    assert "SASS" in out and "spills" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) > 120
    (k06,) = [line for line in out.splitlines() if "k06_vectorized" in line]
    assert "LDG.128" in k06 and "STS.128" in k06  # what the step introduces over k05


def test_default_command_is_ladder(monkeypatch):
    from gemmlab.cli import ladder

    seen = []
    monkeypatch.setattr(ladder, "run", lambda args: seen.append(args.ladder) or 0)
    assert cli.main([]) == 0
    assert cli.main(["--ladder", "sgemm"]) == 0
    try:
        assert cli.main(["-v", "--ladder", "hopper"]) == 0
    finally:
        log.reset()  # -v attached a handler to the gemmlab logger
    assert seen == [None, "sgemm", "hopper"]


def test_inspect_step_and_diff(capsys):
    rc, out, _ = run(capsys, "inspect", "k01")
    assert rc == 0
    assert "instruction mix" in out and "registers / thread" in out and "ffma" in out
    rc, out, _ = run(capsys, "inspect", "k01", "--diff", "h01")
    assert rc == 0 and "hgmma" in out
    rc, _, err = run(capsys, "inspect", "k99_nope")
    assert rc == 2 and "no kernel named" in err


def test_inspect_file_with_sass_and_ptx(capsys, tmp_path):
    f = tmp_path / "scale.cu"
    f.write_text("template <int S> __global__ void scale(const float4* __restrict__ a, float4* b) {\n"
                 "  float4 v = a[threadIdx.x]; v.x *= S; v.y *= S; v.z *= S; v.w *= S; b[threadIdx.x] = v; }\n")
    rc, out, _ = run(capsys, "inspect", "--file", str(f), "--expr", "scale<3>", "--arch", "sm_90", "--sass", "--ptx")
    assert rc == 0
    assert "global_load.128" in out  # the annotated listing
    assert "ld.global.nc.v4.f32" in out  # the PTX
    rc, _, err = run(capsys, "inspect", "--file", str(f))
    assert rc == 2 and "scale is a template" in err and "--expr" in err


def test_model_hand_case(capsys):
    rc, out, _ = run(capsys, "model", "--shape", "4096,4096,4096", "--kernel", "h04", "--clock", "1320",
                     "--profile", "H200")
    assert rc == 0
    flat = " ".join(out.split())
    assert "713.7 TFLOP/s" in flat
    assert "512 tiles" in flat and "3.88 waves" in flat and "88% full" in flat


def test_model_every_step(capsys):
    rc, out, _ = run(capsys, "model", "--shape", "1024", "--profile", "H200")
    assert rc == 0
    assert "h01" in out and "k01" in out
    # and what gemmlab.matmul runs there (gemmlab.plan's route)
    flat = " ".join(out.split())
    assert "gemmlab.matmul runs: Route(1024x1024x1024:" in flat and "engine_gemm" in flat


def test_model_grouped_and_fp8_show_what_the_calls_run(capsys):
    """--groups: a grouped GEMM on the roofline and grouped_mm's plan with its options (the pick marked);
    --dtype fp8: scaled_mm's per-tensor and block-scaled plans."""
    from gemmlab import grouped, planner

    rc, out, _ = run(capsys, "model", "--shape", "4096,4096,14336", "--groups", "8", "--profile", "H200")
    flat = " ".join(out.split())
    pick = grouped.plan("contiguous", 8, 4096, 4096, 14336)
    assert rc == 0 and "8 experts, 4096 rows" in flat and "gemmlab.grouped_mm" in flat
    assert f"* {pick.bm}x{pick.bn}" in flat and "stream_k" in flat and repr(pick) in flat
    rc, out, _ = run(capsys, "model", "--shape", "4096,28672,4096", "--groups", "8", "--json")
    d = json.loads(out)
    assert rc == 0 and d["plan"]["kernel"] == grouped.plan("contiguous", 8, 4096, 28672, 4096).compiled_name
    rc, out, _ = run(capsys, "model", "--shape", "128,2816,2048", "--groups", "64", "--layout", "masked", "--dtype",
                     "fp8", "--json")
    assert rc == 0 and json.loads(out)["problem"]["layout"] == "masked"
    rc, out, _ = run(capsys, "model", "--shape", "4096,4096,4096", "--dtype", "fp8", "--profile", "H200")
    flat = " ".join(out.split())
    assert rc == 0 and "gemmlab.scaled_mm (scale 'tensor')" in flat and "gemmlab.scaled_mm (scale 'block')" in flat
    assert repr(planner.plan_fp8(4096, 4096, 4096, scale="block")) in flat
    for bad, msg in ((("--layout", "masked"), "--layout goes with --groups"),
                     (("--groups", "8", "--kernel", "h04"), "--kernel / --config"),
                     (("--groups", "8", "--dtype", "tf32"), "grouped_mm takes")):
        rc, _, err = run(capsys, "model", "--shape", "4096,4096,4096", *bad)
        assert rc == 2 and msg in err, err


def test_inspect_planned_kernels(capsys):
    """engine / fp8 / grouped with --shape: the instantiation the call would run, compiled and read, its plan's
    SASS claims checked; the flags that do not fit refused."""
    from gemmlab import grouped, planner

    rc, out, _ = run(capsys, "inspect", "grouped", "--shape", "4096,28672,4096", "--groups", "8")
    flat = " ".join(out.split())
    assert rc == 0 and grouped.plan("contiguous", 8, 4096, 28672, 4096).compiled_name in flat
    # (the fitted form with ping-pong consumers at 512 rows a group: one HGMMA shape a token-tile width)
    assert "SASS claims met" in flat and "HGMMA 64x16x16" in flat and "HGMMA 64x128x16" in flat
    rc, out, _ = run(capsys, "inspect", "engine", "--shape", "2040,3584,3584", "--json")
    assert rc == 0 and planner.plan(2040, 3584, 3584).compiled_name in json.loads(out)["name"]
    rc, out, _ = run(capsys, "inspect", "fp8", "--shape", "4096,4096,4096", "--scale", "block", "--sass")
    assert rc == 0 and "annotated SASS" in out and "HGMMA" in out
    for args, msg in ((("grouped", "--shape", "64,64,64"), "needs groups"),
                      (("engine",), "needs --shape"),
                      (("engine", "--shape", "64,64,64", "--groups", "2"), "groups go with the grouped"),
                      (("h04", "--shape", "64,64,64"), "--shape goes with a planned kernel"),
                      (("engine", "--shape", "64,64,64", "--config", "BM=64"), "--config"),
                      (("fp8", "--shape", "64,64,64", "--layout", "masked"), "--layout goes with grouped")):
        rc, _, err = run(capsys, "inspect", *args)
        assert rc == 2 and msg in err, (args, err)


def test_figures_and_plot_commands(capsys, tmp_path):
    rc, out, _ = run(capsys, "figures", str(tmp_path / "f"), "--only", "swizzle", "--format", "png")
    assert rc == 0 and (tmp_path / "f" / "swizzle.png").is_file()
    rec = dict(schema=1, kernel="hopper.h01_tma_wgmma", ladder="hopper", dtype="bf16", M=4096, N=4096, K=4096,
               tflops=300.0, baseline_tflops=670.0, ratio=0.45, time_ms=0.458, sm_clock_mhz=1320.0, sm_count=132,
               rel_error=1e-4, correct=True, gpu="NVIDIA H200")
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    rc, out, _ = run(capsys, "plot", str(path), "--out", str(tmp_path / "p"), "--format", "png")
    assert rc == 0
    assert (tmp_path / "p" / "ladder.png").is_file() and (tmp_path / "p" / "roofline.png").is_file()
    flat = " ".join(out.split())
    assert "42%" in flat  # 300 of 713.7 TFLOP/s at the recorded 1320 MHz
    added = rec_reports.add_model(dict(rec))  # what plot adds to records written without a prediction
    assert added["model_tflops"] > 0 and added["model_clock_mhz"] == 1320.0
    assert added["sol_tflops"] == pytest.approx(713.7, abs=0.1)


@pytest.mark.gpu
def test_bench_explicit_shape_on_gpu(capsys, tmp_path):
    out = tmp_path / "r.jsonl"
    rc, text, _ = run(capsys, "bench", "--shape", "512,512,512", "--kernel", "k01", "--rounds", "3",
                      "--out", str(out), "--plots", str(tmp_path / "p"))
    assert rc == 0
    (rec,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert rec["kernel"] == "sgemm.k01_naive" and rec["correct"] and rec["suite"] == "explicit"
    assert rec["tflops"] > 0 and rec["model_tflops"] > 0 and rec["sol_tflops"] > 0
    assert (tmp_path / "p" / "ladder.png").is_file() and (tmp_path / "p" / "roofline.png").is_file()


@pytest.mark.hopper
def test_ladder_measures_on_gpu(capsys, tmp_path):
    rc, text, _ = run(capsys, "ladder", "--ladder", "hopper", "--shape", "1024", "--rounds", "3",
                      "--plot-dir", str(tmp_path), "--out", str(tmp_path / "l.jsonl"))
    assert rc == 0
    assert (tmp_path / "ladder.png").is_file()
    recs = [json.loads(line) for line in (tmp_path / "l.jsonl").read_text().splitlines()]
    assert {r["kernel"] for r in recs} >= {"hopper.h01_tma_wgmma"}
    assert all(r.get("tflops") for r in recs if r["correct"])


# gemmlab bench on the CPU: the GPU, the timer and the checks are faked; what would be timed is asserted ----

class FakeBench:
    """Stands in for ``gemmlab.bench.bench_shape`` / ``bench_matmul``: records each call, returns records
    shaped like the real ones (the fields the CLI, the table and the plots read)."""

    def __init__(self):
        self.jobs = []  # (ladder, (M, N, K), [(short name, resolved config)], suite, rounds)
        self.cases = []  # bench_matmul keyword arguments

    def bench_shape(self, ladder, M, N, K, steps, *, suite="adhoc", rounds=15, **_):
        self.jobs.append((ladder, (M, N, K), [(s.short.split("_")[0], s.resolve(c)) for s, c in steps], suite,
                          rounds))
        common = dict(schema=1, gpu="FAKE H200", sm_count=132, suite=suite, ladder=ladder, M=M, N=N, K=K,
                      dtype="fp32" if ladder == "sgemm" else "bf16", sm_clock_mhz=1500.0, baseline_tflops=100.0,
                      baseline_ms=1.0, rel_error=1e-5, correct=True)
        return [dict(common, kernel=s.name, config=s.resolve(c), time_ms=1.25, tflops=80.0, ratio=0.8)
                for s, c in steps]

    def bench_matmul(self, M, N, K, *, suite="adhoc", rounds=15, extra=None, **kw):
        self.cases.append(dict(M=M, N=N, K=K, suite=suite, rounds=rounds, **kw, **(extra or {})))
        return dict(schema=1, kernel="gemmlab.matmul", suite=suite, M=M, N=N, K=K, layout="TN", dtype="bfloat16",
                    bias=kw.get("bias", False), activation=kw.get("activation"), sm_clock_mhz=1500.0,
                    baseline_tflops=100.0, tflops=110.0, ratio=1.1, gbps=900.0, rel_error=1e-3, correct=True,
                    **(extra or {}))


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    import types

    import gemmlab.bench
    import gemmlab.gpu

    fake = FakeBench()
    monkeypatch.setattr(cli, "_has_gpu", lambda: True)
    monkeypatch.setattr(gemmlab.gpu, "gpu_info", lambda *a: types.SimpleNamespace(sm_count=132, name="FAKE H200", l2_bytes=50 * 2**20))
    monkeypatch.setattr(gemmlab.bench, "bench_shape", fake.bench_shape)
    monkeypatch.setattr(gemmlab.bench, "bench_matmul", fake.bench_matmul)
    monkeypatch.setattr(rec_reports, "add_model", lambda r: dict(r, model_tflops=90.0))  # compiles: tested below
    monkeypatch.setenv("GEMMLAB_OUT_DIR", str(tmp_path / "gemmlab-out"))
    return fake


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_bench_configs_in_one_interleaved_run(capsys, tmp_path, fake_gpu):
    out = tmp_path / "r.jsonl"
    rc, text, _ = run(capsys, "bench", "--steps", "k03,k09", "--kernel", "k10", "--sizes", "4096", "--rounds", "3",
                      "--configs", "WM=32,WN=64;BK=8,WM=32,WN=64;BK=7;TILE=16;NOPE=1", "--out", str(out),
                      "--no-plots")
    assert rc == 0
    ((ladder, shape, steps, suite, rounds),) = fake_gpu.jobs  # one job: every variant interleaved
    assert (ladder, shape, suite, rounds) == ("sgemm", (4096, 4096, 4096), "explicit", 3)
    k09 = registry.get("k09").default_config()
    k10 = registry.get("k10").config_for(4096, 4096, 4096, 132, tuned=False)  # its heuristic: the 256 x 128 tile
    assert steps == [
        ("k03", {"TILE": 32}), ("k03", {"TILE": 16}),  # only TILE=16 names a parameter k03 has
        ("k09", k09), ("k09", {**k09, "WM": 32}), ("k09", {**k09, "BK": 8, "WM": 32}),  # BK=7 is not offered
        ("k10", k10), ("k10", {**k10, "WM": 32}),  # BK is 8 already: both WM=32 variants are one config
    ]
    recs = read_jsonl(out)
    assert [(r["kernel"].split(".")[1][:3], r["config"]) for r in recs] == steps
    assert all(r["suite"] == "explicit" and r["model_tflops"] == 90.0 for r in recs)
    assert "k09_warptiling [BM=128" in text  # a plain line per record as it arrives


def test_bench_uses_the_step_heuristic_by_default(capsys, tmp_path, fake_gpu):
    out = tmp_path / "sweep.jsonl"
    out.write_text(json.dumps({"kernel": "earlier"}) + "\n")  # --out appends
    rc, _, _ = run(capsys, "bench", "--ladder", "hopper", "--steps", "h10", "--sizes", "3072,4096", "--rounds", "10",
                   "--suite-name", "sweep", "--out", str(out), "--no-plots")
    assert rc == 0
    assert [(shape[0], steps[0][1]["BN"]) for _, shape, steps, _, _ in fake_gpu.jobs] == [(3072, 192), (4096, 256)]
    recs = read_jsonl(out)
    assert recs[0] == {"kernel": "earlier"}
    assert [(r["M"], r["config"]["BN"], r["suite"]) for r in recs[1:]] == [(3072, 192, "sweep"), (4096, 256, "sweep")]
    # --config overrides parameters over the heuristic's choice; the rest stay as it picked them
    fake_gpu.jobs.clear()
    rc, _, _ = run(capsys, "bench", "--steps", "h10", "--shape", "3072", "--config", "QSIZE=3", "--out", str(out),
                   "--no-plots")
    assert rc == 0
    ((_, _, [(_, cfg)], suite, _),) = fake_gpu.jobs
    assert (cfg["BN"], cfg["QSIZE"], suite) == (192, 3, "explicit")


def test_suites_pass_the_heuristic_config():
    def h10_configs(jobs):
        return [(j.shape[0], c["BN"]) for j in jobs for s, c in j.steps if s.short.startswith("h10")]

    assert h10_configs(suites.ladder_suite([(3072,) * 3], ["hopper"], sm_count=132)) == [(3072, 192)]
    assert h10_configs(suites.square_suite((3072, 4096), ["h10"], sm_count=132)) == [(3072, 192), (4096, 256)]
    assert h10_configs(suites.explicit((3072, 3072, 3072), ["h10"], sm_count=132)) == [(3072, 192)]
    (job,) = suites.square_suite((3072,), ladders=["hopper"], sm_count=132)  # the last Hopper step, its heuristic
    assert [(s.short[:3], c) for s, c in job.steps] == [("h12", {"QSIZE": 4, "BN": 192, "ORDER": 2, "GROUP_M": 8})]
    with pytest.raises(UnsupportedProblem, match="h10.*cannot run 3000x3072x3072"):
        suites.explicit((3000, 3072, 3072), ["h10"], sm_count=132)


def test_bench_shapes_sizes_and_ladder(capsys, tmp_path, fake_gpu):
    out = tmp_path / "r.jsonl"
    rc, text, _ = run(capsys, "bench", "--ladder", "hopper", "--shapes", "1024,2048,512;4096x1024x256",
                      "--sizes", "2048", "--steps", "h01,h10", "--suite", "ladder", "--out", str(out), "--no-plots")
    assert rc == 0
    assert [(lad, shape, [n for n, _ in steps], suite) for lad, shape, steps, suite, _ in fake_gpu.jobs] == [
        ("hopper", (1024, 2048, 512), ["h01", "h10"], "ladder"),
        ("hopper", (4096, 1024, 256), ["h01", "h10"], "ladder"),
        ("hopper", (2048, 2048, 2048), ["h01", "h10"], "ladder"),
    ]
    # every step of the ladder when none is named; steps that cannot run a shape are left out of it
    fake_gpu.jobs.clear()
    rc, _, _ = run(capsys, "bench", "--ladder", "sgemm", "--shape", "100,200,300", "--out", str(out), "--no-plots")
    assert rc == 0
    ((lad, shape, steps, _, _),) = fake_gpu.jobs
    assert (lad, shape) == ("sgemm", (100, 200, 300))
    assert [n for n, _ in steps] == [s.short[:3] for s in registry.all_kernels("sgemm")]
    # a named step skipped at one shape says so; at no shape it is an error
    fake_gpu.jobs.clear()
    rc, text, _ = run(capsys, "bench", "--steps", "h10", "--shapes", "4096,4096,4096;4000,4096,4096",
                      "--out", str(out), "--no-plots")
    assert rc == 0 and [j[1] for j in fake_gpu.jobs] == [(4096, 4096, 4096)]
    assert "h10_deep_pipeline skipped at 4000x4096x4096: needs M % 128 == 0" in " ".join(text.split())
    rc, _, err = run(capsys, "bench", "--steps", "h10", "--shape", "4000,4096,4096", "--out", str(out))
    assert rc == 2 and "cannot run 4000x4096x4096" in err


def test_bench_suites_ladder_and_square(capsys, tmp_path, fake_gpu, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, _ = run(capsys, "bench", "--rounds", "2")
    assert rc == 0
    assert [(lad, shape, len(steps), suite) for lad, shape, steps, suite, _ in fake_gpu.jobs] == [
        ("hopper", (4096, 4096, 4096), len(registry.all_kernels("hopper")), "ladder"),
        ("sgemm", (4096, 4096, 4096), len(registry.all_kernels("sgemm")), "ladder"),
    ]
    # default --out and --plots: under GEMMLAB_OUT_DIR, never the working folder's benchmarks/
    out = tmp_path / "gemmlab-out"
    assert len(read_jsonl(out / "results/ladder.jsonl")) == len(registry.all_kernels())
    assert (out / "plots/ladder/ladder.png").is_file()
    assert not (tmp_path / "benchmarks").exists()
    fake_gpu.jobs.clear()
    rc, _, _ = run(capsys, "bench", "--suite", "square", "--ladder", "hopper", "--suite-name", "sq",
                   "--plots", str(tmp_path / "p"))
    assert rc == 0
    assert [(shape[0], [n for n, _ in steps], suite) for _, shape, steps, suite, _ in fake_gpu.jobs] == [
        (n, ["h12"], "sq") for n in suites.SQUARE_SIZES]
    assert len(read_jsonl(out / "results/sq.jsonl")) == len(suites.SQUARE_SIZES)
    assert (tmp_path / "p" / "sizes.png").is_file()


def test_bench_matmul_suites(capsys, tmp_path, fake_gpu, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, text, _ = run(capsys, "bench", "--suite", "matmul-epilogue", "--rounds", "10")
    out = tmp_path / "gemmlab-out"
    assert rc == 0
    assert not fake_gpu.jobs
    assert [(c["M"], c["N"], c["K"], c["bias"], c["activation"], c["case"], c["suite"], c["rounds"])
            for c in fake_gpu.cases] == [(c.M, c.N, c.K, c.bias, c.activation, c.name, "epilogue", 10)
                                         for c in matmul_suites.suite("epilogue")]
    recs = read_jsonl(out / "results/matmul.jsonl")  # all matmul suites share one file
    assert [r["case"] for r in recs] == [c.name for c in matmul_suites.suite("epilogue")]
    assert all(r["suite"] == "epilogue" and "model_tflops" not in r for r in recs)
    assert "epilogue: geomean x1.100" in text
    assert not (out / "plots").exists()
    fake_gpu.cases.clear()
    rc, _, _ = run(capsys, "bench", "--suite", "matmul-decode", "--suite-name", "dec",
                   "--out", str(tmp_path / "m.jsonl"))
    assert rc == 0
    assert len(fake_gpu.cases) == len(matmul_suites.suite("decode"))
    assert {r["suite"] for r in read_jsonl(tmp_path / "m.jsonl")} == {"dec"}


def test_bench_help_names_every_matmul_suite(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--help"])
    text = capsys.readouterr().out
    for name in matmul_suites.SUITES:
        assert name in text
    for opt in ("--configs", "--sizes", "--shapes", "--steps", "--suite-name", "--rounds", "matmul-NAME"):
        assert opt in text


def test_bench_usage_errors(capsys, fake_gpu):
    for argv, needle in ((["--suite", "matmul-llm", "--sizes", "4096"], "--sizes"),
                         (["--suite", "matmul-llm", "--steps", "h10"], "--steps"),
                         (["--config", "BN=128"], "--steps"),
                         (["--ladder", "sgemm", "--steps", "h10"], "not a step of the sgemm ladder")):
        rc, _, err = run(capsys, "bench", *argv)
        assert rc == 2 and needle in err, argv
    for argv in (["--configs", "BN"], ["--sizes", "4096,x"], ["--shapes", "1,2"], ["--suite", "matmul-nope"]):
        with pytest.raises(SystemExit) as e:
            cli.main(["bench", *argv])
        assert e.value.code == 2, argv
    rc, _, err = run(capsys, "bench", "--steps", "k99")
    assert rc == 2 and "no kernel named" in err
    assert not fake_gpu.jobs and not fake_gpu.cases


def test_bench_retries_a_failing_job_step_by_step(capsys, tmp_path, fake_gpu, monkeypatch):
    import gemmlab.bench

    def flaky(ladder, M, N, K, steps, **kw):
        if any(s.short.startswith("k02") for s, _ in steps):
            raise RuntimeError("launch failed")
        return fake_gpu.bench_shape(ladder, M, N, K, steps, **kw)

    monkeypatch.setattr(gemmlab.bench, "bench_shape", flaky)
    out = tmp_path / "r.jsonl"
    rc, text, _ = run(capsys, "bench", "--steps", "k01,k02,k03", "--shape", "256", "--out", str(out), "--no-plots")
    assert rc == 0
    assert [r["kernel"] for r in read_jsonl(out)] == ["sgemm.k01_naive", "sgemm.k03_smem_tiling"]
    assert "k02_coalesced at 256x256x256 failed" in " ".join(text.split())


def test_bench_records_carry_the_model(capsys, tmp_path, fake_gpu, monkeypatch):
    monkeypatch.setattr(rec_reports, "add_model", _REAL_ADD_MODEL)
    out = tmp_path / "r.jsonl"
    rc, _, _ = run(capsys, "bench", "--steps", "k01", "--shape", "512", "--out", str(out), "--no-plots")
    assert rc == 0
    (rec,) = read_jsonl(out)
    assert rec["model_tflops"] > 0 and rec["sol_tflops"] > 0 and rec["model_clock_mhz"] == 1500.0


def _bench_commands(script: str, out_dir) -> list[list[str]]:
    """The `python3 -m gemmlab bench ...` lines of a benchmark script, with $OUT filled in."""
    import shlex
    from pathlib import Path

    text = (Path(__file__).parent.parent / "benchmarks" / script).read_text()
    cmds = []
    for line in text.splitlines():
        if "python3 -m gemmlab bench" in line and not line.lstrip().startswith("#"):
            args = line.split("python3 -m gemmlab bench", 1)[1].split(" 2>&1", 1)[0].split("|", 1)[0]
            argv = shlex.split(args.replace("$OUT", str(out_dir)))
            cmds.append(argv)
    return cmds


def test_h200_run_script_times_what_the_readme_tables_read(capsys, tmp_path, fake_gpu):
    cmds = _bench_commands("h200_run.sh", tmp_path)
    assert len(cmds) == 8
    for argv in cmds:
        assert cli.main(["bench", *argv]) == 0, argv
    capsys.readouterr()
    hopper = [s.short[:3] for s in registry.all_kernels("hopper")]
    sgemm = [s.short[:3] for s in registry.all_kernels("sgemm")]
    jobs = [(lad, shape[0], [n for n, _ in steps], suite, rounds) for lad, shape, steps, suite, rounds in fake_gpu.jobs]
    sweep = (2048, 3072, 4096, 6144, 8192, 12288, 16384)
    assert jobs == [("hopper", 4096, hopper, "ladder", 10), ("hopper", 8192, hopper, "ladder", 10),
                    *[("hopper", n, ["h10", "h12"], "sweep", 10) for n in sweep],
                    ("sgemm", 4096, sgemm, "ladder", 5),
                    ("sgemm", 8192, ["k04", "k05", "k06", "k07", "k08", "k09", "k10"], "ladder", 5)]
    files = {p.name: read_jsonl(p) for p in tmp_path.glob("*.jsonl")}
    assert set(files) == {"hopper_ladder.jsonl", "hopper_sweep.jsonl", "sgemm_ladder.jsonl", "matmul.jsonl"}
    assert [r["M"] for r in files["hopper_sweep.jsonl"]] == [n for n in sweep for _ in ("h10", "h12")]
    order = ("unaligned", "square", "epilogue", "llm")
    assert [c["suite"] for c in fake_gpu.cases] == [s for s in order for _ in matmul_suites.suite(s)]
    assert [c["rounds"] for c in fake_gpu.cases][-1] == 5 and fake_gpu.cases[0]["rounds"] == 10
    assert len(files["matmul.jsonl"]) == len(fake_gpu.cases)
    assert not list(tmp_path.glob("**/*.png"))  # the device runs draw no plots


def test_device_run_script_passes_bench_arguments(capsys, tmp_path, fake_gpu):
    (argv,) = _bench_commands("device_run.sh", tmp_path)
    assert argv[0] == "$r" and argv[-2:] == ["--out", f"{tmp_path}/bench.jsonl"]
    for bench in ("--ladder hopper --steps h10 --sizes 4096 --configs BN=128;BN=192 --suite-name sweep",
                  "--suite matmul-decode"):  # $BENCH entries, word-split as the script's unquoted $r is
        assert cli.main(["bench", *bench.split(), *argv[1:]]) == 0
    capsys.readouterr()
    ((_, _, steps, suite, _),) = fake_gpu.jobs
    assert [c["BN"] for _, c in steps] == [256, 128] and suite == "sweep"  # 4096 % 192 != 0: skipped
    assert len(read_jsonl(tmp_path / "bench.jsonl")) == 2 + len(matmul_suites.suite("decode"))


def test_bench_as_json_keeps_stdout_for_the_json(capsys, tmp_path, fake_gpu):
    rc, out, err = run(capsys, "bench", "--steps", "k01,k02", "--shape", "256", "--out", str(tmp_path / "r.jsonl"),
                       "--json")
    assert rc == 0
    recs = json.loads(out)  # the per-record lines went to stderr
    assert [r["kernel"] for r in recs] == ["sgemm.k01_naive", "sgemm.k02_coalesced"]
    assert "k01_naive [BLOCK=32] 256x256x256:" in err


def test_check_candidates_keeps_only_correct_ones(monkeypatch):
    """bench.check_candidates: each candidate runs into a NaN-poisoned output; a right answer passes, a
    wrong one, one that leaves an element unwritten, and one that raises are recorded and left out."""
    from gemmlab import bench

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    ref = torch.randn(8, 8, dtype=torch.float64)
    out = torch.empty(8, 8)

    def right(i):
        out.copy_(ref)

    def wrong(i):
        out.copy_(ref * 1.1)

    def partial(i):
        out[:7].copy_(ref[:7])

    def broken(i):
        raise RuntimeError("no kernel")

    passing, errors = bench.check_candidates(
        {"right": right, "wrong": wrong, "partial": partial, "broken": broken}, out, ref)
    assert list(passing) == ["right"] and errors["right"] < 1e-6
    assert 0.05 < errors["wrong"] < 0.2 and errors["partial"] == float("inf")
    assert errors["broken"].startswith("RuntimeError: no kernel")
