"""The gemmlab command: every subcommand's help, and the CPU paths end to end."""

import json

import pytest
import torch

from gemmlab import cli

SUBCOMMANDS = ("ladder", "inspect", "model", "bench", "plot", "figures")


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
    assert cli.parse_shape("4096") == (4096, 4096, 4096)
    assert cli.parse_shape("1,2,3") == cli.parse_shape("1x2x3") == (1, 2, 3)
    with pytest.raises(Exception):
        cli.parse_shape("1,2")
    assert cli.parse_config(["BN=128", "QSIZE=3,BM=64"]) == {"BN": 128, "QSIZE": 3, "BM": 64}
    assert cli.parse_config(None) is None
    with pytest.raises(cli.UsageError):
        cli.parse_config(["BN"])
    with pytest.raises(cli.UsageError):
        cli.parse_config(["BN=x"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_bench_without_gpu_says_so(capsys):
    rc, out, err = run(capsys, "bench", "--suite", "square")
    assert rc == 2
    assert "needs an NVIDIA GPU" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_ladder_static_view(capsys):
    rc, out, _ = run(capsys, "ladder", "--ladder", "sgemm")
    assert rc == 0
    assert "k01" in out and "model" in out
    assert "No GPU visible" in " ".join(out.split())


def test_default_command_is_ladder(monkeypatch):
    seen = []
    monkeypatch.setattr(cli, "_cmd_ladder", lambda args: seen.append(args.ladder) or 0)
    assert cli.main([]) == 0
    assert cli.main(["--ladder", "sgemm"]) == 0
    assert seen == [None, "sgemm"]


def test_inspect_step_and_diff(capsys):
    rc, out, _ = run(capsys, "inspect", "k01")
    assert rc == 0
    assert "instruction mix" in out and "registers / thread" in out and "ffma" in out
    rc, out, _ = run(capsys, "inspect", "k01", "--diff", "h01")
    assert rc == 0 and "hgmma" in out
    rc, _, err = run(capsys, "inspect", "k99_nope")
    assert rc == 1 and "no kernel named" in err


def test_inspect_file_with_sass_and_ptx(capsys, tmp_path):
    f = tmp_path / "scale.cu"
    f.write_text("template <int S> __global__ void scale(const float4* __restrict__ a, float4* b) {\n"
                 "  float4 v = a[threadIdx.x]; v.x *= S; v.y *= S; v.z *= S; v.w *= S; b[threadIdx.x] = v; }\n")
    rc, out, _ = run(capsys, "inspect", "--file", str(f), "--expr", "scale<3>", "--arch", "sm_90", "--sass", "--ptx")
    assert rc == 0
    assert "global_load.128" in out  # the annotated listing
    assert "ld.global.nc.v4.f32" in out  # the PTX
    rc, _, err = run(capsys, "inspect", "--file", str(f))
    assert rc == 2 and "--expr" in err


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
    added = cli._add_model(dict(rec))  # what plot adds to records written without a prediction
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
