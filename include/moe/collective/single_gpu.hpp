#pragma once
// collective::SingleGpu: one GPU and no communication, rank 0 of 1. It is a Communicator and has
// none of the capabilities (collective/concept.hpp): the device path sees that it cannot exchange
// and keeps every record on the GPU (moe/layer/paths/device.cuh).

#include "moe/collective/concept.hpp"

namespace moe::collective {

struct SingleGpu {
  static constexpr Memory memory = Memory::device;
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
};

static_assert(Communicator<SingleGpu> && !Exchange<SingleGpu>);

}  // namespace moe::collective
