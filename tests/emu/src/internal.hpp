#pragma once
// Between the emulator's block scheduler (device.cpp) and its runtime (runtime.cpp).

#include <cstddef>
#include <functional>
#include <string>

#include "emu/runtime.hpp"

namespace emu::detail {

/// One launch as the worker runs it.
struct KernelRun {
  void const* kernel = nullptr;
  char const* name = "";
  dim3 grid, block;
  std::size_t shared_bytes = 0;
  std::function<void()> body;   ///< one thread of the kernel
};

/// Runs every block of `k` on the calling OS thread. Returns false after a kernel error (divergence,
/// a failed contract, a trap); `error` then holds the message (already printed).
bool run_kernel(KernelRun const& k, std::string* error);

/// Demangled name of a kernel function (cached).
char const* kernel_name(void const* fn);

/// Records a sticky error on `device` with its message (first one wins) and prints the message.
void set_sticky(int device, cudaError_t e, std::string const& msg);

/// Counters of the scheduler, summed over workers.
void count(std::uint64_t kernels, std::uint64_t blocks, std::uint64_t switches);

}  // namespace emu::detail
