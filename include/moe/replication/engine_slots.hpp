// An engine's physical expert slots as the copy table of the per-batch split.
//
// SGLang and vLLM lay one MoE layer's experts out as a flat table `phy2log`: GPUs x slots per GPU
// entries, GPU-major, each naming the logical expert the slot holds (EPLB's output). An expert may
// sit in several slots, on several GPUs and, after some plans, twice on one GPU. EngineSlots reads
// that table into what replication::BatchSplit splits over (the GPUs holding each expert, each
// GPU's server) and keeps the way back: the slot of expert e on GPU g that serves the pairs the
// split sends there (the lowest such slot; two slots of one expert on one GPU serve as one copy,
// since a rank's load is what the split balances). The host binding (python/src/bindings.cpp,
// moe_compose.BatchSplit) and the device form (kernels::cuda::DeviceSlotSplit) both start here.
// (placement::SlotMap, moe/plan/slot_map.hpp, is the plan files' form of the same tables, every
// layer at once with the experts given; this is one layer at serving time, the experts read from
// the table.)
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "moe/config.hpp"
#include "moe/replication/batch_split.hpp"

namespace moe::replication {

class EngineSlots {
public:
  /// Most slots a table may have (a bound on what the input alone makes this allocate).
  static constexpr long long max_slots = 1LL << 28;
  /// Most GPUs (the split's rank numbers are int; its arcs grow with copies per expert).
  static constexpr long long max_gpus = 1LL << 16;

  EngineSlots() = default;
  /// `phy2log`: gpus x (phy2log.size() / gpus) slots, GPU-major, each the logical expert it holds
  /// (0 .. experts - 1, every one present at least once). `gpus_per_server`: GPUs g and h share a
  /// server when g / gpus_per_server == h / gpus_per_server. Throws moe::Error naming the entry
  /// on anything else.
  EngineSlots(std::span<std::int64_t const> phy2log, long long gpus, long long gpus_per_server) {
    check(gpus >= 1 && gpus <= max_gpus, "engine slots: num_gpus must be in [1, ", max_gpus, "], got ", gpus);
    check(gpus_per_server >= 1, "engine slots: gpus_per_server must be positive, got ", gpus_per_server);
    check(gpus % gpus_per_server == 0, "engine slots: num_gpus (", gpus, ") is not a multiple of gpus_per_server (",
          gpus_per_server, ")");
    auto P = static_cast<long long>(phy2log.size());
    check(P >= 1 && P <= max_slots, "engine slots: phy2log must have between 1 and ", max_slots, " slots, got ", P);
    check(P % gpus == 0, "engine slots: phy2log's ", P, " slots do not split over ", gpus, " GPUs");
    long long E = 0;
    for (long long p = 0; p < P; ++p) {
      auto v = phy2log[static_cast<std::size_t>(p)];
      check(v >= 0 && v < P, "engine slots: phy2log[", p, "] = ", v, " is outside [0, ", P, ") (slots hold experts)");
      E = std::max<long long>(E, v + 1);
    }
    // E <= P <= max_slots and gpus <= max_gpus; the table below is E x gpus ints, so bound it too.
    check(E * gpus <= max_slots, "engine slots: ", E, " experts x ", gpus, " GPUs is above the limit of ", max_slots,
          " (expert, GPU) entries");
    gpus_ = static_cast<int>(gpus);
    experts_ = static_cast<int>(E);
    long long const per_gpu = P / gpus;
    slot_of_.assign(static_cast<std::size_t>(E * gpus), -1);
    copies_.assign(static_cast<std::size_t>(E), {});
    for (long long p = 0; p < P; ++p) {
      auto e = static_cast<std::size_t>(phy2log[static_cast<std::size_t>(p)]);
      int g = static_cast<int>(p / per_gpu);
      auto at = e * static_cast<std::size_t>(gpus_) + static_cast<std::size_t>(g);
      if (slot_of_[at] >= 0) continue;  // a second slot of e on GPU g: the first serves
      slot_of_[at] = static_cast<int>(p);
      copies_[e].push_back(g);
    }
    for (long long e = 0; e < E; ++e)
      check(!copies_[static_cast<std::size_t>(e)].empty(), "engine slots: phy2log has no slot for expert ", e,
            " (experts are 0 .. ", E - 1, ", the largest id in phy2log)");
    server_.resize(static_cast<std::size_t>(gpus_));
    for (int g = 0; g < gpus_; ++g) server_[static_cast<std::size_t>(g)] = g / static_cast<int>(gpus_per_server);
  }

  [[nodiscard]] int gpus() const { return gpus_; }
  [[nodiscard]] int experts() const { return experts_; }
  /// The GPUs holding each expert, in GPU order (one entry per GPU, however many slots it has there).
  [[nodiscard]] std::vector<std::vector<int>> const& copies() const { return copies_; }
  /// The server of each GPU.
  [[nodiscard]] std::vector<int> const& servers() const { return server_; }
  /// experts x gpus, expert-major: the slot serving expert e's pairs on GPU g, or -1 if g holds no
  /// copy of e.
  [[nodiscard]] std::vector<int> const& slot_table() const { return slot_of_; }
  [[nodiscard]] int slot_of(int expert, int gpu) const {
    return slot_of_[static_cast<std::size_t>(expert) * static_cast<std::size_t>(gpus_) + static_cast<std::size_t>(gpu)];
  }
  /// The per-batch split over these copies and servers (`slack_permille`: see split::Layout; in
  /// [0, 1000000], checked here before it narrows to BatchSplit's int).
  [[nodiscard]] BatchSplit split(long long slack_permille = 0) const {
    check(gpus_ > 0, "engine slots: built from nothing (default-constructed)");
    check(slack_permille >= 0 && slack_permille <= 1000000, "engine slots: slack_permille must be in [0, 1000000], got ",
          slack_permille);
    return BatchSplit(copies_, server_, static_cast<int>(slack_permille));
  }

private:
  int gpus_ = 0, experts_ = 0;
  std::vector<int> slot_of_;
  std::vector<std::vector<int>> copies_;
  std::vector<int> server_;
};

}  // namespace moe::replication
