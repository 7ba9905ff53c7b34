// Must NOT compile (ctest compile_fail_device_schedule): the device path runs its phases in one
// fixed order, so a schedule of the user's own, which the host path would honour, is refused with a
// message naming the problem. Built for the CUDA emulator; the control build (-DMOE_CONTROL) uses
// schedule::Sequential and must compile, so the failure is the schedule's alone.
#include <cuda_runtime.h>  // the emulator's (tests/emu/include), which defines MOE_CUDA_EMULATOR

#include "moe/moe.hpp"

struct MySchedule {
  static constexpr std::string_view name = "mine";
  template <class Pass>
  static void run(Pass& pass) {
    pass.route();
    pass.dispatch();
    pass.compute();
    pass.combine();
  }
};

#if defined(MOE_CONTROL)
using Schedule = moe::schedule::Sequential;
#else
using Schedule = MySchedule;
#endif

using S = moe::models::Reduced<moe::models::Mixtral8x7B, 32, 16, moe::DType::f32>;
using L = moe::Layer<S, moe::router::SoftmaxTopK, moe::placement::Table, moe::replication::None, Schedule,
                     moe::collective::SingleGpu>;

int main() { return static_cast<int>(sizeof(L)) > 0 ? 0 : 1; }
