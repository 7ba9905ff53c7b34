// A host engine in miniature: one DeepSeek-V3-shaped MoE layer at reduced width on 2 in-process ranks,
// checked against the reference. Exits non-zero on a mismatch.
#include <moe/moe.hpp>

#include <cmath>
#include <cstdio>
// With a component, the consumer also compiles and links something of it (check.cmake).
#if MOE_CONSUMER_WITH_mpi
#include <moe/collective/mpi.hpp>
#endif
#if MOE_CONSUMER_WITH_interop
#include <moe/interop/engine_plans.hpp>
#endif
#if MOE_CONSUMER_WITH_cuda
#include <cuda_runtime.h>
#endif
#if MOE_CONSUMER_WITH_nccl
#include <nccl.h>
#endif

int main() {
  using Model = moe::models::Reduced<moe::models::DeepSeekV3, 32, 16, moe::DType::f32>;
  using Router = moe::router::ForModel<Model>;
  using Layer = moe::Layer<Model, Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential,
                           moe::collective::InProcess<2>>;
  moe::RandomLayerWeights<float> weights(Model::spec, 7);
  std::vector<float> x(2 * 4 * 32), ref(x.size()), y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.37f * float(i));
  moe::reference_forward<Router>(Model::spec, weights.view(), 8, x.data(), ref.data());
  moe::collective::run_in_process<2>([&](auto& comm) {
    Layer layer(comm, moe::placement::Table::contiguous(256, 2), {}, weights.view(), {.max_tokens = 4});
    std::vector<std::byte> ws(layer.workspace_size());
    std::size_t at = static_cast<std::size_t>(comm.rank()) * 4 * 32;
    layer.run({.tokens = 4, .x = x.data() + at, .y = y.data() + at, .first_token = comm.rank() * 4}, ws);
  });
  double worst = 0;
  for (std::size_t i = 0; i < y.size(); ++i) worst = std::max(worst, double(std::abs(y[i] - ref[i])));
  std::printf("consumer: max abs difference %.3g", worst);
#if MOE_CONSUMER_WITH_mpi
  std::printf("; mpi: %s", std::is_class_v<moe::collective::Mpi> ? "moe::collective::Mpi" : "");
  int mpi_version = 0, mpi_sub = 0;
  MPI_Get_version(&mpi_version, &mpi_sub);
  std::printf(" (MPI %d.%d)", mpi_version, mpi_sub);
#endif
#if MOE_CONSUMER_WITH_interop
  std::printf("; interop: format %s", moe::placement::engine::file_suffix(moe::placement::engine::parse_format("sglang")));
#endif
#if MOE_CONSUMER_WITH_cuda
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);  // links cudart; no GPU is needed to ask
  std::printf("; cuda: %s", e == cudaSuccess ? "device count read" : "cudart linked, no device");
#endif
#if MOE_CONSUMER_WITH_nccl
  int nccl_version = 0;
  ncclGetVersion(&nccl_version);
  std::printf("; nccl %d", nccl_version);
#endif
  std::printf("\n");
  return worst < 1e-5 ? 0 : 1;
}
