#pragma once
// The expert feed-forward passes of a MoE layer on the GPU (nvcc only), shared by the device moe::Layer
// and the FinDEP executors (moe/layer/findep_cuda_*.cuh) so that every device path runs the same
// kernels with the same roundings:
//
//   RoutedExperts<S, T>   received records -> (record, slot) pairs grouped by expert -> SwiGLU
//                         grouped GEMM (bf16/fp32 intermediate in storage precision) -> down
//                         grouped GEMM -> weighted combine: one partial row per record
//   shared_experts<S>     acc (fp32) = sum over the shared experts of SwiGLU FFNs on every row
//
// Both take the grouped GEMM's kernel choice (kernels::cuda::GemmPath); prepare_gemm_path checks
// it once, at an owner's construction.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>
#include <span>
#include <type_traits>

#include "moe/core/shape.hpp"
#include "moe/kernels/combine.cuh"
#include "moe/kernels/cuda_common.cuh"
#include "moe/kernels/dispatch.cuh"
#include "moe/kernels/grouped_gemm.cuh"
#include "moe/core/weights.hpp"
#include "moe/plan/replica_table.hpp"

namespace moe::detail {

/// Checks that grouped GEMMs of T can run with `path` on the current device (`who` names the
/// owner in the error) and, for bf16, runs the one-time probe behind GemmPath::automatic now: the
/// probe synchronises, so it must not happen first inside a captured forward pass.
template <class T>
void prepare_gemm_path(char const* who, kernels::cuda::GemmPath path) {
  namespace kc = kernels::cuda;
  check(path == kc::GemmPath::automatic || path == kc::GemmPath::portable || path == kc::GemmPath::hopper, who,
        ": unknown GemmPath ", static_cast<int>(path));
  if constexpr (std::is_same_v<T, moe::bf16>) {
    if (path == kc::GemmPath::portable) return;
    bool hopper = kc::hopper_gemm_available();
    check(hopper || path != kc::GemmPath::hopper, who,
          ": GemmPath::hopper needs an sm_90 device and a program built with -gencode=arch=compute_90a,code=sm_90a");
  } else {
    check(path != kc::GemmPath::hopper, who, ": GemmPath::hopper computes bf16 only; this layer stores fp32");
  }
}

/// The two grouped GEMMs of the routed experts over rows already grouped by expert: expert e's rows
/// are [offsets[e], offsets[e + 1]) (device; tile_starts in units of grouped_gemm_tile_m rows), row
/// i reads its token at a + (index ? index[i] / index_div : i) * a_stride. inter (rows x
/// expert_ffn) = bf16/fp32 silu(gate x) * (up x); out (rows x hidden) = down inter, in storage
/// precision. `max_rows` bounds the total rows (the grid is sized for it).
template <ShapeSpec S, class T>
struct ExpertGemms {
  int const* offsets = nullptr;
  int const* tile_starts = nullptr;
  long long max_rows = 0;
  std::byte const* a = nullptr;
  std::size_t a_stride = 0;
  int const* index = nullptr;
  int index_div = 1;
  T const* const* gate = nullptr;  ///< device tables, one pointer per expert
  T const* const* up = nullptr;
  T const* const* down = nullptr;
  T* inter = nullptr;
  T* out = nullptr;
  kernels::cuda::GemmPath path = kernels::cuda::GemmPath::automatic;

  void enqueue(cudaStream_t s) const {
    namespace kc = kernels::cuda;
    kc::GroupedGemmArgs<T> g1;
    g1.groups = S.experts;
    g1.rows = offsets;
    g1.tile_starts = tile_starts;
    g1.max_row_tiles = kc::grouped_gemm_row_tiles(max_rows, S.experts);
    g1.index = index;
    g1.a = a;
    g1.a_stride = a_stride;
    g1.index_div = index_div;
    g1.b0_table = gate;
    g1.b1_table = up;
    g1.n = S.expert_ffn;
    g1.k = S.hidden;
    g1.out = inter;
    g1.out_ld = static_cast<std::size_t>(S.expert_ffn);
    g1.path = path;
    kc::grouped_gemm<T, kc::Epilogue::swiglu>(s, g1);

    kc::GroupedGemmArgs<T> g2 = g1;  // same groups and tiles, rows in grouped order
    g2.a = reinterpret_cast<std::byte const*>(inter);
    g2.a_stride = static_cast<std::size_t>(S.expert_ffn) * sizeof(T);
    g2.index = nullptr;
    g2.index_div = 1;
    g2.b0_table = down;
    g2.b1_table = nullptr;
    g2.n = S.hidden;
    g2.k = S.expert_ffn;
    g2.out = out;
    g2.out_ld = static_cast<std::size_t>(S.hidden);
    kc::grouped_gemm<T, kc::Epilogue::store>(s, g2);
  }
};

/// The routed experts of `slots` received records: records at `records` (`record_bytes` apart,
/// metadata first), per source s the records [recv_base[s], recv_base[s] + recv_n[s]); the token
/// row of (record, slot) item i = record * top_k + slot is read at a + (i / index_div) * a_stride.
/// Writes one weighted partial row per record slot into `back`. The grouping scratch holds
/// slots * top_k items; inter and expert_out hold slots * max_count rows (a record naming more
/// than max_count experts is rejected, see kernels::cuda::group_by_expert).
template <ShapeSpec S, class T>
struct RoutedExperts {
  std::byte const* records = nullptr;
  std::size_t record_bytes = 0;
  long long slots = 0;
  long long const* recv_base = nullptr;
  int const* recv_n = nullptr;
  int sources = 1;
  std::byte const* a = nullptr;
  std::size_t a_stride = 0;
  int index_div = S.top_k;  ///< top_k: one token row per record; top_k^2: one record per (token, expert)
  unsigned char const* served = nullptr;
  /// Most experts one record names (1..top_k): 1 without de-duplication, at most the experts a
  /// rank serves with it.
  int max_count = S.top_k;
  T const* const* gate = nullptr;  ///< device tables, one pointer per expert
  T const* const* up = nullptr;
  T const* const* down = nullptr;
  kernels::cuda::ExpertGrouping grouping{};
  T* inter = nullptr;       ///< slots * max_count x expert_ffn
  T* expert_out = nullptr;  ///< slots * max_count x hidden
  T* back = nullptr;        ///< slots x hidden
  unsigned* errors = nullptr;
  kernels::cuda::GemmPath path = kernels::cuda::GemmPath::automatic;

  void enqueue(cudaStream_t s) const {
    namespace kc = kernels::cuda;
    constexpr int k = S.top_k;
    kc::group_by_expert<k>(s, records, record_bytes, slots, recv_base, recv_n, sources, S.experts, served,
                           kc::grouped_gemm_tile_m, grouping, errors, max_count);
    if (slots == 0) return;
    ExpertGemms<S, T>{.offsets = grouping.offsets,
                      .tile_starts = grouping.tile_starts,
                      .max_rows = slots * max_count,  // the valid pairs group_by_expert keeps
                      .a = a,
                      .a_stride = a_stride,
                      .index = grouping.sorted_values,  // record * k + slot
                      .index_div = index_div,
                      .gate = gate,
                      .up = up,
                      .down = down,
                      .inter = inter,
                      .out = expert_out,
                      .path = path}
        .enqueue(s);
    kc::combine_records<T, k>(s, records, record_bytes, slots, recv_base, recv_n, sources, S.experts, served,
                              expert_out, grouping.position, S.hidden, back, max_count);
  }
};

/// acc (tokens x hidden, fp32) = sum of the shared experts on `tokens` rows of x (hidden apart);
/// `inter` holds tokens x shared_ffn of scratch. Enqueued on `s`.
template <ShapeSpec S, class T>
void shared_experts(cudaStream_t s, std::span<ExpertWeights<T> const> shared, T const* x, int tokens, T* inter,
                    float* acc, kernels::cuda::GemmPath path) {
  namespace kc = kernels::cuda;
  auto const h = static_cast<std::size_t>(S.hidden);
  kc::check_cuda(cudaMemsetAsync(acc, 0, static_cast<std::size_t>(tokens) * h * sizeof(float), s),
                 "cudaMemsetAsync (shared experts)");
  for (auto const& e : shared) {
    kc::GroupedGemmArgs<T> up;
    up.uniform_rows = tokens;
    up.a = reinterpret_cast<std::byte const*>(x);
    up.a_stride = h * sizeof(T);
    up.b0 = e.gate;
    up.b1 = e.up;
    up.n = S.shared_ffn;
    up.k = S.hidden;
    up.out = inter;
    up.out_ld = static_cast<std::size_t>(S.shared_ffn);
    up.path = path;
    kc::grouped_gemm<T, kc::Epilogue::swiglu>(s, up);

    kc::GroupedGemmArgs<T> down;
    down.uniform_rows = tokens;
    down.a = reinterpret_cast<std::byte const*>(inter);
    down.a_stride = static_cast<std::size_t>(S.shared_ffn) * sizeof(T);
    down.b0 = e.down;
    down.n = S.hidden;
    down.k = S.shared_ffn;
    down.out_f32 = acc;
    down.out_ld = h;
    down.path = path;
    kc::grouped_gemm<T, kc::Epilogue::accumulate>(s, down);
  }
}

/// Checks that an expert's three matrices are 16-byte aligned (the kernels load 16-byte vectors).
template <class T>
void check_expert_alignment(char const* who, ExpertWeights<T> const& w, char const* kind, int e) {
  auto one = [&](T const* p, char const* what) {
    check(reinterpret_cast<std::uintptr_t>(p) % 16 == 0, who, ": ", kind, what, " weights of expert ", e,
          " are not 16-byte aligned");
  };
  one(w.gate, "gate");
  one(w.up, "up");
  one(w.down, "down");
}

/// The device tables of routed experts that the device Layer and the FinDEP executors keep, made
/// once at construction (one class instead of a copy in each owner):
///   - the copy lists (each expert's copies and primary rank), which senders choose destinations
///     from (copy_table(), replica_view());
///   - the experts one serving index holds a copy of (a mask and the gate / up / down pointer
///     tables), which receivers run (served(), gate(), up(), down());
///   - the error word the receive side raises (errors(), read_errors()).
/// Its members own their device memory, so an owner whose later construction step throws releases
/// the tables with it.
template <class T>
class DeviceExpertTable {
public:
  DeviceExpertTable() = default;

  /// `copies`, `primary`: every expert's copies and placement index (uploaded when `senders`).
  /// `serving`: the index whose copies this owner runs (-1 for none); each of those experts must
  /// have weights in `experts`, 16-byte aligned (`who` and `serving_name` name the owner and the
  /// index in the messages).
  DeviceExpertTable(replication::CopyLists const& copies, std::span<int const> primary, bool senders, int serving,
                    std::span<ExpertWeights<T> const> experts, char const* who, char const* serving_name = "rank") {
    namespace kc = kernels::cuda;
    auto n = primary.size();
    if (senders) {
      offsets_ = kc::DeviceArray<int>(copies.first.size());
      offsets_.upload(copies.first.data(), copies.first.size());
      ranks_ = kc::DeviceArray<int>(copies.ranks.size());
      ranks_.upload(copies.ranks.data(), copies.ranks.size());
      primary_ = kc::DeviceArray<int>(n);
      primary_.upload(primary.data(), n);
    }
    if (serving >= 0) {
      std::vector<unsigned char> served(n, 0);
      std::vector<T const*> gate(n, nullptr), up(n, nullptr), down(n, nullptr);
      for (std::size_t e = 0; e < n; ++e) {
        if (!copies.holds(static_cast<int>(e), serving)) continue;
        auto const& w = experts[e];
        check(w.present(), who, ": ", serving_name, " ", serving, " serves expert ", e, " but its weights are missing");
        check_expert_alignment(who, w, "", static_cast<int>(e));
        served[e] = 1;
        ++served_count_;
        gate[e] = w.gate;
        up[e] = w.up;
        down[e] = w.down;
      }
      served_ = kc::DeviceArray<unsigned char>(n);
      served_.upload(served.data(), n);
      gate_ = kc::DeviceArray<T const*>(n);
      gate_.upload(gate.data(), n);
      up_ = kc::DeviceArray<T const*>(n);
      up_.upload(up.data(), n);
      down_ = kc::DeviceArray<T const*>(n);
      down_.upload(down.data(), n);
    }
    errors_ = kc::DeviceArray<unsigned>(1);
    kc::check_cuda(cudaMemset(errors_.get(), 0, sizeof(unsigned)), "cudaMemset");
  }

  [[nodiscard]] kernels::cuda::DeviceCopyTable copy_table() const { return {offsets_.get(), ranks_.get(), primary_.get()}; }
  /// The built-in replica choice over the copy lists (replication::Table's rule).
  [[nodiscard]] kernels::cuda::ReplicaView replica_view(bool prefer_source = true) const {
    return {offsets_.get(), ranks_.get(), primary_.get(), prefer_source};
  }
  [[nodiscard]] unsigned char const* served() const { return served_.get(); }
  [[nodiscard]] T const* const* gate() const { return gate_.get(); }
  [[nodiscard]] T const* const* up() const { return up_.get(); }
  [[nodiscard]] T const* const* down() const { return down_.get(); }
  [[nodiscard]] int served_count() const { return served_count_; }
  [[nodiscard]] unsigned* errors() const { return errors_.get(); }

  /// A routed-expert pass over this table's served experts (their mask, weight tables and error
  /// word), its scratch taken from `b`: any buffers with the grouping fields (keys, values,
  /// sorted_keys, sorted_values, position, offsets, tile_starts, sort_temp), inter and expert_out.
  /// The caller sets where the records and token rows are and where `back` goes.
  template <ShapeSpec S, class Buffers>
  [[nodiscard]] RoutedExperts<S, T> routed(Buffers const& b, int max_count, kernels::cuda::GemmPath path) const {
    RoutedExperts<S, T> pass;
    pass.served = served();
    pass.max_count = max_count;
    pass.gate = gate();
    pass.up = up();
    pass.down = down();
    pass.grouping = {b.keys.data(),     b.values.data(),  b.sorted_keys.data(), b.sorted_values.data(),
                     b.position.data(), b.offsets.data(), b.tile_starts.data(), b.sort_temp.data(),
                     b.sort_temp.size()};
    pass.inter = b.inter.data();
    pass.expert_out = b.expert_out.data();
    pass.errors = errors();
    pass.path = path;
    return pass;
  }
  /// The error word (kernels::cuda::DeviceError bits), after synchronising the device: a
  /// diagnostic for tests and debugging, never on the hot path.
  [[nodiscard]] unsigned read_errors() const {
    namespace kc = kernels::cuda;
    kc::check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (errors)");
    unsigned v = 0;
    kc::check_cuda(cudaMemcpy(&v, errors_.get(), sizeof(v), cudaMemcpyDeviceToHost), "cudaMemcpy (errors)");
    return v;
  }

private:
  kernels::cuda::DeviceArray<int> offsets_, ranks_, primary_;
  kernels::cuda::DeviceArray<unsigned char> served_;
  kernels::cuda::DeviceArray<T const*> gate_, up_, down_;
  kernels::cuda::DeviceArray<unsigned> errors_;
  int served_count_ = 0;
};

}  // namespace moe::detail
