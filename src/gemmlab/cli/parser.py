"""The command line: every subcommand, option and check of an argument's form. Imports nothing heavy, so
``gemmlab --help`` and a mistyped option answer at once; what the options mean is in each help text."""

from __future__ import annotations

import argparse
import math
import textwrap

from ..reports import MAX_CLOCK_MHZ, MAX_DIM, MIN_CLOCK_MHZ

# Kept here, not read from the modules that own them, so that building the parser imports neither
# matplotlib nor the registry; tests/test_cli.py checks both lists against their owners.
FIGURE_NAMES = ("swizzle", "outer_products", "wave_quantization", "roofline", "warptiling", "tile_order", "pipeline")
MATMUL_SUITES = ("square", "llm", "prefill", "decode", "unaligned", "epilogue", "broad", "eager")
MATMUL_PREFIX = "matmul-"
LADDERS = ("sgemm", "hopper")

EXAMPLES = """\
examples:
  gemmlab                                   walk both ladders (static view without a GPU)
  gemmlab inspect k6 --sass                 annotated SASS of an fp32 step (k6 = k06_vectorized)
  gemmlab inspect h03 --diff h04            what changed between two Hopper steps
  gemmlab inspect my_kernel.cu              a file of your own (its one __global__ function)
  gemmlab model --shape 4096,4096,4096 --kernel h04 --clock 1320
  gemmlab explain h04 --shape 4096,4352,4096   what limits a step at a shape
  gemmlab bench --suite ladder              time every step against cuBLAS (GPU)
  gemmlab bench --suite matmul-llm          gemmlab.matmul against torch on LLM shapes (GPU)
  gemmlab tune k08 --shape 4096,4096,4096   autotune a step's config for a shape, saved per GPU (GPU)
  gemmlab plot benchmarks/results/hopper_ladder.jsonl --out plots
  gemmlab figures docs/figures

exit status: 0 done; 1 failed (a compile error, an unreadable file, nothing ran); 2 usage (bad or unknown
arguments, names, numbers); 3 needs an NVIDIA GPU and none is visible; 130 interrupted (Ctrl-C).
Records and plots go where --out says, else under $GEMMLAB_OUT_DIR (default ~/.local/share/gemmlab).
"""

DESCRIPTION = """\
gemmlab: matmul kernels for NVIDIA GPUs, and the tools to inspect, model and time them.

Without a command, 'gemmlab' walks both kernel ladders ('gemmlab ladder'). Everything except 'bench' and
'tune' (and the measured columns of 'ladder') works without a GPU. Commands need the [cli] extra (rich);
'plot' and 'figures' also [plots] (matplotlib), 'mcp' the [mcp] extra.
"""


# Argument types -----------------------------------------------------------------------------------------------

class UsageError(Exception):
    """Arguments that parse but do not make sense together (exit status 2, like argparse's own)."""


def parse_shape(text: str) -> tuple[int, int, int]:
    """``M,N,K`` (or ``MxNxK``; a single number means a cube), each 1..MAX_DIM."""
    parts = [p for p in text.replace("x", ",").split(",") if p.strip()]
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected M,N,K integers") from None
    if len(vals) == 1:
        vals *= 3
    if len(vals) != 3 or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected three positive integers M,N,K")
    if max(vals) > MAX_DIM:
        raise argparse.ArgumentTypeError(f"shape {text!r}: each of M, N, K must be at most {MAX_DIM}")
    return vals[0], vals[1], vals[2]


def parse_config(items: list[str] | None, option: str = "--config") -> dict[str, int] | None:
    """``["BN=128", "QSIZE=3,BM=64"]`` -> ``{"BN": 128, "QSIZE": 3, "BM": 64}``."""
    if not items:
        return None
    cfg = {}
    for item in items:
        for kv in item.split(","):
            if not kv.strip():
                continue
            k, sep, v = kv.partition("=")
            if not sep:
                raise UsageError(f"{option} {kv!r}: expected NAME=VALUE")
            try:
                cfg[k.strip()] = int(v)
            except ValueError:
                raise UsageError(f"{option} {kv!r}: value must be an integer") from None
    return cfg


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """``"M,N,K;M,N,K"`` -> a list of shapes (each as ``parse_shape`` reads it)."""
    shapes = [parse_shape(s) for s in text.split(";") if s.strip()]
    if not shapes:
        raise argparse.ArgumentTypeError(f"shapes {text!r}: expected M,N,K;M,N,K")
    return shapes


def parse_sizes(text: str) -> list[tuple[int, int, int]]:
    """``"2048,4096"`` -> the cubes ``[(2048, 2048, 2048), (4096, 4096, 4096)]``."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes {text!r}: expected comma-separated integers") from None
    if not sizes or min(sizes) < 1 or max(sizes) > MAX_DIM:
        raise argparse.ArgumentTypeError(f"sizes {text!r}: expected integers from 1 to {MAX_DIM}")
    return [(n, n, n) for n in sizes]


def parse_configs(text: str) -> list[dict[str, int]]:
    """``"WM=32,WN=64;BK=8"`` -> ``[{"WM": 32, "WN": 64}, {"BK": 8}]`` (one config per ';' group)."""
    try:
        return [parse_config([group], "--configs") for group in text.split(";") if group.strip()]
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_clock(text: str) -> float:
    """An SM clock in MHz, MIN_CLOCK_MHZ..MAX_CLOCK_MHZ."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"clock {text!r}: expected a number of MHz") from None
    if not (math.isfinite(v) and MIN_CLOCK_MHZ <= v <= MAX_CLOCK_MHZ):
        raise argparse.ArgumentTypeError(f"clock {text!r}: expected {MIN_CLOCK_MHZ:.0f} to {MAX_CLOCK_MHZ:.0f} MHz "
                                         "(the H200 sustains about 1320-1550 under load, boosts to 1980)")
    return v


def bounded_int(lo: int, hi: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer") from None
        if not lo <= v <= hi:
            raise argparse.ArgumentTypeError(f"{text!r}: expected {lo} to {hi}")
        return v

    parse.__name__ = "integer"
    return parse


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number")
    return v


# The parser -------------------------------------------------------------------------------------------------

class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the hand-laid-out epilogs; shows a default only where it says something."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "%(default)" not in text and action.default not in (None, False, argparse.SUPPRESS) \
                and action.option_strings and not isinstance(action.default, (list, tuple)):
            text += " (default: %(default)s)"
        return text


def _para(text: str) -> str:
    """A description as paragraphs wrapped to 88 columns (the formatter keeps them as given)."""
    return "\n\n".join(textwrap.fill(" ".join(p.split()), 88) for p in text.split("\n\n"))


COMMANDS = ("ladder", "inspect", "model", "explain", "bench", "plot", "figures", "tune", "mcp")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", action="count", default=0,
                        help="log what gemmlab does (-v: info, -vv: debug; or GEMMLAB_LOG=debug)")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print the report as JSON instead of tables")

    p = argparse.ArgumentParser(prog="gemmlab", description=DESCRIPTION, epilog=EXAMPLES, formatter_class=_Formatter)
    p.add_argument("-V", "--version", action="version", version=f"gemmlab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    def command(name, help, description, epilog=None, parents=(common,)):
        return sub.add_parser(name, parents=list(parents), formatter_class=_Formatter, help=help,
                              description=_para(description), epilog=epilog)

    lad = command(
        "ladder", "walk the kernel ladders (the default command)",
        "Walk both ladders step by step: the technique each step adds, registers, shared memory, occupancy, "
        "spills, the SASS features the step introduces (HGMMA shape, TMA loads, multicast, STSM, 128-bit "
        "accesses...) and whether its SASS meets the step's claims, and the model's predicted TFLOP/s. On a GPU, "
        "also time every step against cuBLAS (one interleaved run per ladder, the project's timer) and save a "
        "ladder plot.", parents=(common, as_json))
    lad.add_argument("--ladder", choices=LADDERS, help="only this ladder")
    lad.add_argument("--shape", type=parse_shape, default="4096,4096,4096", metavar="M,N,K",
                     help="problem for the model and the timings")
    lad.add_argument("--clock", type=parse_clock, metavar="MHZ",
                     help="SM clock for the model without a GPU (default: the profile's sustained clock)")
    lad.add_argument("--no-time", action="store_true", help="on a GPU, skip the timings")
    lad.add_argument("--rounds", type=bounded_int(1, 1000), default=7, help="timing rounds per step (median reported)")
    lad.add_argument("--out", metavar="RECORDS.jsonl", help="also append the timing records here")
    lad.add_argument("--plot-dir", metavar="DIR", help="where the ladder plot goes (default: "
                     "$GEMMLAB_OUT_DIR/plots)")

    ins = command(
        "inspect", "resources, instruction mix, loops, SASS/PTX of a kernel or a .cu file",
        "Compile a ladder step (or a .cu file of your own) without a GPU and read what the compiler made: "
        "registers, shared memory, stack and spills from ptxas; the SASS instruction mix by class (global/shared "
        "loads and stores with their widths, FFMA, HGMMA, TMA, barriers, branches, LDL/STL); every loop and how "
        "much math its body holds (unrolled or not); the step's SASS claims. --sass prints the listing with each "
        "instruction tagged by class; --diff shows what changed between two steps. KERNEL 'engine', 'fp8' or "
        "'grouped' with --shape: the instantiation gemmlab.matmul's engine kernel, gemmlab.scaled_mm or "
        "gemmlab.grouped_mm would run at that shape (its plan's SASS claims checked).",
        epilog="examples:\n  gemmlab inspect k05 --config BM=64,BN=64\n  gemmlab inspect h4 --sass\n"
               "  gemmlab inspect k05 --diff k06\n  gemmlab inspect my.cu                 (the file's one kernel)\n"
               "  gemmlab inspect my.cu --expr 'scale<4>' --arch sm_90 --ptx\n"
               "  gemmlab inspect engine --shape 2040,3584,3584\n"
               "  gemmlab inspect fp8 --shape 4096,4096,4096 --scale block --sass\n"
               "  gemmlab inspect grouped --shape 4096,28672,4096 --groups 8", parents=(common, as_json))
    ins.add_argument("kernel", nargs="?", metavar="KERNEL|PATH.cu",
                     help="a step (k05, k5, h04, sgemm.k05_blocktile_2d, ...) or a CUDA file")
    ins.add_argument("--config", action="append", metavar="K=V", help="template parameters (repeat or comma-separate)")
    ins.add_argument("--sass", action="store_true", help="print the annotated SASS listing")
    ins.add_argument("--ptx", action="store_true", help="print the PTX")
    ins.add_argument("--diff", metavar="OTHER", help="compare with another step (KERNEL -> OTHER)")
    ins.add_argument("--diff-config", action="append", metavar="K=V", help="config of the --diff step")
    ins.add_argument("--file", metavar="PATH.cu", help="a CUDA file (the same as giving it as KERNEL)")
    ins.add_argument("--shape", type=parse_shape, metavar="M,N,K", help="with engine / fp8 / grouped: the problem "
                     "(grouped: T,N,K, or C,N,K with --layout masked)")
    ins.add_argument("--groups", type=bounded_int(1, 512), metavar="G", help="with grouped: the experts")
    ins.add_argument("--layout", choices=("contiguous", "masked"), help="with grouped: offsets (default) or counts")
    ins.add_argument("--dtype", choices=("bf16", "fp16", "fp8"), help="with engine (bf16, fp16) or grouped "
                     "(bf16, fp16, fp8): the operands (default bf16)")
    ins.add_argument("--scale", choices=("tensor", "block"), help="with fp8 (or grouped --dtype fp8): per-tensor "
                     "(default) or 1 x 128 / 128 x 128 block scales")
    ins.add_argument("--expr", metavar="NAME<...>", help="with a file: the kernel or template instantiation to build "
                     "(default: the file's one __global__ function)")
    ins.add_argument("--arch", default="sm_90a", choices=("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a"),
                     help="with a file: target architecture")

    mod = command(
        "model", "FLOPs, roofline, waves, occupancy and predicted time",
        "Analytic model of a GEMM: FLOPs, minimum bytes, arithmetic intensity, the roofline bound and speed of "
        "light at an SM clock; with --kernel, the step's tile intensity, occupancy (from ptxas registers, "
        "cross-checked with cuda-core on a GPU), tiles, waves and last-wave utilization, global traffic, and the "
        "predicted time and TFLOP/s. Without --kernel, a prediction for every step. For bf16 / fp16 / fp32, also "
        "what gemmlab.matmul runs at the shape (gemmlab.plan); for fp8, what gemmlab.scaled_mm runs (per-tensor and "
        "block scales); with --groups, a grouped GEMM and the plan gemmlab.grouped_mm runs. The device is the "
        "visible GPU, else the named profile.",
        epilog="examples:\n  gemmlab model --shape 4096,4096,4096\n"
               "  gemmlab model --shape 2048,3584,3584 --kernel h11\n"
               "  gemmlab model --shape 4096,4096,4096 --dtype fp8\n"
               "  gemmlab model --shape 4096,28672,4096 --groups 8          (Mixtral gate/up, 4096 rows)\n"
               "  gemmlab model --shape 128,2816,2048 --groups 64 --layout masked --dtype fp8",
        parents=(common, as_json))
    mod.add_argument("--shape", type=parse_shape, required=True, metavar="M,N,K", help="problem size")
    mod.add_argument("--kernel", metavar="STEP", help="model this step in detail")
    mod.add_argument("--config", action="append", metavar="K=V", help="the step's template parameters")
    mod.add_argument("--clock", type=parse_clock, metavar="MHZ",
                     help="SM clock for the speed of light (default: the profile's sustained 1320 MHz)")
    mod.add_argument("--dtype", choices=("bf16", "fp16", "fp8", "tf32", "fp32"),
                     help="the problem's data type (default: the step's, else bf16)")
    mod.add_argument("--profile", choices=("H200",), help="use this device profile even when a GPU is visible")
    mod.add_argument("--groups", type=bounded_int(1, 512), metavar="G",
                     help="a grouped GEMM (mixture of experts) of G experts: --shape is T,N,K (tokens x top-k "
                     "rows, each expert's N x K weight), or C,N,K with --layout masked; shows the plan "
                     "gemmlab.grouped_mm runs")
    mod.add_argument("--layout", choices=("contiguous", "masked"), help="with --groups: rows sorted by expert "
                     "with offsets (default), or fixed-capacity slabs with counts")

    exp = command(
        "explain", "what limits a step at a shape: the model's factors, and a measurement on a GPU",
        "Why a step is as fast as it is on a shape: the model's time as factors over the speed of light "
        "(compute efficiency, tile quantization, memory, waves; their product is predicted / ideal time), the "
        "dominant one with its numbers, what the model does not price in (spills, failed SASS claims, narrow "
        "loads, low occupancy, an unsupported shape), and on a GPU the measurement against cuBLAS. The same "
        "answer as the MCP tool explain_gap.", epilog="examples:\n  gemmlab explain k05 --shape 4096\n"
        "  gemmlab explain h04 --shape 4096,4352,4096", parents=(common, as_json))
    exp.add_argument("kernel", metavar="KERNEL", help="a step: k05, h04, ...")
    exp.add_argument("--shape", type=parse_shape, required=True, metavar="M,N,K", help="problem size")
    exp.add_argument("--config", action="append", metavar="K=V", help="the step's parameters (default: what it "
                     "picks for the shape)")
    exp.add_argument("--clock", type=parse_clock, metavar="MHZ", help="SM clock for the model (default: the "
                     "measured one on a GPU, else the profile's sustained clock)")
    exp.add_argument("--no-time", action="store_true", help="on a GPU, do not measure")

    suites_help = ", ".join(MATMUL_SUITES)
    ben = command(
        "bench", "time steps against cuBLAS on a GPU; JSON-line records",
        "Time ladder steps against cuBLAS with the project's one timer (rotating inputs over 2x L2, CUDA-graph "
        "replays, candidates interleaved, correctness checked first, SM clock recorded), or gemmlab.matmul "
        "against torch on a matmul suite. Appends JSON lines (one per step, config and shape, with the model's "
        "prediction; one per case for matmul suites) to --out, prints a line per record as it arrives, then a "
        "table (TFLOP/s, ratio to cuBLAS, % of speed of light at the recorded clock, GB/s, model) and draws "
        "plots. Needs a GPU; exits with status 3 without one."
        "\n\n"
        "Each job is one interleaved run of every (step, config) at one shape. A step with a shape heuristic "
        "(h10, h11, h12, k10) runs the config it picks for each shape (as gemmlab.matmul would), the others "
        "their defaults; --config overrides parameters of that config for the named steps; --configs adds "
        "variants to the same run, each tried by every step that has its parameters and offers its values "
        "(the rest skip it).",
        epilog="suites (--suite):\n"
               "  ladder            every step of both ladders at 4096^3 (the default)\n"
               "  square            1024..8192 cubes for the last step of each ladder (or --steps)\n"
               "  matmul-NAME       gemmlab.matmul against torch on a gemmlab.matmul_suites suite:\n"
               f"                    {suites_help}; records labelled NAME,\n"
               "                    appended to $GEMMLAB_OUT_DIR/results/matmul.jsonl (or --out)\n"
               "  matmul-eager      eager calls, no graphs: host and wall time per call of gemmlab.matmul\n"
               "                    against torch.mm (bf16 and fp16), and a 7B layer's 32 projections\n"
               "                    through gemmlab.linear against F.linear (results/eager.jsonl)\n"
               "  --shape/--shapes/--sizes replace a suite's shapes; without --suite they mean every step\n"
               "  (or --steps) at those shapes, labelled 'explicit'\n\n"
               "examples:\n"
               "  gemmlab bench --suite ladder --ladder hopper --sizes 4096,8192 --rounds 10\n"
               "  gemmlab bench --steps h10 --sizes 2048,3072,4096 --suite-name sweep --out sweep.jsonl\n"
               "  gemmlab bench --ladder sgemm --shapes '4095,4097,1023' --sizes 4096 \\\n"
               "                --configs 'WM=32,WN=64;BK=8,WM=32,WN=64;BK=8'\n"
               "  gemmlab bench --shape 4096,4096,4096 --steps h10 --config BN=128\n"
               "  gemmlab bench --suite matmul-llm --rounds 5", parents=(common, as_json))
    ben.add_argument("--suite", choices=("ladder", "square", *(MATMUL_PREFIX + n for n in MATMUL_SUITES)),
                     metavar="SUITE", help="which suite: ladder, square or matmul-NAME (see below; default: "
                     "ladder, or 'explicit' with --shape/--shapes/--sizes)")
    ben.add_argument("--ladder", choices=LADDERS, help="only the steps of this ladder")
    ben.add_argument("--steps", "--kernel", dest="kernel", action="append", metavar="STEP[,STEP...]",
                     help="only these steps (comma-separated or repeated; --kernel is the same option)")
    ben.add_argument("--shape", type=parse_shape, metavar="M,N,K", help="one explicit shape")
    ben.add_argument("--shapes", type=parse_shapes, metavar="M,N,K;M,N,K", help="explicit shapes")
    ben.add_argument("--sizes", type=parse_sizes, metavar="N,N,...", help="square sizes (after --shapes)")
    ben.add_argument("--config", action="append", metavar="K=V",
                     help="parameters of the named steps, over their default or heuristic config")
    ben.add_argument("--configs", type=parse_configs, metavar="K=V,K=V;K=V",
                     help="more configs in the same run, ';'-separated, each over every step's base config; "
                          "skipped where a step lacks a parameter or value")
    ben.add_argument("--rounds", type=bounded_int(1, 1000), default=15, help="timing rounds (median reported)")
    ben.add_argument("--suite-name", metavar="LABEL", help="the records' 'suite' field (default: the suite's "
                     "name; NAME for matmul-NAME)")
    ben.add_argument("--out", metavar="RECORDS.jsonl", help="append records here (default: "
                     "$GEMMLAB_OUT_DIR/results/<label>.jsonl; .../results/matmul.jsonl for matmul suites)")
    ben.add_argument("--plots", metavar="DIR", help="plots go here (default: $GEMMLAB_OUT_DIR/plots/<label>)")
    ben.add_argument("--no-plots", action="store_true", help="draw no plots (matmul suites never do)")

    plo = command(
        "plot", "table and plots from benchmark records (no GPU needed)",
        "Read JSON-line benchmark records, print the table (TFLOP/s, ratio to the baseline, % of speed of light "
        "at each record's SM clock, the model's prediction at that clock and measured/model) and draw the ladder "
        "plot (TFLOP/s per step, the baseline as a line, the model as markers), the ratio to the baseline against "
        "size, and the roofline with the measured points. Lines without a shape or a name are left out, and "
        "counted.", epilog="examples:\n  gemmlab plot benchmarks/results/hopper_ladder.jsonl --out plots\n"
        "  gemmlab plot benchmarks/results/matmul.jsonl --no-plots", parents=(common, as_json))
    plo.add_argument("records", nargs="+", metavar="RECORDS.jsonl",
                     help="benchmark records (JSON lines; gzipped .jsonl.gz too)")
    plo.add_argument("--out", metavar="DIR", help="output folder (default: $GEMMLAB_OUT_DIR/plots)")
    plo.add_argument("--format", nargs="+", default=["png", "svg"], choices=("png", "svg", "pdf"),
                     help="file formats (default: png svg)")
    plo.add_argument("--no-plots", action="store_true", help="only the table")
    plo.add_argument("--no-model", action="store_true",
                     help="do not add the model's prediction to records that lack one")

    fig = command(
        "figures", "the subject's figures (swizzle, tile order, roofline...)",
        "Draw the figures of the subject from the same functions the kernels and models use: "
        + ", ".join(FIGURE_NAMES) + ". Each is written as OUT/<name>.png (--format adds svg or pdf), with "
        "figures.json, the fingerprint of what each figure draws (a test checks the committed ones are current).")
    fig.add_argument("out", metavar="OUT", help="output folder")
    fig.add_argument("--only", nargs="+", choices=FIGURE_NAMES, metavar="NAME", help="only these figures")
    fig.add_argument("--format", nargs="+", default=["png"], choices=("png", "svg", "pdf"),
                     help="file formats (default: png)")

    tun = command(
        "tune", "autotune a step's config for a shape on this GPU; saved per GPU",
        "Time a step's configs at one shape with the project's one timer (groups of candidates per interleaved "
        "run with cuBLAS, correctness checked first, the best few re-timed together), print every candidate and "
        "save the fastest correct one for this GPU under the cache folder (GEMMLAB_CACHE_DIR/autotune). From "
        "then on KernelSpec.config_for (the benchmarks, gemmlab.matmul's fp32 path) picks it for that step and "
        "shape on this GPU; h11's config is the Hopper engine's plan (BN, SPLITS), which gemmlab.matmul then "
        "runs for bf16/fp16 at that shape. Candidates: the step's own choice (heuristic or defaults) plus an even "
        "spread over its valid configs, or --configs. Needs a GPU (exits with status 3 without one); --show "
        "lists the saved results, without a GPU those of every GPU.",
        epilog="examples:\n  gemmlab tune k08 --shape 4096,4096,4096\n"
               "  gemmlab tune h10 --shape 3072,3072,3072 --max-configs 16 --rounds 7\n"
               "  gemmlab tune h11 --shape 200,1024,4096   (the plan gemmlab.matmul runs at that shape)\n"
               "  gemmlab tune k10 --shape 4095,4097,1023 --configs 'WM=32,WN=64;BK=8'\n"
               "  gemmlab tune --show\n  gemmlab tune k08 --show", parents=(common, as_json))
    tun.add_argument("kernel", nargs="?", metavar="KERNEL", help="step name: k08, h10, sgemm.k10_double_buffered, ...")
    tun.add_argument("--shape", type=parse_shape, metavar="M,N,K", help="the problem to tune for")
    tun.add_argument("--max-configs", type=bounded_int(1, 100000), default=32, metavar="N",
                     help="at most this many candidates")
    tun.add_argument("--rounds", type=bounded_int(1, 1000), default=5, help="timing rounds per call (median per "
                     "candidate)")
    tun.add_argument("--configs", type=parse_configs, metavar="K=V,K=V;K=V",
                     help="time these configs (each over the defaults) instead of a spread over the step's space")
    tun.add_argument("--budget", type=positive_float, metavar="SECONDS",
                     help="start no new group of candidates after this")
    tun.add_argument("--show", action="store_true", help="list the saved results (KERNEL: only that step's)")

    mcp = command(
        "mcp", "serve the tools to coding agents over MCP (stdio or HTTP)",
        "Run gemmlab's MCP server (the [mcp] extra) for agents in VS Code, Cursor or Claude Desktop: "
        "list_kernels, inspect_kernel, inspect_plan, model_gemm, model_grouped_gemm, explain_gap and benchmark_gemm "
        "(GPU), plus the gemmlab://brief "
        "and gemmlab://ladders resources. Speaks stdio by default (what editors launch: the editor starts this "
        "command itself); --http serves streamable HTTP at http://HOST:PORT/mcp, bound to 127.0.0.1 unless "
        "--host says otherwise. Ctrl-C stops it. See docs/mcp.md.")
    mcp.add_argument("--http", action="store_true", help="serve streamable HTTP instead of stdio")
    mcp.add_argument("--host", default="127.0.0.1", help="with --http: the address to bind")
    mcp.add_argument("--port", type=bounded_int(1, 65535), default=8000, help="with --http: the port")
    return p
