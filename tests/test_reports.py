"""gemmlab.reports: the one layer the command and the MCP server read. Names, checks, records, and that the
reports carry what both faces show."""

import dataclasses
import json
import math

import pytest

from gemmlab import registry
from gemmlab.reports import (BadRequest, MAX_DIM, as_dict, check_clock, check_dims, compiled, modelling, records,
                             resolve_step_name, step_names)


def test_step_names_read_from_the_files_are_the_registrys():
    assert list(step_names()) == sorted(s.name for s in registry.all_kernels())


@pytest.mark.parametrize("bad", ["", "k", "k0", "k99", "h13", "sgemm.h04", "hoppers", "k05_blocked"])
def test_unknown_names_are_refused_with_the_known_ones(bad):
    with pytest.raises(BadRequest, match="no kernel named") as e:
        resolve_step_name(bad)
    assert "sgemm.k01_naive" in str(e.value)


def test_bounds():
    check_dims(1, MAX_DIM, 7)
    for dims in ((0, 1, 1), (1, MAX_DIM + 1, 1), (1.5, 2, 2)):
        with pytest.raises(BadRequest, match="each must be an integer"):
            check_dims(*dims)
    check_clock(None)
    check_clock(1320)
    for clock in (0, -1, 99.9, 3000.1, math.nan, math.inf):
        with pytest.raises(BadRequest, match="SM clock"):
            check_clock(clock)


def test_model_report_matches_a_hand_computation():
    res = modelling.model_report(4096, 4096, 4096, kernel="h04", clock_mhz=1320, profile="H200")
    p, k = res.problem, res.kernel
    assert p.flops == 2 * 4096**3 and p.dtype == "bf16"
    assert p.speed_of_light_tflops == pytest.approx(132 * 4096 * 1320e6 / 1e12)
    assert k.waves.tiles == 512 and k.waves.slots == 132 and k.config_source == "defaults"
    assert res.steps is None
    every = modelling.model_report(64, 64, 64, profile="H200", every=True).steps
    assert [s.kernel for s in every] == [s.name for s in registry.all_kernels()]
    assert any(not s.supported and s.predicted_tflops is None for s in every)  # h-steps cannot run 64^3


def test_model_report_says_what_matmul_runs():
    """ModelResult.matmul is gemmlab.plan's route at the shape (bf16 / fp16 / fp32 problems), laid out."""
    import torch

    import gemmlab

    from gemmlab import engine

    for (M, N, K), kernel in (((4096, 4096, 4096), None), ((8, 4096, 4096), "decode"), ((2040, 3584, 3584), None)):
        m = modelling.model_report(M, N, K, profile="H200").matmul
        r = engine.plan(M, N, K, dtype=torch.bfloat16, sm_count=132)
        assert m.kernel == r.kernel and m.how == r.how and m.summary == repr(r)
        assert m.tile == [r.plan.bm, r.plan.bn] and m.schedule == r.plan.schedule and m.stages == r.plan.stages
        assert m.predicted_us == pytest.approx(r.plan.predicted_s * 1e6)
        assert kernel is None or m.kernel == kernel
    dec = modelling.model_report(8, 4096, 4096, profile="H200").matmul
    assert dec.decode_priced_us is not None and dec.decode_priced_us <= dec.engine_priced_us
    fp16 = modelling.model_report(4096, 4096, 4096, dtype="fp16", profile="H200").matmul
    assert fp16 is not None and "bf16" not in fp16.summary
    assert modelling.model_report(4096, 4096, 4096, dtype="fp8", profile="H200").matmul is None
    fp32 = modelling.model_report(1024, 1024, 1024, kernel="k05", profile="H200").matmul  # an fp32 step's model
    route = gemmlab.plan(1024, 1024, 1024, dtype=torch.float32, sm_count=132)
    cfg = dict(route.config)
    assert (fp32.kernel, fp32.summary, fp32.tile) == ("sgemm", repr(route), [cfg["BM"], cfg["BN"]])
    assert "k10_double_buffered" in fp32.summary and fp32.predicted_us is None
    documented = {f.name for f in dataclasses.fields(modelling.MatmulPlan) if f.metadata.get("doc")}
    assert {"kernel", "how", "tile", "predicted_us", "summary"} <= documented


def test_every_field_of_a_report_is_json_and_described():
    res = modelling.model_report(1024, 1024, 1024, kernel="k05", profile="H200")
    data = json.loads(json.dumps(as_dict(res)))
    assert data["kernel"]["occupancy"]["blocks_per_sm"] >= 1
    documented = {f.name for f in dataclasses.fields(modelling.KernelModel) if f.metadata.get("doc")}
    assert {"config_source", "tile", "gpu_blocks_per_sm", "tile_quantization"} <= documented


def test_inspect_report_lists_the_features_of_a_hopper_step():
    r = compiled.inspect_step("h08", listing="main_loop", max_lines=5)
    assert {"TMA load", "TMA store", "STSM", "mbarrier"} <= set(r.features)
    assert any(f.startswith("HGMMA 64x256x16") for f in r.features)
    assert r.listing.kind == "main_loop" and len(r.listing.lines) == 5 and r.listing.truncated


def test_diff_rows():
    a, _, _ = compiled.step_report("k05")
    b, _, _ = compiled.step_report("k06")
    d = compiled.diff_result(a, b)
    widths = {row.what: row for row in d.rows}
    assert widths["global_load 128-bit"].a == "0" and int(widths["global_load 128-bit"].b) > 0
    assert widths["global_load 128-bit"].change.startswith("+")
    assert any(op.startswith("LDG.E.128") for op in d.opcodes_added)


def test_ladder_rows_say_what_each_step_introduces():
    import gemmlab.model as model

    specs = registry.all_kernels("sgemm")[4:6]  # k05, k06
    rows = compiled.ladder_rows(specs, (4096, 4096, 4096), model.H200, 1320.0)
    k05, k06 = rows
    assert k05.sass_claims_failed == [] and k06.sass_claims_failed == []
    assert {"LDG.128", "STG.128", "STS.128"} <= set(k06.sass_new)
    assert "FFMA" not in k06.sass_new  # k05 had it already
    assert k06.model_tflops > k05.model_tflops > 0
    compiled.attach_measurements(rows, [dict(kernel=k06.kernel, tflops=34.0, ratio=0.66, rel_error=1e-6,
                                             model_tflops=30.0)])
    assert (k06.tflops, k06.ratio_vs_cublas, k06.model_tflops) == (34.0, 0.66, 30.0) and k05.tflops is None


def test_normalize_fills_what_other_record_files_lack():
    rec, why = records.normalize({"M": 64, "N": 64, "K": 64, "config": "BN=128,splits=1", "time_ms": 0.001,
                                  "baseline_ms": 0.002, "dtype": "bfloat16"})
    assert why is None and rec["label"] == "BN=128,splits=1" and rec["dtype"] == "bf16"
    assert rec["tflops"] == pytest.approx(2 * 64**3 / 1e-6 / 1e12) and rec["ratio"] == pytest.approx(2.0)
    assert records.normalize({"N": 1, "K": 1, "kernel": "x"}) == (None, "no M, N, K")
    assert records.normalize({"M": 1, "N": 1, "K": 1}) == (None, "no kernel, case or config to name it by")


def test_normalize_keeps_only_numbers_where_numbers_are_read():
    rec, _ = records.normalize({"M": 8, "N": 8, "K": 8, "kernel": "x", "tflops": "fast", "ratio": "1.2x",
                                "sm_clock_mhz": None, "sm_count": "many", "rel_error": [1], "model_tflops": -3.0,
                                "time_ms": float("nan")})
    assert [rec[k] for k in ("tflops", "ratio", "sm_clock_mhz", "sm_count", "rel_error", "model_tflops")] == [None] * 6
    (row,) = records.record_rows([rec])
    assert row.tflops is None and row.gbps is None


def test_read_records_counts_what_it_leaves_out(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"M": 8, "N": 8, "K": 8, "kernel": "sgemm.k01_naive", "tflops": 1.0}\n'
                    '{"M": 8}\n\n{"M": 8}\n')
    recs, notes = records.read_records([path])
    assert len(recs) == 1 and notes == [f"{path}: left out 2 line(s) with no M, N, K"]
    (row,) = records.record_rows(recs)
    assert row.kernel == "k01_naive" and row.shape == "8x8x8" and row.tflops == 1.0



def test_records_read_from_gzip_members_and_by_the_plain_name(tmp_path):
    """A record file kept as X.jsonl.gz, each run appended as one more gzip member, reads as the plain file
    did, also when asked for by its old name X.jsonl; a damaged one is refused with its name."""
    import gzip

    from gemmlab.bench import load_records

    runs = [[{"M": 8, "N": 8, "K": 8, "kernel": "sgemm.k01_naive", "tflops": float(i + j)} for j in range(3)]
            for i in range(2)]
    plain = tmp_path / "r.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for run in runs for r in run))
    gz = tmp_path / "kept.jsonl.gz"
    gz.write_bytes(b"".join(gzip.compress("".join(json.dumps(r) + "\n" for r in run).encode()) for run in runs))
    assert load_records(gz) == load_records(tmp_path / "kept.jsonl") == load_records(plain) == runs[0] + runs[1]
    assert records.read_records([tmp_path / "kept.jsonl"]) == records.read_records([plain])
    (tmp_path / "bad.jsonl.gz").write_bytes(gz.read_bytes()[:-9])
    with pytest.raises(BadRequest, match="bad.jsonl.gz: cannot read it"):
        records.read_records([tmp_path / "bad.jsonl.gz"])

def test_bench_caps():
    records.check_bench_size(4096, 4096, 4096, 2)
    with pytest.raises(BadRequest, match="benchmark cap 2\\^36"):
        records.check_bench_size(8192, 8192, 8192, 2)
    with pytest.raises(BadRequest, match="GiB"):
        records.check_bench_size(131072, 131072, 1, 2)
