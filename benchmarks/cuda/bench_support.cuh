#pragma once
// Shared by the GPU benchmarks (bench_cuda_moe, bench_cuda_shuffle).

#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include "moe/kernels/cuda_common.cuh"

namespace moe::bench {

/// Times `body` (enqueued on `s`) with events; one benchmark iteration per call.
template <class F>
void time_gpu(benchmark::State& state, cudaStream_t s, F&& body) {
  cudaEvent_t a, b;
  kernels::cuda::check_cuda(cudaEventCreate(&a), "cudaEventCreate");
  kernels::cuda::check_cuda(cudaEventCreate(&b), "cudaEventCreate");
  body();  // warm-up
  kernels::cuda::check_cuda(cudaStreamSynchronize(s), "warm-up");
  for (auto _ : state) {
    cudaEventRecord(a, s);
    body();
    cudaEventRecord(b, s);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    state.SetIterationTime(static_cast<double>(ms) / 1e3);
  }
  kernels::cuda::check_cuda(cudaGetLastError(), "benchmark body");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
}

}  // namespace moe::bench
