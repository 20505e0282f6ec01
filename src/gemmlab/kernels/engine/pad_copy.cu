// engine.pad_copy: copy a rows x cols matrix (unit column stride) between two row strides, for operands
// and outputs whose rows are not 16-byte aligned (TMA needs 16-byte row strides). torch's strided copy
// moves these 2 bytes per thread at ~1.6 TB/s on the H200; here each thread moves one 16-byte chunk of
// a row: a single 16-byte access on the aligned side and, on the unaligned side, element accesses that
// the warp still coalesces (32 threads cover 512 contiguous bytes of the row).
//
// SRC_VEC / DST_VEC: that side's rows start on 16-byte boundaries (base and stride), so whole chunks
// move as one 16-byte access; the row's last, partial chunk always goes element by element.
#include <cuda_fp16.h>

namespace pad_copy_detail {
template <int BYTES> struct Word;
template <> struct Word<2> { using type = unsigned short; };
template <> struct Word<4> { using type = unsigned int; };
}  // namespace pad_copy_detail

template <int ELEM_BYTES, int SRC_VEC, int DST_VEC>
__global__ void __launch_bounds__(256)
pad_copy(const void* __restrict__ src_, long long lds, void* __restrict__ dst_, long long ldd, long long rows,
         int cols) {
    using W = typename pad_copy_detail::Word<ELEM_BYTES>::type;
    constexpr int VEC = 16 / ELEM_BYTES;  // elements per 16-byte chunk
    const W* src = static_cast<const W*>(src_);
    W* dst = static_cast<W*>(dst_);
    const long long chunks_per_row = (cols + VEC - 1) / VEC, chunks = rows * chunks_per_row;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < chunks;
         i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / chunks_per_row;
        const int c0 = (int)(i - r * chunks_per_row) * VEC;
        const W* s = src + r * lds + c0;
        W* d = dst + r * ldd + c0;
        if (c0 + VEC <= cols) {
            union { uint4 v; W e[VEC]; } u;
            if constexpr (SRC_VEC) {
                u.v = __ldcs(reinterpret_cast<const uint4*>(s));  // streamed: read once
            } else {
#pragma unroll
                for (int j = 0; j < VEC; ++j) u.e[j] = s[j];
            }
            if constexpr (DST_VEC) {
                *reinterpret_cast<uint4*>(d) = u.v;
            } else {
#pragma unroll
                for (int j = 0; j < VEC; ++j) d[j] = u.e[j];
            }
        } else {
            for (int j = 0; j < cols - c0; ++j) d[j] = s[j];
        }
    }
}
