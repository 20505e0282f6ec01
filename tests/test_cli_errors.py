"""The command's boundary: every bad argument, name, number or file is one line on stderr with a non-zero status
(2 usage, 1 failed, 3 needs a GPU, 130 interrupted), never a traceback; what it prints when piped, as JSON, and
how little it imports for --help and errors."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gemmlab import cli, log
from gemmlab.cli import parser

ROOT = Path(__file__).resolve().parent.parent
SRC = str(ROOT / "src")


def run(capsys, *argv):
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_line_error(err: str, command: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith(f"gemmlab {command}:"), err
    return lines[0]


# Usage errors found by the parser: argparse's own message and status 2 ------------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["model", "--shape", "64", "--clock", "-1"], "expected 100 to 3000 MHz"),
    (["model", "--shape", "64", "--clock", "0"], "expected 100 to 3000 MHz"),
    (["model", "--shape", "64", "--clock", "nan"], "expected 100 to 3000 MHz"),
    (["model", "--shape", "1000000000,1000000000,1000000000"], "at most 131072"),
    (["model", "--shape", "0,1,1"], "positive"),
    (["model"], "--shape"),
    (["ladder", "--rounds", "0"], "expected 1 to 1000"),
    (["bench", "--sizes", "4096,x"], "comma-separated"),
    (["mcp", "--port", "70000"], "expected 1 to 65535"),
    (["inspect", "k05", "--arch", "sm_100"], "invalid choice"),
    (["figures", "out", "--only", "nope"], "invalid choice"),
])
def test_parser_refuses_bad_numbers_and_choices(capsys, argv, needle):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


# Usage errors found after parsing: one line, status 2, nothing on stdout ------------------------------------

@pytest.mark.parametrize("argv, needle", [
    (["model", "--shape", "64", "--kernel", "h44"], "did you mean h04_two_consumers?"),
    (["model", "--shape", "64", "--config", "BN=128"], "a config needs a kernel"),
    (["model", "--shape", "4096", "--kernel", "h04", "--config", "QSIZE=99"], "QSIZE in"),
    (["model", "--shape", "64", "--kernel", "k05", "--dtype", "bf16"], "is a fp32 kernel"),
    (["explain", "nope", "--shape", "64"], "no kernel named 'nope'"),
    (["inspect"], "name a step"),
    (["inspect", "k05", "--file", "x.cu"], "not both"),
    (["inspect", "k05", "--expr", "k"], "--expr goes with a file"),
    (["tune", "k08"], "name a step and a shape"),
    (["bench", "--config", "BN=128"], "--steps"),
])
def test_usage_errors_are_one_line_before_any_output(capsys, argv, needle):
    rc, out, err = run(capsys, *argv)
    assert rc == cli.EXIT_USAGE == 2
    assert out == ""  # nothing half-printed before the error (the model table used to come first)
    assert needle in one_line_error(err, argv[0])


def test_mistyped_command_is_answered_with_the_closest(capsys):
    rc, out, err = run(capsys, "inpsect", "k05")
    assert rc == 2 and out == ""
    assert "did you mean inspect?" in err and "Traceback" not in err


def test_short_step_names(capsys):
    from gemmlab.reports import resolve_step_name

    for name, full in (("k6", "sgemm.k06_vectorized"), ("h4", "hopper.h04_two_consumers"), ("H04", "hopper.h04_two_consumers"),
                       ("sgemm.k5", "sgemm.k05_blocktile_2d"), ("k05_blocktile_2d", "sgemm.k05_blocktile_2d")):
        assert resolve_step_name(name) == full
    rc, out, _ = run(capsys, "model", "--shape", "4096", "--kernel", "h4", "--profile", "H200")
    assert rc == 0 and "hopper.h04_two_consumers" in out


# Files ------------------------------------------------------------------------------------------------------------

RECORD_FILES = sorted(p for pattern in ("*.jsonl", "*.jsonl.gz")  # the large append-only files are kept gzipped
                      for p in (ROOT / "benchmarks" / "results").glob(pattern))


@pytest.mark.parametrize("path", RECORD_FILES, ids=lambda p: p.name)
def test_plot_reads_every_record_file_of_the_project(capsys, tmp_path, path):
    """No traceback on the project's own records: a table (and plots) where a file holds benchmark records,
    else one line saying what a record needs."""
    rc, out, err = run(capsys, "plot", str(path), "--no-model", "--out", str(tmp_path))
    assert "Traceback" not in err
    if rc == 0:
        assert "records from" in out
    else:
        assert rc == 2 and "each record needs M, N, K" in one_line_error(err, "plot")


def test_plot_matmul_records_use_their_case_names(capsys, tmp_path):
    rc, out, _ = run(capsys, "plot", str(ROOT / "benchmarks/results/matmul.jsonl"), "--no-plots", "--json")
    assert rc == 0
    rows = json.loads(out)["rows"]
    assert any(r["kernel"].startswith("llama3_8b.") for r in rows)
    assert all(r["sol_fraction"] is None or 0 < r["sol_fraction"] < 1.5 for r in rows)  # bf16, not 'bfloat16'


@pytest.mark.parametrize("content, needle", [
    ("not json at all\n", "r.jsonl:1: not a JSON line"),
    ('{"M": 1, "N": 2, "K": 3, "kernel": "x"}\n{broken\n', "r.jsonl:2: not a JSON line"),
    ("[1, 2]\n", "no benchmark records"),
    ('{"suite": "x"}\n', "no benchmark records"),
])
def test_plot_refuses_garbage_with_the_line(capsys, tmp_path, content, needle):
    path = tmp_path / "r.jsonl"
    path.write_text(content)
    rc, _, err = run(capsys, "plot", str(path))
    assert rc == 2 and needle in one_line_error(err, "plot")


def test_plot_of_a_binary_or_missing_file(capsys, tmp_path):
    (tmp_path / "b.jsonl").write_bytes(b"\xff\xfe\x00\x01")
    rc, _, err = run(capsys, "plot", str(tmp_path / "b.jsonl"))
    assert rc == 2 and "not a text file" in one_line_error(err, "plot")
    rc, _, err = run(capsys, "plot", str(tmp_path / "missing.jsonl"))
    assert rc == 2 and "cannot read it (No such file or directory)" in one_line_error(err, "plot")


def test_help_examples_name_files_that_exist(capsys):
    """Every path in the help texts that looks like a committed file exists (plot's example named a missing one)."""
    p = parser.build_parser()
    texts = [p.format_help()] + [sub.format_help() for action in p._subparsers._group_actions
                                 for sub in action.choices.values()]
    paths = {m for t in texts for m in re.findall(r"benchmarks/[\w/]+\.\w+", t)}
    assert paths, "the help names no committed file any more: drop this test"
    for rel in paths:
        assert (ROOT / rel).is_file(), rel


def test_inspect_a_file_of_one_kernel_without_expr(capsys, tmp_path):
    f = tmp_path / "axpy.cu"
    f.write_text("__global__ void axpy(float a, const float* __restrict__ x, float* y) {\n"
                 "  y[threadIdx.x] += a * x[threadIdx.x]; }\n")
    rc, out, _ = run(capsys, "inspect", str(f))
    assert rc == 0 and "axpy.cu:axpy" in out and "registers / thread" in out
    two = tmp_path / "two.cu"
    two.write_text(f.read_text() + "__global__ void other(float* y) { y[0] = 1; }\n")
    rc, _, err = run(capsys, "inspect", str(two))
    assert rc == 2 and "holds 2 kernels (axpy, other)" in one_line_error(err, "inspect")
    rc, out, _ = run(capsys, "inspect", str(two), "--expr", "other")
    assert rc == 0 and "two.cu:other" in out


def test_compile_errors_cite_the_users_file(capsys, tmp_path):
    f = tmp_path / "bad.cu"
    f.write_text("__global__ void k(float* x) { x[0] = undefined_thing; }\n")
    rc, _, err = run(capsys, "inspect", str(f))
    assert rc == 1 and "undefined_thing" in err and "Traceback" not in err
    assert f"{f}(1): error" in err and "src_" not in err


def test_an_unwritable_output_is_one_line(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, _, err = run(capsys, "figures", str(blocker / "sub"), "--only", "swizzle")
    assert rc == 1 and "cannot use" in one_line_error(err, "figures")


@pytest.mark.parametrize("exc, rc, needle", [
    (MemoryError(), 1, "ran out of memory"),
    (KeyboardInterrupt(), 130, "interrupted"),
    (ModuleNotFoundError("No module named 'matplotlib'", name="matplotlib"), 1, "pip install -e '.[plots]'"),
    (ModuleNotFoundError("No module named 'rich'", name="rich"), 1, "[cli] extra"),
    (OSError(30, "Read-only file system", "/cache/x"), 1, "cannot use /cache/x: Read-only file system"),
    (RuntimeError("surprise"), 1, "a bug in gemmlab: run again with -v"),
])
def test_the_boundary_turns_errors_into_a_line_and_a_status(capsys, monkeypatch, exc, rc, needle):
    from gemmlab.reports import modelling

    def boom(*a, **k):
        raise exc

    monkeypatch.setattr(modelling, "model_report", boom)
    got, out, err = run(capsys, "model", "--shape", "64")
    assert got == rc and out == ""
    assert needle in one_line_error(err, "model")


def test_unexpected_errors_keep_their_traceback_with_verbose(monkeypatch):
    from gemmlab.reports import modelling

    monkeypatch.setattr(modelling, "model_report", lambda *a, **k: 1 / 0)
    try:
        with pytest.raises(ZeroDivisionError):
            cli.main(["model", "--shape", "64", "-v"])
    finally:
        log.reset()  # -v attached a handler to the gemmlab logger


# Output forms ----------------------------------------------------------------------------------------------------

def test_json_reports(capsys):
    rc, out, _ = run(capsys, "model", "--shape", "4096", "--kernel", "h04", "--clock", "1320", "--profile", "H200",
                     "--json")
    assert rc == 0
    d = json.loads(out)
    assert d["kernel"]["waves"]["tiles"] == 512 and d["problem"]["speed_of_light_tflops"] == pytest.approx(713.7, abs=0.1)
    rc, out, _ = run(capsys, "inspect", "k06", "--json")
    d = json.loads(out)
    assert rc == 0 and "LDG.128" in d["features"] and d["sass_claims_failed"] == []
    rc, out, _ = run(capsys, "explain", "h04", "--shape", "4096,4352,4096", "--json", "--no-time")
    d = json.loads(out)
    assert rc == 0 and d["dominant"] == "waves" and d["measurement"] is None
    rc, out, _ = run(capsys, "ladder", "--ladder", "hopper", "--json")
    rows = {r["step"]: r for r in json.loads(out)["rows"]}
    assert rc == 0 and len(rows) >= 12
    assert "TMA multicast" in rows["h07_cluster_multicast"]["sass_new"]
    assert "STSM" in rows["h08_async_store"]["sass_new"] and "TMA store" in rows["h08_async_store"]["sass_new"]
    assert any(f.startswith("HGMMA 64x256") for f in rows["h04_two_consumers"]["sass_new"])


def test_version(capsys):
    from gemmlab import __version__

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"gemmlab {__version__}"


def _imports_after(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; which heavy modules it loaded."""
    probe = code + "\nimport json, sys\nprint(json.dumps({m: m in sys.modules for m in ('torch', 'rich', 'matplotlib', 'mcp')}))"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HOME": str(ROOT)})
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--help"], ["model", "--help"], ["inpsect"], ["model", "--shape", "0"],
                                  ["--version"]])
def test_help_and_usage_errors_load_nothing_heavy(argv):
    code = f"from gemmlab.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"
    assert _imports_after(code) == {"torch": False, "rich": False, "matplotlib": False, "mcp": False}


def test_a_missing_extra_is_named():
    """Without rich (the [cli] extra) a command says what to install; --help still answers."""
    code = ("import sys\nsys.modules['rich'] = None\nfrom gemmlab.cli import main\n"
            "print('rc', main(['model', '--shape', '64']))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin", "HOME": str(ROOT)})
    assert "rc 1" in res.stdout and "Traceback" not in res.stderr
    assert "[cli] extra" in res.stderr and "pip install -e '.[cli]'" in res.stderr and "rich>=13" in res.stderr


def test_the_library_path_needs_no_tool_extras():
    """The base install (no rich, no matplotlib, no mcp) imports gemmlab and reaches gemmlab.matmul."""
    loaded = _imports_after("import gemmlab\nassert callable(gemmlab.matmul) and callable(gemmlab.linear)")
    assert loaded["torch"] and not (loaded["rich"] or loaded["matplotlib"] or loaded["mcp"])
