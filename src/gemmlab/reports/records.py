"""Benchmark records as reports: read back and checked, the model added, laid out as table rows; and one
measurement on a GPU (a step or ``gemmlab.matmul`` against cuBLAS with the one timer).

Records are the JSON lines ``gemmlab bench`` (``gemmlab.bench``) writes. The project keeps other JSON-line
files too (engine policies, decode variants); ``read_records`` takes what it can use from any of them (a
shape and a time) and says how many lines it left out and why, so a table or plot never dies on a field
that one kind of file lacks.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from pathlib import Path

from ..record_files import read_record_text
from . import BadRequest, doc, step_names

MAX_BENCH_VOLUME = 2**36  # M * N * K one measurement may time (4096^3 is 2^36)
MAX_BENCH_SET_BYTES = 2 * 2**30  # A + B + C of one input set

# torch's dtype names (gemmlab.matmul records) -> the model's
DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32",
               "float8_e4m3fn": "fp8", "bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp8": "fp8", "tf32": "tf32"}


@dataclass
class Measurement:
    kernel: str
    config: dict[str, int] | None
    M: int
    N: int
    K: int
    dtype: str
    layout: str
    gpu: str
    sm_count: int
    sm_clock_mhz: float | None
    correct: bool
    rel_error: float | None = doc("||out - ref|| / ||ref||; None when the output held NaN or Inf")
    time_ms: float | None
    tflops: float | None
    cublas_time_ms: float
    cublas_tflops: float
    ratio_vs_cublas: float | None = doc("> 1: faster than cuBLAS")
    spread: float | None = doc("(max - min) / median over the rounds")
    model_tflops: float | None = doc("the model at the recorded clock")
    sol_tflops: float | None
    rounds: int
    git_sha: str


@dataclass
class RecordRow:
    kernel: str = doc("the step's short name, or the record's case or config")
    shape: str
    tflops: float | None = doc("None: not timed (the result was wrong)")
    baseline_tflops: float | None
    ratio: float | None = doc("baseline time / this time: > 1 is faster")
    sol_fraction: float | None = doc("of the speed of light at the record's SM clock")
    gbps: float | None = doc("minimum bytes / time")
    model_tflops: float | None
    measured_over_model: float | None
    sm_clock_mhz: float | None
    rel_error: float | None
    correct: bool


# Reading --------------------------------------------------------------------------------------------------------

def _label(raw: dict) -> str | None:
    for key in ("case", "kernel", "config", "suite"):
        v = raw.get(key)
        if isinstance(v, str) and v:
            return v
    return None


def _positive(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 \
        else None


def normalize(raw: dict) -> tuple[dict | None, str | None]:
    """A record in the form the tables and plots read, or ``(None, why)`` when it has no shape or no
    label (``label``: its case, kernel or config, in that order of preference). Fills ``tflops`` / ``baseline_tflops`` from ``time_ms`` / ``baseline_ms`` where only those are
    given and spells the dtype the model's way (``bfloat16`` -> ``bf16``)."""
    try:
        M, N, K = (int(raw[k]) for k in ("M", "N", "K"))
    except (KeyError, TypeError, ValueError):
        return None, "no M, N, K"
    if min(M, N, K) < 1:
        return None, "M, N, K not positive"
    label = _label(raw)
    if label is None:
        return None, "no kernel, case or config to name it by"
    fl = 2.0 * M * N * K
    rec = dict(raw, label=label, kernel=raw.get("kernel") or label, M=M, N=N, K=K,
               dtype=DTYPE_NAMES.get(str(raw.get("dtype", "bf16")), "bf16"))
    rec.setdefault("ladder", raw.get("suite") or "records")
    # Every number a table or plot reads is a positive finite number or None, whatever the file holds.
    for key in ("time_ms", "baseline_ms", "ratio", "sm_clock_mhz", "model_tflops", "sol_tflops", "gbps"):
        rec[key] = _positive(raw.get(key))
    rec["sm_count"] = int(raw["sm_count"]) if _positive(raw.get("sm_count")) else None
    err = raw.get("rel_error")
    rec["rel_error"] = float(err) if isinstance(err, (int, float)) and not isinstance(err, bool) else None
    for tf, ms in (("tflops", "time_ms"), ("baseline_tflops", "baseline_ms")):
        value = _positive(raw.get(tf))
        if value is None and rec[ms] is not None:
            value = fl / rec[ms] / 1e9
        rec[tf] = value
    if rec["ratio"] is None and rec["tflops"] and rec["baseline_tflops"]:
        rec["ratio"] = rec["tflops"] / rec["baseline_tflops"]
    return rec, None


def read_records(paths, *, what: str = "gemmlab plot") -> tuple[list[dict], list[str]]:
    """The records of JSON-line files (plain or gzip: ``record_files.read_record_text``), normalized, and notes on
    the lines left out (one note per file). Raises ``BadRequest`` for a file that cannot be read, a line that
    is not JSON, or files with no usable record at all; the message names the file and line."""
    records, notes = [], []
    for path in map(Path, paths):
        try:
            text = read_record_text(path)
        except UnicodeDecodeError:
            raise BadRequest(f"{path}: not a text file; {what} reads JSON-line benchmark records") from None
        except (OSError, EOFError, zlib.error) as e:  # EOFError, zlib.error: a damaged .gz
            raise BadRequest(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
        skipped: dict[str, int] = {}
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                raw = json.loads(line)
            except ValueError as e:
                raise BadRequest(f"{path}:{n}: not a JSON line ({e.args[0].split(':')[0]}); {what} reads the "
                                 "JSON-line records gemmlab bench writes") from None
            rec, why = normalize(raw) if isinstance(raw, dict) else (None, "not a JSON object")
            if rec is None:
                skipped[why] = skipped.get(why, 0) + 1
            else:
                records.append(rec)
        if skipped:
            notes.append(f"{path}: left out " + ", ".join(f"{n} line(s) with {why}" for why, n in skipped.items()))
    if not records:
        raise BadRequest(f"no benchmark records in {', '.join(map(str, paths))}"
                         + (f" ({'; '.join(notes)})" if notes else "")
                         + "; each record needs M, N, K and a kernel, case or config (gemmlab bench writes them)")
    return records, notes


# The model and the rows --------------------------------------------------------------------------------------------

def _profile(sm_count=None):
    import dataclasses

    from .. import model

    prof = model.device_profile()
    return dataclasses.replace(prof, sm_count=int(sm_count)) if sm_count else prof


def add_model(rec: dict) -> dict:
    """Add the model's prediction and the speed of light at the record's SM clock to a record of a registered
    step (others are returned as they are: there is nothing to predict)."""
    from .. import model, registry

    try:
        spec = registry.get(rec["kernel"])
    except KeyError:
        return rec
    prof = _profile(rec.get("sm_count"))
    clock = rec.get("sm_clock_mhz") or prof.sm_clock_mhz
    try:
        p = model.predict_step(spec, rec["M"], rec["N"], rec["K"], rec.get("config"), profile=prof, clock_mhz=clock)
    except Exception:  # noqa: BLE001 - a record of a config that no longer resolves: no prediction
        return rec
    rec.update(model_tflops=p.tflops, model_time_ms=p.time_s * 1e3, model_clock_mhz=clock,
               sol_tflops=prof.peak_flops(DTYPE_NAMES.get(rec.get("dtype", "bf16"), "bf16"), clock) / 1e12)
    return rec


def short_label(rec: dict) -> str:
    """What a table or plot calls a record: a step's short name (``k05_blocktile_2d``), else its label."""
    label = str(rec.get("label") or rec["kernel"])
    return label.split(".", 1)[1] if label in step_names() else label


def record_rows(records: list[dict]) -> list[RecordRow]:
    """One row per record: TFLOP/s, the baseline, the ratio, % of the speed of light at its clock, GB/s, the
    model and measured/model."""
    from .. import model

    rows = []
    for r in records:
        M, N, K = r["M"], r["N"], r["K"]
        dtype = DTYPE_NAMES.get(str(r.get("dtype", "bf16")), "bf16")
        tf = r.get("tflops")
        sol = r.get("sol_tflops")
        if sol is None and r.get("sm_clock_mhz"):
            sol = _profile(r.get("sm_count")).peak_flops(dtype, r["sm_clock_mhz"]) / 1e12
        time_ms = r.get("time_ms") or (2.0 * M * N * K / tf / 1e9 if tf else None)
        mt = r.get("model_tflops")
        err = r.get("rel_error")
        rows.append(RecordRow(
            kernel=short_label(r),
            shape=f"{M}x{N}x{K}", tflops=tf, baseline_tflops=r.get("baseline_tflops"), ratio=r.get("ratio"),
            sol_fraction=tf / sol if tf and sol else None,
            gbps=model.min_bytes(M, N, K, dtype) / (time_ms * 1e-3) / 1e9 if time_ms else None,
            model_tflops=mt, measured_over_model=tf / mt if tf and mt else None,
            sm_clock_mhz=r.get("sm_clock_mhz") or r.get("sm_mhz"),
            rel_error=err if isinstance(err, (int, float)) else None, correct=bool(r.get("correct", tf is not None))))
    return rows


# Measuring (GPU) ------------------------------------------------------------------------------------------------

def check_bench_size(M: int, N: int, K: int, elem_bytes: int) -> None:
    """The caps on one measurement: M*N*K <= 2^36 and 2 GiB of operands."""
    if M * N * K > MAX_BENCH_VOLUME:
        raise BadRequest(f"M*N*K = {M * N * K} is above the benchmark cap 2^36 ({MAX_BENCH_VOLUME}, e.g. 4096^3); "
                         "the model has no such cap")
    set_bytes = elem_bytes * (M * K + N * K + M * N)
    if set_bytes > MAX_BENCH_SET_BYTES:
        raise BadRequest(f"A, B and C take {set_bytes / 2**30:.1f} GiB; the benchmark cap is "
                         f"{MAX_BENCH_SET_BYTES / 2**30:.0f} GiB")


def measurement(rec: dict, name: str, cfg, rounds: int, model_tflops=None, sol_tflops=None) -> Measurement:
    """A ``gemmlab.bench`` record as a ``Measurement`` (no time where the result was wrong)."""
    err = rec.get("rel_error")
    ok = bool(rec.get("correct"))
    return Measurement(kernel=name, config=cfg, M=rec["M"], N=rec["N"], K=rec["K"],
                       dtype=DTYPE_NAMES.get(str(rec["dtype"]), str(rec["dtype"])), layout=rec["layout"],
                       gpu=rec["gpu"], sm_count=rec["sm_count"], sm_clock_mhz=rec.get("sm_clock_mhz"), correct=ok,
                       rel_error=err if isinstance(err, float) and math.isfinite(err) else None,
                       time_ms=rec.get("time_ms") if ok else None, tflops=rec.get("tflops") if ok else None,
                       cublas_time_ms=rec["baseline_ms"], cublas_tflops=rec["baseline_tflops"],
                       ratio_vs_cublas=rec.get("ratio") if ok else None, spread=rec.get("spread") if ok else None,
                       model_tflops=model_tflops, sol_tflops=sol_tflops, rounds=rounds,
                       git_sha=rec.get("git_sha", "unknown"))


def measure_step(spec, cfg: dict, M: int, N: int, K: int, rounds: int, replay_ms: float) -> Measurement:
    """A registered step against cuBLAS on one shape (``gemmlab.bench.bench_shape``), with the model at the
    recorded clock."""
    from .. import model
    from ..bench import bench_shape

    rec = bench_shape(spec.ladder, M, N, K, [(spec, cfg)], suite="mcp", rounds=rounds, replay_ms=replay_ms)[0]
    pred = sol = None
    if rec.get("sm_clock_mhz"):
        prof = _profile(rec["sm_count"])
        pred = model.predict_step(spec, M, N, K, cfg, profile=prof, clock_mhz=rec["sm_clock_mhz"]).tflops
        sol = prof.peak_flops(rec["dtype"], rec["sm_clock_mhz"]) / 1e12
    return measurement(rec, spec.name, cfg, rounds, pred, sol)


def measure_matmul(M: int, N: int, K: int, dtype: str, rounds: int, replay_ms: float) -> Measurement:
    """``gemmlab.matmul(x, w.t())`` against ``torch.mm`` on TN operands (``gemmlab.bench.bench_matmul``)."""
    import torch

    from ..bench import bench_matmul

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    rec = bench_matmul(M, N, K, layout="TN", dtype=dt, suite="mcp", rounds=rounds, replay_ms=replay_ms)
    return measurement(rec, "gemmlab.matmul", None, rounds)
