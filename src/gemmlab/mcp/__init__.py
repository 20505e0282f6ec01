"""gemmlab as an MCP server: typed, read-only tools that let a coding agent inspect, model and time GEMM kernels.

``gemmlab mcp`` serves over stdio (what editors launch); ``gemmlab mcp --http`` serves streamable HTTP on
127.0.0.1. Built on the official SDK's ``mcp.server.MCPServer`` (the ``mcp`` extra). The tools answer with
the reports of ``gemmlab.reports``, the same the ``gemmlab`` command prints:

- ``list_kernels``: the registry (ladder steps, techniques, constraints, parameters, SASS claims).
- ``inspect_kernel``: registers, smem, spills, instruction mix with widths, loops and unrolling, a capped
  SASS/PTX listing; of a ladder step, or of CUDA C++ source that is compiled and disassembled, never run.
- ``inspect_plan``: the same for the kernel ``gemmlab.matmul``, ``scaled_mm`` or ``grouped_mm`` runs at a shape.
- ``model_gemm``: roofline, speed of light at a clock, waves, occupancy, predicted time (``gemmlab.model``).
- ``model_grouped_gemm``: a MoE layer's grouped GEMM (``gemmlab.grouped``'s model and plan).
- ``benchmark_gemm``: a step or ``gemmlab.matmul`` against cuBLAS with the one timer (GPU only).
- ``explain_gap``: which limiter the model says dominates, with the numbers; and the measurement on a GPU.

Safety (``safety``): no tool runs a shell or host code. Every argument is validated by its schema (names by
a strict pattern and then against the registry, integers bounded, source at most 64 KB, architectures from
an allowlist) and again where it is used. User source may include only gemmlab's headers and an allowlist of
CUDA headers, and compiles in a child Python process under CPU, memory and wall-clock limits. Failures come
back as tool errors (``is_error``); the server keeps answering.

Modules: ``server`` (the tools, resources, prompt, ``build_server``, ``serve``), ``schema`` (bounded input
types; output models made from the report dataclasses), ``safety`` (source checks, the compile child).
"""
