// Integer matrix products for x86-64 written with intrinsics under per-function target attributes
// (Highway 1.0.3 has no byte dot-product op). The Highway targets call them: AVX3_DL (whose CPUs
// all have AVX512-VNNI) the VNNI kernel, AVX2 and AVX3 the AVX2 kernel. Never call one on a CPU
// without its instructions.
#pragma once

#include <cstdint>

#include "kernels/matmul_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define KV_HAVE_X86_KERNELS 1
#else
#define KV_HAVE_X86_KERNELS 0
#endif

namespace kvasir::kernels_internal {

// True when this build contains the x86 kernels (x86-64 with GCC or Clang).
bool HaveX86Kernels();

// Same contract as MatMulQuantRows. Both compute, for every (row, token),
// acc = fma(float(isum_b), dw_b * dx_b, acc) over the blocks in order with exact integer isum_b:
// bit-identical to ref::MatMul and to each other.
void MatMulQuantRowsVnni(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                         int64_t row_end);  // AVX512F/BW/VL + AVX512-VNNI
void MatMulQuantRowsAvx2(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                         int64_t row_end);  // AVX2 + FMA + F16C

// Q4_K/Q5_K/Q6_K (HaveKQuantKernels) with AVX512-VNNI, same contract and arithmetic as the
// integer form of quant_ints.h: bit-identical to ref::MatMul (matmul_vnni_k.cpp).
bool HaveKQuantKernels(TensorType type);
void MatMulKQuantRowsVnni(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                          int64_t row_end);
// The same types with AVX2 + FMA + F16C (matmul_avx2_k.cpp).
void MatMulKQuantRowsAvx2(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                          int64_t row_end);

}  // namespace kvasir::kernels_internal
