// One emulated launch of an sgemm ladder kernel against a float64 reference.
//   harness KERNEL_INDEX M N K GRID_X GRID_Y BLOCK_X BLOCK_Y ALPHA BETA MISALIGN ORDER
// KERNELS (kernel_table.inc, written by the test) lists the instantiations. A and B are allocated
// to their exact size (AddressSanitizer, when on, catches any read past them); C carries a sentinel
// tail that must survive. MISALIGN=1 shifts every operand by one float (rows stay contiguous, the
// base pointers lose their 16-byte alignment). BETA=0 fills C with NaN, which must not be read.
// Prints "OK rel=..." or "FAIL ..." and exits non-zero on failure.
#include "cuda_host.h"

#include <cmath>

using Kernel = void (*)(int, int, int, float, const float*, const float*, float, float*);
#include "kernel_table.inc"  // static const Kernel KERNELS[] = {...};

int main(int argc, char** argv) {
    if (argc != 13) {
        std::printf("FAIL: usage\n");
        return 2;
    }
    const int index = std::atoi(argv[1]);
    const int M = std::atoi(argv[2]), N = std::atoi(argv[3]), K = std::atoi(argv[4]);
    gridDim = uint3_{(unsigned)std::atoi(argv[5]), (unsigned)std::atoi(argv[6]), 1};
    const uint3_ block{(unsigned)std::atoi(argv[7]), (unsigned)std::atoi(argv[8]), 1};
    const float alpha = std::atof(argv[9]), beta = std::atof(argv[10]);
    const int misalign = std::atoi(argv[11]);
    const auto order = static_cast<host_emulation::Order>(std::atoi(argv[12]));

    std::mt19937 rng(12345u + M * 7u + N * 13u + K * 17u);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    constexpr int kSentinel = 64;
    auto alloc = [&](size_t n) {
        auto* p = static_cast<float*>(std::malloc((n + misalign) * sizeof(float)));
        if (reinterpret_cast<uintptr_t>(p) % 16) {
            std::printf("FAIL: malloc is not 16-byte aligned\n");
            std::exit(2);
        }
        return p + misalign;
    };
    const size_t mk = (size_t)M * K, kn = (size_t)K * N, mn = (size_t)M * N;
    float* A = alloc(mk);
    float* B = alloc(kn);
    float* C = alloc(mn + kSentinel);
    std::vector<float> C0(mn);
    for (size_t i = 0; i < mk; ++i) A[i] = uniform(rng);
    for (size_t i = 0; i < kn; ++i) B[i] = uniform(rng);
    for (size_t i = 0; i < mn; ++i) C0[i] = uniform(rng);
    for (size_t i = 0; i < mn; ++i) C[i] = beta == 0.0f ? NAN : C0[i];
    for (int i = 0; i < kSentinel; ++i) C[mn + i] = 12345.0f;

    for (unsigned y = 0; y < gridDim.y; ++y) {
        for (unsigned x = 0; x < gridDim.x; ++x) {
            blockIdx = uint3_{x, y, 0};
            if (!host_emulation::run_block(block, [&] { KERNELS[index](M, N, K, alpha, A, B, beta, C); },
                                           order, rng)) {
                return 1;
            }
        }
    }
    for (int i = 0; i < kSentinel; ++i) {
        if (C[mn + i] != 12345.0f) {
            std::printf("FAIL: wrote past the end of C\n");
            return 1;
        }
    }
    double err2 = 0.0, ref2 = 0.0;
    for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
            double acc = 0.0;
            for (int k = 0; k < K; ++k) acc += (double)A[(size_t)i * K + k] * B[(size_t)k * N + j];
            const double ref = alpha * acc + beta * (double)C0[(size_t)i * N + j];
            const double got = C[(size_t)i * N + j];
            if (!std::isfinite(got)) {
                std::printf("FAIL: C[%d][%d] = %f\n", i, j, got);
                return 1;
            }
            err2 += (got - ref) * (got - ref);
            ref2 += ref * ref;
        }
    }
    const double rel = std::sqrt(err2) / std::max(std::sqrt(ref2), 1e-300);
    std::printf("%s rel=%.3e\n", rel <= 1e-5 ? "OK" : "FAIL", rel);
    return rel <= 1e-5 ? 0 : 1;
}
