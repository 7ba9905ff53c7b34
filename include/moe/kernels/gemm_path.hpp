#pragma once
// The choice of grouped-GEMM kernel, as a plain enum that host code (moe::LayerOptions) can name
// without the CUDA headers. The kernels are in moe/kernels/grouped_gemm.cuh.

namespace moe::kernels::cuda {

/// Which kernel runs a grouped GEMM.
///   automatic  the Hopper kernel for bf16 on an sm_90 device when the program carries sm_90a code,
///              else the portable kernel (see hopper_gemm_available)
///   portable   the WMMA / SIMT kernel (any architecture, float and bf16)
///   hopper     the wgmma kernel; an error where it cannot run
enum class GemmPath { automatic, portable, hopper };

}  // namespace moe::kernels::cuda
