"""Print an agent-style session with gemmlab's MCP server: real tool calls through the SDK's in-process client.

    PYTHONPATH=src python benchmarks/mcp_transcript.py > /tmp/transcript.md

Each call is printed as the agent sends it (tool and JSON arguments) and each answer as the server returns it:
the text of an error, or the structured result with only the fields named in SESSION, as compact JSON (the
other fields are elided and their names listed). The README's MCP transcript is this script's output.
"""

from __future__ import annotations

import json

import anyio
from mcp import Client

from gemmlab.mcp.server import build_server

# (tool, arguments, fields of the structured answer to show; None shows the whole answer)
SESSION = [
    ("list_kernels", {"ladder": "sgemm"}, ["kernels[:1]"]),
    ("explain_gap", {"kernel": "k05", "M": 4096, "N": 4096, "K": 4096}, ["dominant", "limiters", "verdict"]),
    ("inspect_kernel", {"kernel": "k05", "listing": "main_loop", "max_lines": 8},
     ["registers", "occupancy", "highlights", "loops", "listing"]),
    ("inspect_kernel", {"kernel": "k06", "listing": "none"}, ["registers", "mix", "highlights", "sass_claims_failed"]),
    ("explain_gap", {"kernel": "h04", "M": 4096, "N": 4352, "K": 4096}, ["dominant", "verdict"]),
    ("model_gemm", {"kernel": "h10", "M": 4096, "N": 4352, "K": 4096},
     ["kernel.config", "kernel.config_source", "kernel.waves", "kernel.predicted_tflops"]),
    ("inspect_kernel", {"source": "template <int N> __global__ void axpy(float a, const float* __restrict__ x, "
                                  "float* __restrict__ y) {\n  int i = blockIdx.x * blockDim.x * N + threadIdx.x;\n"
                                  "#pragma unroll\n  for (int j = 0; j < N; ++j) y[i + j * blockDim.x] += "
                                  "a * x[i + j * blockDim.x];\n}\n",
                        "name_expression": "axpy<4>", "arch": "sm_90", "threads_per_block": 256,
                        "listing": "sass", "max_lines": 6},
     ["registers", "occupancy", "mix", "listing"]),
    ("benchmark_gemm", {"kernel": "h04", "M": 4096, "N": 4096, "K": 4096}, None),
    ("inspect_kernel", {"source": '#include "/etc/passwd"\n', "name_expression": "k"}, None),
    ("model_gemm", {"kernel": "../../etc/passwd", "M": 4096, "N": 4096, "K": 4096}, None),
]


def pick(data: dict, path: str):
    """``a.b`` or ``a[:n]`` out of a structured answer."""
    cur = data
    for part in path.split("."):
        name, _, sl = part.partition("[")
        cur = cur[name]
        if sl:
            cur = cur[:int(sl.strip(":]"))]
    return cur


def render(result, fields) -> str:
    if result.is_error or fields is None or result.structured_content is None:
        return ("ERROR: " if result.is_error else "") + result.content[0].text
    data = result.structured_content
    out = []
    for f in fields:
        value = pick(data, f)
        if f == "listing":  # SASS/PTX lines read better one per line
            out.append(f"listing: {value['kind']}, {len(value['lines'])} of {value['total_lines']} lines"
                       + (" (truncated)" if value["truncated"] else ""))
            out += [f"  | {line}" for line in value["lines"]]
        else:
            out.append(f"{f}: {json.dumps(value, ensure_ascii=False, separators=(', ', ': '))}")
    roots = {f.split(".")[0].split("[")[0] for f in fields}
    elided = [k + (f" ({len(v)} entries)" if isinstance(v, list) else "") for k, v in data.items() if k not in roots]
    if any(f.endswith("]") for f in fields):
        out.append("; ".join(f"{f.split('[')[0]} has {len(pick(data, f.split('[')[0]))} entries"
                             for f in fields if f.endswith("]")))
    if elided:
        out.append(f"(also in the answer: {', '.join(elided)})")
    return "\n".join(out)


async def main() -> None:
    async with Client(build_server()) as client:
        tools = (await client.list_tools()).tools
        print(f"> tools/list\n< {', '.join(t.name for t in tools)}\n")
        for name, args, fields in SESSION:
            result = await client.call_tool(name, args)
            print(f"> {name} {json.dumps(args)}")
            print("< " + render(result, fields).replace("\n", "\n  ") + "\n")


if __name__ == "__main__":
    anyio.run(main)
