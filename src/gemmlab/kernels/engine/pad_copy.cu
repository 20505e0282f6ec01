// engine.pad_copy: copy a rows x cols matrix (unit column stride) between two row strides, for operands
// and outputs whose rows are not 16-byte aligned (TMA needs 16-byte row strides). torch's strided copy
// moves these 2 bytes per thread at ~1.6 TB/s on the H200; here each thread moves one 16-byte chunk of
// a row: a single 16-byte access on the aligned side and, on the unaligned side, element accesses that
// the warp still coalesces (32 threads cover 512 contiguous bytes of the row).
//
// SRC_VEC / DST_VEC: that side's rows start on 16-byte boundaries (base and stride), so whole chunks
// move as one 16-byte access; the row's last, partial chunk always goes element by element. An
// unaligned destination is written through shared memory so that its element stores coalesce.
//
// pad_copy_operands: a GEMM's one or two operand copies (into aligned buffers) in one launch, ahead of
// the GEMM kernel: blocks 0 .. blocks_a - 1 copy A, the rest B. Launched with programmatic dependent
// launch: it waits for the kernel before it (pdl_wait), and each block lets the GEMM be scheduled once its
// share of the copy is done (launch_dependents at its end), so the GEMM's launch overlaps the copy's last
// blocks (the GEMM's own pdl_wait holds it until the copy is done). Triggered at the blocks' start, the plans
// without a cluster ran 2-12 us a call slower than with plain launches (H100, copy_plans_probe; the likely
// cause, not traced: their CTAs took the SMs in the order the copy's blocks drained; worklog, session 39).
#include <cuda_fp16.h>
#include "common/ptx.cuh"

namespace pad_copy_detail {
template <int BYTES> struct Word;
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<4> { using type = unsigned int; };
}  // namespace pad_copy_detail

// One 16-byte chunk of the source into e (elements past the row's end, j >= n, are left alone).
template <typename W, int VEC, int SRC_VEC>
__device__ __forceinline__ void load_chunk(const W* s, int n, W (&e)[VEC]) {
    if (SRC_VEC && n == VEC) {
        union { uint4 v; W w[VEC]; } u;
        u.v = __ldcs(reinterpret_cast<const uint4*>(s));  // streamed: read once
#pragma unroll
        for (int j = 0; j < VEC; ++j) e[j] = u.w[j];
    } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j)
            if (j < n) e[j] = s[j];
    }
}

// The copy done by block `block` of `blocks` (256 threads each, grid-stride over the chunks).
template <int ELEM_BYTES, int SRC_VEC, int DST_VEC>
__device__ __forceinline__ void copy_rows(const void* __restrict__ src_, long long lds, void* __restrict__ dst_,
                                          long long ldd, long long rows, int cols, long long block,
                                          long long blocks) {
    using W = typename pad_copy_detail::Word<ELEM_BYTES>::type;
    constexpr int VEC = 16 / ELEM_BYTES;  // elements per 16-byte chunk
    const W* src = static_cast<const W*>(src_);
    W* dst = static_cast<W*>(dst_);
    const long long chunks_per_row = (cols + VEC - 1) / VEC, chunks = rows * chunks_per_row;
    if constexpr (DST_VEC) {
        for (long long i = block * blockDim.x + threadIdx.x; i < chunks; i += blocks * blockDim.x) {
            const long long r = i / chunks_per_row;
            const int c0 = (int)(i - r * chunks_per_row) * VEC, n = min(VEC, cols - c0);
            W e[VEC];
            load_chunk<W, VEC, SRC_VEC>(src + r * lds + c0, n, e);
            W* d = dst + r * ldd + c0;
            if (n == VEC) {
                union { uint4 v; W w[VEC]; } u;
#pragma unroll
                for (int j = 0; j < VEC; ++j) u.w[j] = e[j];
                *reinterpret_cast<uint4*>(d) = u.v;
            } else {
#pragma unroll
                for (int j = 0; j < VEC; ++j)
                    if (j < n) d[j] = e[j];
            }
        }
    } else {
        // An unaligned destination: element stores, but coalesced. Each warp takes 32 consecutive chunks,
        // puts them in shared memory, and lane l then stores elements l, l + 32, ... of that run, so one
        // store instruction covers 32 consecutive elements (a thread per chunk would spread each store
        // over 32 x 16 bytes: ~6x slower on the H200 for 4095-wide bf16 rows).
        __shared__ W stage[8][32 * VEC];
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        const long long warps = blocks * (blockDim.x / 32);
        for (long long w0 = (block * (blockDim.x / 32) + warp) * 32; w0 < chunks; w0 += warps * 32) {
            const long long i = w0 + lane;
            if (i < chunks) {
                const long long r = i / chunks_per_row;
                const int c0 = (int)(i - r * chunks_per_row) * VEC, n = min(VEC, cols - c0);
                W e[VEC];
                load_chunk<W, VEC, SRC_VEC>(src + r * lds + c0, n, e);
#pragma unroll
                for (int j = 0; j < VEC; ++j) stage[warp][lane * VEC + j] = e[j];
            }
            __syncwarp();
#pragma unroll
            for (int k = 0; k < VEC; ++k) {
                const int f = lane + 32 * k;  // element f of the warp's run of 32 chunks
                const long long q = w0 + f / VEC;
                if (q < chunks) {
                    const long long r = q / chunks_per_row;
                    const int c = (int)(q - r * chunks_per_row) * VEC + f % VEC;
                    if (c < cols) dst[r * ldd + c] = stage[warp][f];
                }
            }
            __syncwarp();
        }
    }
}

template <int ELEM_BYTES, int SRC_VEC, int DST_VEC>
__global__ void __launch_bounds__(256)
pad_copy(const void* __restrict__ src, long long lds, void* __restrict__ dst, long long ldd, long long rows,
         int cols) {
    copy_rows<ELEM_BYTES, SRC_VEC, DST_VEC>(src, lds, dst, ldd, rows, cols, blockIdx.x, gridDim.x);
}

// VEC_A / VEC_B: SRC_VEC of A's and B's source (the destinations are aligned buffers). With one operand
// to copy, B's job is empty (rows_b = 0, no blocks).
template <int ELEM_BYTES, int VEC_A, int VEC_B>
__global__ void __launch_bounds__(256)
pad_copy_operands(const void* __restrict__ src_a, long long lds_a, void* __restrict__ dst_a, long long ldd_a,
                  long long rows_a, int cols_a, int blocks_a, const void* __restrict__ src_b, long long lds_b,
                  void* __restrict__ dst_b, long long ldd_b, long long rows_b, int cols_b) {
    pdl_wait();  // the kernel before may still write A or B
    if ((int)blockIdx.x < blocks_a)
        copy_rows<ELEM_BYTES, VEC_A, 1>(src_a, lds_a, dst_a, ldd_a, rows_a, cols_a, blockIdx.x, blocks_a);
    else
        copy_rows<ELEM_BYTES, VEC_B, 1>(src_b, lds_b, dst_b, ldd_b, rows_b, cols_b, blockIdx.x - blocks_a,
                                        gridDim.x - blocks_a);
    pdl_launch_dependents();
}
