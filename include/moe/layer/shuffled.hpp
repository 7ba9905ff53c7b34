#pragma once
// Speculative token shuffling (s-TS, Speculative MoE section 3) around an expert-parallel Layer.
//
// Setting: attention runs tensor-parallel over the same ranks as the experts, so every rank ends the
// attention block with a partial sum of the whole batch (tokens x hidden, fp32). Two ways to feed
// the MoE layer and give every rank the full output back:
//
//   run_baseline  all-reduce the partials; rank r keeps an even, contiguous slice of the batch;
//                 the layer runs; an all-gather gives everyone the whole output.
//   run_shuffled  the tokens are argsorted by their predicted rank (the predictor's table lookup);
//                 a shuffled reduce-scatter (SRS) hands each rank the summed rows predicted for it;
//                 the layer runs (more assignments are local when the predictions are good); a
//                 shuffled all-gather (SAG) collects the outputs and restores the original order.
//
// Both give the same output whatever the predictions are: a prediction only decides where a token
// is processed, never what is computed. The reduce-scatter moves half the bytes of the all-reduce.
//
// Workspace: the caller owns it (workspace_size()). The wrapped layer must accept the largest share
// a rank can be handed, which for arbitrary predictions is the whole batch: construct it with
// LayerOptions::max_tokens >= max_batch.

#include <algorithm>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "moe/collective/concept.hpp"
#include "moe/config.hpp"
#include "moe/core/workspace.hpp"
#include "moe/speculative/shuffle_plan.hpp"

namespace moe {

template <class InnerLayer>
class ShuffledLayer {
public:
  using T = typename InnerLayer::element_type;
  static constexpr std::size_t h = static_cast<std::size_t>(InnerLayer::shape.hidden);
  // The steps between the collectives (copies, the slice arithmetic) run on the host; a device
  // layer (the device path over collective::Nccl) has the same members but would be handed device
  // pointers here. The device form of the shuffle is kernels/shuffle.cuh.
  static_assert(std::remove_cvref_t<decltype(std::declval<InnerLayer&>().comm())>::memory ==
                    collective::Memory::host,
                "ShuffledLayer runs on the host: its inner layer must use a host collective (InProcess, Mpi)");

  struct Arguments {
    int tokens = 0;                    ///< tokens in the whole batch (the same on every rank)
    float const* partial = nullptr;    ///< this rank's partial sums, tokens x hidden
    T* y = nullptr;                    ///< the full output, tokens x hidden, on every rank
    std::span<int const> predicted{};  ///< run_shuffled: predicted rank of each token (same on every rank)
  };

  ShuffledLayer(InnerLayer& layer, int max_batch) : layer_(&layer), max_batch_(max_batch) {
    check(max_batch > 0, "ShuffledLayer: max_batch must be positive, got ", max_batch);
  }

  [[nodiscard]] std::size_t workspace_size() const {
    core::Carver c;
    Buffers b;
    carve(c, b);
    return c.used() + layer_->workspace_size();
  }

  /// All-reduce, contiguous slices, all-gather.
  void run_baseline(Arguments const& a, std::span<std::byte> workspace) {
    check_arguments(a, false);
    auto& comm = layer_->comm();
    int ranks = comm.size(), rank = comm.rank();
    auto [b, inner] = split(workspace);
    auto n = static_cast<std::size_t>(a.tokens);
    std::copy_n(a.partial, n * h, b.rows.data());
    comm.all_reduce(b.rows.first(n * h));
    std::vector<std::size_t> counts(static_cast<std::size_t>(ranks));
    std::vector<int> first(static_cast<std::size_t>(ranks) + 1, 0);
    for (int r = 0; r < ranks; ++r) {
      int c = a.tokens / ranks + (r < a.tokens % ranks ? 1 : 0);
      counts[static_cast<std::size_t>(r)] = static_cast<std::size_t>(c);
      first[static_cast<std::size_t>(r) + 1] = first[static_cast<std::size_t>(r)] + c;
    }
    auto mine = counts[static_cast<std::size_t>(rank)];
    float const* slice = b.rows.data() + static_cast<std::size_t>(first[static_cast<std::size_t>(rank)]) * h;
    run_inner(slice, mine, first[static_cast<std::size_t>(rank)], b, inner);
    gather(counts, b, std::span<T>(a.y, n * h));
  }

  /// Shuffled reduce-scatter to the predicted ranks, the layer, shuffled all-gather.
  void run_shuffled(Arguments const& a, std::span<std::byte> workspace) {
    check_arguments(a, true);
    auto& comm = layer_->comm();
    int ranks = comm.size(), rank = comm.rank();
    auto [b, inner] = split(workspace);
    auto n = static_cast<std::size_t>(a.tokens);
    auto plan = speculative::make_shuffle_plan(a.predicted, ranks);
    speculative::pack_rows<float>(plan, {a.partial, n * h}, b.rows.first(n * h), h);
    std::vector<std::size_t> counts(static_cast<std::size_t>(ranks)), elements(counts.size());
    for (std::size_t r = 0; r < counts.size(); ++r) {
      counts[r] = static_cast<std::size_t>(plan.counts[r]);
      elements[r] = counts[r] * h;
    }
    auto mine = counts[static_cast<std::size_t>(rank)];
    comm.reduce_scatter_v(b.rows.first(n * h), b.reduced.first(mine * h), elements);
    run_inner(b.reduced.data(), mine, plan.offsets[static_cast<std::size_t>(rank)], b, inner);
    gather(counts, b, b.packed_y.first(n * h));
    speculative::unpack_rows<T>(plan, b.packed_y.first(n * h), std::span<T>(a.y, n * h), h);
  }

private:
  struct Buffers {
    std::span<float> rows;     // the batch's partial (then reduced) rows, max_batch x hidden
    std::span<float> reduced;  // this rank's reduced rows (shuffled path)
    std::span<T> x;            // this rank's rows in storage precision
    std::span<T> y;            // this rank's outputs
    std::span<T> packed_y;     // gathered outputs in packed order (shuffled path)
  };

  void carve(core::Carver& c, Buffers& b) const {
    auto m = static_cast<std::size_t>(max_batch_) * h;
    b.rows = c.take<float>(m);
    b.reduced = c.take<float>(m);
    b.x = c.take<T>(m);
    b.y = c.take<T>(m);
    b.packed_y = c.take<T>(m);
  }

  std::pair<Buffers, std::span<std::byte>> split(std::span<std::byte> workspace) const {
    core::check_workspace("ShuffledLayer", workspace.size(), workspace_size());
    core::Carver measure;
    Buffers unused;
    carve(measure, unused);
    std::size_t own = measure.used();
    core::Carver c(workspace.first(own));
    Buffers b;
    carve(c, b);
    return {b, workspace.subspan(own)};
  }

  void check_arguments(Arguments const& a, bool shuffled) const {
    check(a.tokens >= 0 && a.tokens <= max_batch_, "ShuffledLayer: ", a.tokens, " tokens, the workspace holds ",
          max_batch_);
    check(a.tokens == 0 || (a.partial && a.y), "ShuffledLayer: input or output pointer is null");
    if (shuffled)
      check(a.predicted.size() == static_cast<std::size_t>(a.tokens), "ShuffledLayer: ", a.predicted.size(),
            " predictions for ", a.tokens, " tokens");
  }

  void run_inner(float const* rows, std::size_t count, int first_token, Buffers& b, std::span<std::byte> inner) {
    for (std::size_t i = 0; i < count * h; ++i) b.x[i] = from_float<T>(rows[i]);
    layer_->run({.tokens = static_cast<int>(count), .x = b.x.data(), .y = b.y.data(), .first_token = first_token},
                inner);
    mine_ = count;
  }

  void gather(std::vector<std::size_t> const& counts, Buffers& b, std::span<T> out) {
    std::vector<std::size_t> bytes(counts.size());
    for (std::size_t r = 0; r < counts.size(); ++r) bytes[r] = counts[r] * h * sizeof(T);
    layer_->comm().all_gather_v(std::as_bytes(b.y.first(mine_ * h)), std::as_writable_bytes(out), bytes);
  }

  InnerLayer* layer_;
  int max_batch_;
  std::size_t mine_ = 0;
};

}  // namespace moe
