"""The MCP server (gemmlab.mcp) through the SDK's in-process client: every tool, resource and prompt,
error paths and hostile input, and that the server keeps answering after each error. Runs without a GPU."""

import json
import sys

import pytest

pytest.importorskip("mcp")

import anyio  # noqa: E402  (after the importorskip: anyio comes with mcp)
import torch  # noqa: E402
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.shared.exceptions import MCPError  # noqa: E402

from gemmlab import reports  # noqa: E402
from gemmlab.mcp import safety, server  # noqa: E402

SERVER = server.build_server()
TOOLS = ("list_kernels", "inspect_kernel", "inspect_plan", "model_gemm", "model_grouped_gemm", "benchmark_gemm",
         "explain_gap")
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU answers")

SCALE = """#include "common/ptx.cuh"
#include <cuda_bf16.h>
template <int N> __global__ void scale(float* __restrict__ x) {
#pragma unroll
    for (int i = 0; i < N; ++i) x[threadIdx.x + i * 32] *= 2.0f;
}
"""


def session(*calls):
    """Run (tool, arguments) calls in one client session; after each one, check the server still answers."""

    async def go():
        out = []
        async with Client(SERVER) as c:
            for name, args in calls:
                out.append(await c.call_tool(name, args))
                await c.list_tools()
                alive = await c.call_tool("list_kernels", {"ladder": "sgemm"})
                assert not alive.is_error
        return out

    return anyio.run(go)


def call(name, args):
    return session((name, args))[0]


def text(result) -> str:
    return result.content[0].text


def error_text(name, args) -> str:
    r = call(name, args)
    assert r.is_error, f"{name}({args}) should fail"
    return text(r)


# Listing ------------------------------------------------------------------------------------------------------

def test_lists_the_tools_with_typed_schemas_and_docstrings():
    async def go():
        async with Client(SERVER) as c:
            return (await c.list_tools()).tools

    tools = {t.name: t for t in anyio.run(go)}
    assert set(TOOLS) <= set(tools)
    for t in tools.values():
        assert len(t.description) > 200, t.name
        assert t.input_schema["type"] == "object"
        assert t.output_schema and t.output_schema["type"] == "object"
        assert t.annotations.read_only_hint is True
    m = tools["model_gemm"].input_schema
    assert m["properties"]["M"]["maximum"] == reports.MAX_DIM and m["properties"]["M"]["minimum"] == 1
    assert set(m["required"]) == {"M", "N", "K"}
    src = json.dumps(tools["inspect_kernel"].input_schema)
    assert "sm_90a" in src and "65536" in src and "pattern" in src


def test_list_kernels_is_the_registry():
    from gemmlab import registry

    r = call("list_kernels", {})
    assert not r.is_error
    data = r.structured_content
    assert [k["name"] for k in data["kernels"]] == [s.name for s in registry.all_kernels()]
    assert {lad["name"] for lad in data["ladders"]} == set(registry.ladders())
    h04 = next(k for k in data["kernels"] if k["short"].startswith("h04"))
    assert h04["params"] and h04["params"][0]["choices"]
    assert any("HGMMA" in e for e in h04["sass_expectations"])
    only = call("list_kernels", {"ladder": "sgemm"}).structured_content
    assert only["kernels"] and all(k["ladder"] == "sgemm" for k in only["kernels"])


# Inspecting -----------------------------------------------------------------------------------------------------

def test_inspect_a_step_summarizes_and_caps_the_listing():
    r = call("inspect_kernel", {"kernel": "k06", "max_lines": 10})
    assert not r.is_error, text(r)
    d = r.structured_content
    assert d["registers"] > 0 and d["threads_per_block"] == 256 and d["occupancy"]["blocks_per_sm"] >= 1
    mix = {m["cls"]: m for m in d["mix"]}
    assert mix["global_load"]["widths_bits"]["128"] > 0  # LDG.E.128: the point of k06
    assert mix["shared_load"]["widths_bits"]["128"] > 0
    assert any(lp["ffma"] >= 512 for lp in d["loops"])
    assert d["sass_claims"] and d["sass_claims_failed"] == []
    lst = d["listing"]
    assert lst["kind"] == "main_loop" and len(lst["lines"]) == 10 and lst["truncated"] and lst["total_lines"] > 500
    assert lst["lines"][0].startswith("┌ loop")


def test_inspect_a_step_with_config_and_ptx():
    r = call("inspect_kernel", {"kernel": "sgemm.k03_smem_tiling", "listing": "ptx", "max_lines": 5})
    assert not r.is_error, text(r)
    d = r.structured_content
    assert d["listing"]["kind"] == "ptx" and len(d["listing"]["lines"]) == 5
    assert any(op.startswith("fma.rn.f32") for op in d["ptx_opcodes"])


def test_inspect_user_source_compiles_it_in_a_child_and_never_runs_it():
    r = call("inspect_kernel", {"source": SCALE, "name_expression": "scale<4>", "arch": "sm_90",
                                "threads_per_block": 128, "listing": "sass", "max_lines": 2000})
    assert not r.is_error, text(r)
    d = r.structured_content
    assert d["name"] == "source:scale<4>" and d["arch"] == "sm_90"
    assert d["occupancy"]["blocks_per_sm"] == 16  # 128 threads, few registers: the 2048-thread limit
    assert {m["cls"]: m["count"] for m in d["mix"]}["global_store"] == 4  # unrolled x4
    assert d["sass_claims_failed"] is None and not d["listing"]["truncated"]
    assert any("global_store.32" in ln for ln in d["listing"]["lines"])


def test_user_compile_errors_come_back_without_host_paths():
    msg = error_text("inspect_kernel", {"source": "__global__ void k(float* x) { x[0] = undefined_thing; }",
                                        "name_expression": "k"})
    assert "CompileError" in msg and "undefined_thing" in msg
    assert "src_" not in msg and "source.cu" in msg


def test_user_compile_is_bounded_in_time(monkeypatch):
    monkeypatch.setattr(safety, "USER_COMPILE_WALL_S", 0.01)
    msg = error_text("inspect_kernel", {"source": SCALE + "// slow\n", "name_expression": "scale<8>"})
    assert "longer than" in msg


# Modelling ------------------------------------------------------------------------------------------------------

def test_model_gemm_problem_only():
    d = call("model_gemm", {"M": 4096, "N": 4096, "K": 4096, "clock_mhz": 1320}).structured_content
    p = d["problem"]
    assert p["dtype"] == "bf16" and p["flops"] == pytest.approx(2 * 4096**3, rel=1e-4)
    assert p["speed_of_light_tflops"] == pytest.approx(713.7, rel=1e-3)  # 132 SMs x 4096 x 1320 MHz
    assert p["roofline_bound"] == "compute" and d["kernel"] is None
    m = d["matmul"]  # what gemmlab.matmul runs there
    assert m["kernel"] in ("engine", "h11", "decode") and m["summary"].startswith("Route(4096x4096x4096:")
    small = call("model_gemm", {"M": 1, "N": 8192, "K": 8192, "dtype": "bf16"}).structured_content
    assert small["problem"]["roofline_bound"] == "memory"  # decode: one row


def test_model_gemm_fp8_shows_scaled_mm_plans():
    """dtype fp8: the roofline at the FP8 peak and gemmlab.scaled_mm's plans, per-tensor and block scales
    (K a multiple of 128), each the planner's pick with its cheapest options."""
    from gemmlab import planner

    d = call("model_gemm", {"M": 4096, "N": 4096, "K": 4096, "dtype": "fp8", "clock_mhz": 1320}).structured_content
    assert d["problem"]["speed_of_light_tflops"] == pytest.approx(2 * 713.7, rel=1e-3) and d["matmul"] is None
    tensor, block = d["scaled_mm"]
    assert "'tensor'" in tensor["runs"] and "'block'" in block["runs"]
    pick = planner.plan_fp8(4096, 4096, 4096, scale="block")
    assert block["kernel"] == pick.compiled_name and block["tile"] == [pick.bm, pick.bn]
    assert block["predicted_us"] == pytest.approx(pick.predicted_s * 1e6, rel=1e-3)
    times = [c["predicted_us"] for c in block["candidates"]]
    assert times == sorted(times) and times[0] == pytest.approx(block["predicted_us"])
    assert len(call("model_gemm", {"M": 64, "N": 4096, "K": 4000, "dtype": "fp8"}).structured_content["scaled_mm"]) == 1


def test_model_grouped_gemm_and_its_errors():
    """The grouped problem on the roofline (every expert's weight counted once) and grouped_mm's plan."""
    from gemmlab import grouped

    d = call("model_grouped_gemm", {"groups": 8, "rows": 4096, "N": 4096, "K": 14336}).structured_content
    p = d["problem"]
    assert p["flops"] == pytest.approx(2 * 4096 * 4096 * 14336, rel=1e-4)
    assert p["min_bytes"] == 2 * (4096 * 14336 + 8 * 4096 * 14336) + 2 * 4096 * 4096
    pick = grouped.plan("contiguous", 8, 4096, 4096, 14336)
    assert d["plan"]["kernel"] == pick.compiled_name and d["plan"]["schedule"] == pick.schedule
    assert d["plan"]["runs"] == "gemmlab.grouped_mm" and "grouped.predict_s" in d["formula"]
    m = call("model_grouped_gemm", {"groups": 64, "rows": 128, "N": 2816, "K": 2048, "layout": "masked",
                                    "dtype": "fp8"}).structured_content
    assert m["problem"]["flops"] == pytest.approx(2 * 64 * 128 * 2816 * 2048, rel=1e-4)  # every slab full
    assert "gemm_grouped_fp8" in m["plan"]["kernel"] and m["plan"]["schedule"] == "data_parallel"
    error_text("model_grouped_gemm", {"groups": 0, "rows": 4096, "N": 64, "K": 64})  # at least one expert
    assert "layout" in error_text("model_grouped_gemm", {"groups": 8, "rows": 4096, "N": 64, "K": 64,
                                                         "layout": "ragged"})


def test_inspect_plan_compiles_what_the_call_would_run():
    """inspect_plan: the planned instantiation compiled (no GPU), its plan's SASS claims met, and the
    combinations that make no sense refused with a message."""
    from gemmlab import grouped, planner

    d = call("inspect_plan", {"kernel": "grouped", "M": 4096, "N": 28672, "K": 4096, "groups": 8,
                              "max_lines": 8}).structured_content
    assert grouped.plan("contiguous", 8, 4096, 28672, 4096).compiled_name in d["name"]
    assert d["sass_claims_failed"] == [] and d["sass_claims"] and d["spill_store_bytes"] == 0
    assert d["threads_per_block"] == 384 and d["listing"]["kind"] == "main_loop" and len(d["listing"]["lines"]) <= 8
    e = call("inspect_plan", {"kernel": "engine", "M": 2040, "N": 3584, "K": 3584, "listing": "none"})
    assert planner.plan(2040, 3584, 3584).compiled_name in e.structured_content["name"]
    f = call("inspect_plan", {"kernel": "fp8", "M": 4096, "N": 4096, "K": 4096, "scale": "block",
                              "listing": "none"}).structured_content
    assert "gemm_fp8" in f["name"] and f["sass_claims_failed"] == []
    assert "groups" in error_text("inspect_plan", {"kernel": "grouped", "M": 64, "N": 64, "K": 64})
    assert "groups" in error_text("inspect_plan", {"kernel": "engine", "M": 64, "N": 64, "K": 64, "groups": 2})
    assert "block" in error_text("inspect_plan", {"kernel": "engine", "M": 64, "N": 64, "K": 64, "scale": "block"})


def test_model_gemm_for_a_step():
    d = call("model_gemm", {"M": 4096, "N": 4096, "K": 4096, "kernel": "h04", "clock_mhz": 1320}).structured_content
    k = d["kernel"]
    assert k["kernel"] == "hopper.h04_two_consumers" and k["supported"]
    assert k["tile"][:2] == [128, 256]
    assert k["waves"]["tiles"] == 512 and k["waves"]["slots"] == 132
    assert k["waves"]["efficiency"] == pytest.approx(3.8788 / 4, rel=1e-3)
    assert k["bound"] == "compute" and 0 < k["sol_fraction"] <= 1
    assert "wave_efficiency" in d["formula"]


def test_model_gemm_uses_the_steps_heuristic_unless_given_a_config():
    args = {"M": 4096, "N": 4352, "K": 4096, "kernel": "h10"}  # 4352 = 17 x 256: BN=256 leaves a thin last wave
    k = call("model_gemm", args).structured_content["kernel"]
    assert k["config_source"] == "heuristic for this shape" and k["config"]["BN"] != 256
    given = call("model_gemm", dict(args, config={"BN": 256})).structured_content["kernel"]
    assert given["config_source"] == "given" and given["config"]["BN"] == 256
    assert k["waves"]["efficiency"] > given["waves"]["efficiency"]
    assert call("model_gemm", {"M": 64, "N": 64, "K": 64, "kernel": "k05"}).structured_content["kernel"][
        "config_source"] == "defaults"


# Measuring and explaining -------------------------------------------------------------------------------------

@NO_GPU
def test_benchmark_without_a_gpu_says_so():
    for args in ({"M": 4096, "N": 4096, "K": 4096, "kernel": "h04"}, {"M": 1024, "N": 1024, "K": 1024}):
        msg = error_text("benchmark_gemm", args)
        assert "needs an NVIDIA GPU" in msg and "model_gemm" in msg


def test_benchmark_validates_before_looking_for_a_gpu():
    assert "above the benchmark cap" in error_text("benchmark_gemm", {"M": 8192, "N": 8192, "K": 8192,
                                                                      "kernel": "k05"})
    assert "GiB" in error_text("benchmark_gemm", {"M": 131072, "N": 131072, "K": 1})
    assert "cannot run" in error_text("benchmark_gemm", {"M": 100, "N": 100, "K": 100, "kernel": "h01"})
    assert "no kernel named" in error_text("benchmark_gemm", {"M": 64, "N": 64, "K": 64, "kernel": "k99"})
    assert "chooses its own" in error_text("benchmark_gemm", {"M": 64, "N": 64, "K": 64, "config": {"BN": 128}})
    assert "is a bf16 kernel" in error_text("benchmark_gemm", {"M": 128, "N": 128, "K": 64, "kernel": "h01",
                                                                 "dtype": "fp32"})


@NO_GPU
def test_explain_gap_without_a_gpu_is_the_model_with_evidence():
    d = call("explain_gap", {"M": 4096, "N": 4096, "K": 4096, "kernel": "k05"}).structured_content
    assert d["gpu_available"] is False and d["measurement"] is None
    names = [lim["name"] for lim in d["limiters"]]
    assert set(names) == {"compute efficiency", "tile quantization", "memory", "waves"}
    factors = [lim["factor"] for lim in d["limiters"]]
    assert factors == sorted(factors, reverse=True)
    # The factors multiply to predicted / ideal time.
    prod = 1.0
    for f in factors:
        prod *= f
    assert prod == pytest.approx(d["speed_of_light_tflops"] / d["model"]["predicted_tflops"], rel=1e-3)
    assert d["dominant"] == "compute efficiency"  # k05's main loop is ~79% FFMA
    assert "FFMA share" in d["verdict"] and "No GPU" in d["verdict"]


@NO_GPU
def test_explain_gap_flags_waves_and_unsupported_shapes():
    # 32 x 17 = 544 tiles of 128x256 on 132 SMs: 4.12 waves, the fifth nearly empty.
    d = call("explain_gap", {"M": 4096, "N": 4352, "K": 4096, "kernel": "h04"}).structured_content
    assert d["dominant"] == "waves" and d["limiters"][0]["factor"] == pytest.approx(5 / (544 / 132), rel=1e-3)
    assert "544 tiles on 132 slots" in d["verdict"] and not d["risks"]
    d = call("explain_gap", {"M": 4100, "N": 4096, "K": 4096, "kernel": "h04"}).structured_content
    assert any("does not support" in r for r in d["risks"])


@pytest.mark.gpu
@pytest.mark.hopper
def test_benchmark_and_explain_gap_measure_on_a_gpu():
    """The timed paths: a ladder step and gemmlab.matmul against cuBLAS, and explain_gap with a measurement."""
    step, mm, gap = session(("benchmark_gemm", {"M": 2048, "N": 2048, "K": 2048, "kernel": "h04", "rounds": 3}),
                            ("benchmark_gemm", {"M": 1000, "N": 1536, "K": 777, "rounds": 3}),
                            ("explain_gap", {"M": 4096, "N": 4096, "K": 4096, "kernel": "h10"}))
    for r in (step, mm, gap):
        assert not r.is_error, text(r)
    for d, name in ((step.structured_content, "hopper.h04_two_consumers"), (mm.structured_content, "gemmlab.matmul")):
        assert d["kernel"] == name and d["correct"] and d["rel_error"] < 2e-2
        assert d["time_ms"] > 0 and d["cublas_time_ms"] > 0 and d["sm_clock_mhz"] > 500
        # The answer rounds floats to 5 significant digits.
        assert d["ratio_vs_cublas"] == pytest.approx(d["cublas_time_ms"] / d["time_ms"], rel=1e-3)
    assert step.structured_content["model_tflops"] > 0
    g = gap.structured_content
    assert g["gpu_available"] and g["measurement"]["correct"] and g["measurement"]["tflops"] > 100
    assert g["measured_over_model"] == pytest.approx(g["measurement"]["tflops"] / g["model"]["predicted_tflops"],
                                                     rel=1e-3)
    assert "Measured" in g["verdict"] and "cuBLAS" in g["verdict"]


# Resources and prompts -----------------------------------------------------------------------------------------

def test_resources_and_prompt():
    async def go():
        async with Client(SERVER) as c:
            res = {str(r.uri) for r in (await c.list_resources()).resources}
            brief = (await c.read_resource("gemmlab://brief")).contents[0].text
            table = (await c.read_resource("gemmlab://ladders")).contents[0].text
            prompts = [p.name for p in (await c.list_prompts()).prompts]
            msg = await c.get_prompt("diagnose_kernel", {"kernel": "k06", "M": "2048", "N": "2048", "K": "512"})
            with pytest.raises(MCPError):
                await c.get_prompt("diagnose_kernel", {"kernel": "../../etc/passwd"})
            with pytest.raises(MCPError):
                await c.get_prompt("diagnose_kernel", {"kernel": "k06", "M": "99999999"})
            await c.list_tools()
            return res, brief, table, prompts, msg

    res, brief, table, prompts, msg = anyio.run(go)
    assert {"gemmlab://brief", "gemmlab://ladders"} <= res
    assert "sgemm" in brief and "hopper" in brief and "explain_gap" in brief
    assert "`hopper.h04_two_consumers`" in table and "`sgemm.k01_naive`" in table
    assert prompts == ["diagnose_kernel"]
    assert "explain_gap(kernel='sgemm.k06_vectorized', M=2048, N=2048, K=512)" in msg.messages[0].content.text


# Hostile input ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "k05/../../x", "K05", "h04; rm -rf /",
                                  "a" * 200, "", "sgemm.k01.naive", "hopper\\h04", "k05\n"])
def test_path_like_and_malformed_names_are_refused(name):
    msg = error_text("inspect_kernel", {"kernel": name})
    assert "pattern" in msg or "at most" in msg


def test_unknown_and_ambiguous_names_list_the_known_ones():
    msg = error_text("model_gemm", {"M": 64, "N": 64, "K": 64, "kernel": "k99"})
    assert "no kernel named 'k99'" in msg and "sgemm.k01_naive" in msg
    assert "no ladder" in error_text("list_kernels", {"ladder": "fp64"})


@pytest.mark.parametrize("args", [
    {"M": 0, "N": 64, "K": 64}, {"M": -1, "N": 64, "K": 64}, {"M": 131073, "N": 64, "K": 64},
    {"M": 10**18, "N": 10**18, "K": 10**18}, {"M": "4096; drop", "N": 64, "K": 64}, {"M": 64.5, "N": 64, "K": 64},
    {"M": 64, "N": 64}, {"M": 64, "N": 64, "K": 64, "clock_mhz": 1e9}, {"M": 64, "N": 64, "K": 64, "dtype": "int4"},
    {"M": 64, "N": 64, "K": 64, "kernel": "h04", "dtype": "fp32"}, {"M": 64, "N": 64, "K": 64, "config": {"BN": 64}},
])
def test_sizes_and_types_are_bounded(args):
    error_text("model_gemm", args)


@pytest.mark.parametrize("config, why", [
    ({"BM; rm -rf /": 64}, "pattern"), ({"BM": 10**9}, "less than or equal"), ({"BM": 7}, "not in"),
    ({"NOPE": 1}, "unknown parameter"), ({f"P{i}": 1 for i in range(40)}, "at most 16"),
])
def test_configs_are_checked(config, why):
    assert why in error_text("inspect_kernel", {"kernel": "k05", "config": config})


@pytest.mark.parametrize("arch", ["sm_100", "sm_90; echo", "compute_90", "", "SM_90A"])
def test_invalid_arch(arch):
    assert "sm_90a" in error_text("inspect_kernel", {"source": SCALE, "name_expression": "scale<1>", "arch": arch})


@pytest.mark.parametrize("expr", [
    "scale<4>(); int x", 'scale<decltype(system("ls"))>', "scale<4>\n#include \"/etc/passwd\"", "scale<(4)>",
    "scale<sizeof(int)>", "::scale<4>", "scale<4> ", "scale<1+1>", "a" * 300, "scale<4>;", "scale<\"x\">",
])
def test_template_expression_injection_is_refused(expr):
    msg = error_text("inspect_kernel", {"source": SCALE, "name_expression": expr})
    assert "pattern" in msg or "at most" in msg


@pytest.mark.parametrize("code", [
    '#include "/etc/passwd"\n', '#include "../../../../etc/passwd"\n', "#include </etc/passwd>\n",
    "#include <../../../etc/passwd>\n", '#define F "/etc/passwd"\n#include F\n', '%:include "common/ptx.cuh"\n',
    '#inc\\\nlude "/etc/passwd"\n', "#if __has_include(</etc/shadow>)\n#endif\n", '#embed "/etc/passwd"\n',
    '#import "/etc/passwd"\n', '#include_next <cuda_bf16.h>\n', '??=include "/etc/passwd"\n',
    '/* x */ #include "common/ptx.cuh"\n', '#include "common/nope.cuh"\n', "#include <stdlib.h>\n",
    'int x; /* \0 */\n', "#define CAT(a, b) a##b\n#if CAT(__has_inc, lude)(</etc/shadow>)\n#endif\n",
    '#pragma GCC dependency "/etc/passwd"\n', '_Pragma("GCC dependency \\"/etc/passwd\\"")\n',
])
def test_source_that_could_read_host_files_is_refused(code):
    """Refused before the compiler sees it (no CompileError: nothing was compiled)."""
    msg = error_text("inspect_kernel", {"source": code + SCALE, "name_expression": "scale<1>"})
    assert "CompileError" not in msg and "root:" not in msg
    assert any(w in msg for w in ("line", "NUL", "trigraph", "not allowed")), msg


def test_oversized_source_is_refused():
    msg = error_text("inspect_kernel", {"source": "//" + "x" * 70000, "name_expression": "k"})
    assert "at most 65536" in msg
    # Under the character limit but over 64 KB once encoded.
    msg = error_text("inspect_kernel", {"source": "// " + "é" * 40000 + "\n" + SCALE, "name_expression": "scale<1>"})
    assert "larger than 65536 bytes" in msg


def test_argument_combinations_are_checked():
    cases = [
        ({}, "exactly one"),
        ({"kernel": "k05", "source": SCALE, "name_expression": "scale<1>"}, "exactly one"),
        ({"source": SCALE}, "needs `name_expression`"),
        ({"kernel": "k05", "name_expression": "x"}, "go with `source`"),
        ({"kernel": "k05", "arch": "sm_80"}, "compiles for sm_90"),
        ({"source": SCALE, "name_expression": "scale<1>", "config": {"BM": 64}}, "goes with a registered"),
        ({"kernel": "k05", "max_lines": 10**6}, "less than or equal"),
        ({"kernel": "k05", "listing": "everything"}, "none"),
    ]
    for args, why in cases:
        assert why in error_text("inspect_kernel", args), args


def test_unknown_tool_and_extra_calls_keep_the_server_alive():
    r = session(("no_such_tool", {}), ("model_gemm", {"M": 64, "N": 64, "K": 64}))
    assert r[0].is_error and "Unknown tool" in text(r[0])
    assert not r[1].is_error


def test_a_crash_is_a_tool_error_without_its_text(monkeypatch):
    from gemmlab import model

    def boom(*a, **k):
        raise RuntimeError("internal detail")

    monkeypatch.setattr(model, "device_profile", boom)
    r = session(("model_gemm", {"M": 64, "N": 64, "K": 64}))[0]
    assert r.is_error and "internal detail" not in text(r) and "model_gemm" in text(r)


def test_direct_calls_validate_too():
    """The functions check names themselves, not only through the schema (e.g. when called from Python)."""
    with pytest.raises(server.ToolError, match="invalid kernel name"):
        server.inspect_kernel(kernel="../../etc/passwd")
    with pytest.raises(server.ToolError, match="invalid name_expression"):
        server.inspect_kernel(source=SCALE, name_expression="scale<1>(); x")
    with pytest.raises(server.ToolError, match="invalid arch"):
        server.inspect_kernel(source=SCALE, name_expression="scale<1>", arch="sm_90 -Xptxas")


# The command -------------------------------------------------------------------------------------------------------

def test_gemmlab_mcp_help(capsys):
    from gemmlab import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["mcp", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: gemmlab mcp") and "--http" in out and "127.0.0.1" in out


def test_gemmlab_mcp_serves_stdio():
    """`gemmlab mcp` as an editor starts it: a subprocess speaking MCP on stdin/stdout."""
    import os
    from pathlib import Path

    src = str(Path(server.__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    params = StdioServerParameters(command=sys.executable, args=["-m", "gemmlab", "mcp"], env=env)

    async def go():
        async with Client(params) as c:
            names = {t.name for t in (await c.list_tools()).tools}
            r = await c.call_tool("model_gemm", {"M": 128, "N": 128, "K": 128})
            return names, r

    names, r = anyio.run(go)
    assert set(TOOLS) <= names and not r.is_error


def _gemmlab_mcp(*args, stdin=None):
    import os
    import subprocess
    from pathlib import Path

    src = str(Path(server.__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen([sys.executable, "-m", "gemmlab", "mcp", *args], stdin=stdin,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _wait_listening(port: int, timeout: float = 60.0) -> None:
    """Until a TCP connection to 127.0.0.1:``port`` is accepted (fails after ``timeout`` seconds)."""
    import socket
    import time

    end = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            assert time.monotonic() < end, f"nothing listens on port {port} after {timeout} s"
            time.sleep(0.1)


def _wait_for(stream, needle: str, timeout: float = 120.0) -> str:
    """Lines of ``stream`` until one holds ``needle`` (fails after ``timeout`` seconds)."""
    import select
    import time

    seen, end = "", time.monotonic() + timeout
    while needle not in seen:
        ready, _, _ = select.select([stream], [], [], max(0.0, end - time.monotonic()))
        assert ready, f"no {needle!r} within {timeout} s; saw {seen!r}"
        line = stream.readline()
        assert line, f"stream closed before {needle!r}; saw {seen!r}"
        seen += line
    return seen


def test_gemmlab_mcp_in_a_terminal_says_so_and_stops_on_the_first_ctrl_c():
    import os
    import pty
    import signal

    parent, child = pty.openpty()  # stdin a terminal, as when a person types the command
    proc = _gemmlab_mcp(stdin=child)
    os.close(child)
    try:
        _wait_for(proc.stderr, "waiting for a client")
        # An answered request: the server's loop is running (a Ctrl-C before it starts is the easy case).
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}
        os.write(parent, (json.dumps(init) + "\n").encode())
        _wait_for(proc.stdout, '"id":1')
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    finally:
        proc.kill()
        os.close(parent)
    err = proc.stderr.read()
    assert rc == 0 and "stopped" in err and "Traceback" not in err


def test_gemmlab_mcp_http_prints_its_address():
    import signal
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _gemmlab_mcp("--http", "--port", str(port))
    try:
        seen = _wait_for(proc.stderr, "serving streamable HTTP")
        assert f"http://127.0.0.1:{port}/mcp" in seen
        _wait_listening(port)  # the line comes before the server installs its Ctrl-C handler: a SIGINT
        proc.send_signal(signal.SIGINT)  # sent earlier may land in its start-up and be lost
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert "Traceback" not in proc.stderr.read()
