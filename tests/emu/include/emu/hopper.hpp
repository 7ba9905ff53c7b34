#pragma once
// moe-emu models of the sm_90a PTX the Hopper grouped GEMM uses (include/moe/kernels/
// grouped_gemm_sm90.cuh gives its asm wrappers these bodies under MOE_CUDA_EMULATOR). Written from
// the PTX ISA; the address model is checked against CuTe's layouts by tests/test_emu_hopper.cpp,
// so that it does not rest on one reading of the ISA alone.
//
// cp.async (PTX ISA, "Data Movement and Conversion Instructions: cp.async", and
// "cp.async.commit_group" / "cp.async.wait_group"): a non-blocking copy of 16 bytes from global to
// shared memory (with a source size of 0 the destination is zero-filled). The copies a thread
// issues join its current, open group; commit_group closes that group (an empty one too);
// wait_group N returns when at most the N most recent committed groups of the thread are still
// pending. Model: at issue the 16 destination bytes are poisoned (0xff: NaN as bf16 and as fp32)
// and the copy is recorded; it happens (the source is read then) at the wait_group that retires its
// group. So a missing or too-weak wait reads poison, and a wgmma that reads bytes whose copy is
// still pending is an emulator error naming the copying thread.
//
// fence.proxy.async ("Parallel Synchronization and Communication Instructions: membar/fence"):
// wgmma reads shared memory through the async proxy; writes made through the generic proxy (the
// cp.async copies here) must be fenced by the writing thread before the async proxy reads them.
// Model: a copy retired by wait_group is "unfenced" until its thread executes the fence; a wgmma
// reading unfenced bytes is an emulator error.
//
// wgmma ("Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions"): every instruction
// is executed by the 128 threads of a warpgroup together (.sync.aligned), with the same operands.
//  - wgmma.fence orders the warpgroup's earlier register accesses before later mma_async; it is
//    required before the first mma_async and before an mma_async on accumulators the threads have
//    accessed since (chained mma_async on the same accumulator need none). Model: an mma_async
//    that starts a new accumulator chain needs a wgmma.fence after the last time accumulators were
//    handed back to the threads.
//  - mma_async D = A * B (+ D) is asynchronous: it joins the warpgroup's open wgmma-group.
//    commit_group closes that group; wait_group N waits until at most N groups are pending. Model:
//    at issue the accumulator registers are taken away from the threads (copied into a per-
//    warpgroup tile, the registers poisoned with NaN); the product is computed when the wait_group
//    that retires its group runs, reading the A and B operands from shared memory then (so shared
//    memory overwritten while an mma is in flight gives wrong results), in k order in fp32; when
//    the last mma of an accumulator chain retires, the tile goes back into the registers.
//  - Matrix descriptors ("Matrix Descriptor Format" in "Shared Memory Matrix Layout"): a 64-bit
//    value with the start address (bits 0-13), the leading dimension byte offset (bits 16-29) and
//    the stride dimension byte offset (bits 32-45), each a byte count divided by 16; a base offset
//    (bits 49-51) and the swizzle mode (bits 62-63: 0 none, 1 128-byte, 2 64-byte, 3 32-byte).
//    For a K-major operand in the 128-byte swizzle, each row of the operand (an M row of A, an N
//    row of B) is 128 bytes long, 8 rows form a 1024-byte pattern, and consecutive groups of 8
//    rows are the stride byte offset apart; the leading byte offset is not used (K of one
//    instruction, 16 bf16 = 32 bytes, lies inside the 128-byte row). The swizzle permutes the
//    16-byte chunks of each 128-byte row: address bits 4-6 are XORed with bits 7-9 (chunk c of
//    row r of a 1024-byte-aligned pattern is stored at chunk c ^ (r mod 8)). Only this mode, with
//    a pattern-aligned start (base offset 0), is modelled; anything else is an emulator error.
//  - Accumulator fragment of m64nNk16 with fp32 D ("Register Fragments" of wgmma, matrix D): warp w
//    of the warpgroup holds rows 16 w .. 16 w + 15; lane l holds, for j = 0 .. N/8 - 1, the
//    registers d[4 j + 2 h + e] = D(16 w + l / 4 + 8 h, 8 j + 2 (l mod 4) + e), h, e in {0, 1}.

#include <cstdint>

#include "emu/where.hpp"

namespace emu::sm90 {

/// True unless MOE_EMU_SM90A=0: the emulated program then behaves as one built without sm_90a code
/// (the library's probe reports no Hopper kernel), so the tests can check that fallback too.
bool sm90a_code();

// ----- matrix descriptors and the 128-byte swizzle (plain functions, usable outside kernels) -----

struct Descriptor {
  std::uint32_t start = 0;     ///< start address in bytes (shared window)
  std::uint32_t leading = 0;   ///< leading dimension byte offset
  std::uint32_t stride = 0;    ///< stride dimension byte offset
  unsigned base_offset = 0;    ///< bits 49-51
  unsigned swizzle = 0;        ///< bits 62-63: 0 none, 1 128B, 2 64B, 3 32B
};
constexpr Descriptor decode(std::uint64_t d) {
  Descriptor r;
  r.start = static_cast<std::uint32_t>(d & 0x3FFFu) << 4;
  r.leading = static_cast<std::uint32_t>((d >> 16) & 0x3FFFu) << 4;
  r.stride = static_cast<std::uint32_t>((d >> 32) & 0x3FFFu) << 4;
  r.base_offset = static_cast<unsigned>((d >> 49) & 7u);
  r.swizzle = static_cast<unsigned>((d >> 62) & 3u);
  return r;
}
/// The 128-byte swizzle of a shared-memory byte address: bits 4-6 XOR bits 7-9.
constexpr std::uint32_t swizzle128(std::uint32_t addr) { return addr ^ (((addr >> 7) & 7u) << 4); }

/// Shared-memory byte address of element (row, k) of a K-major 16-bit operand of one wgmma
/// instruction (row: m of A or n of B; k: 0 .. 15) described by `desc`. Throws std::logic_error
/// (kernel_fail inside a kernel) for a mode the emulator does not model.
std::uint32_t kmajor_address(std::uint64_t desc, int row, int k);

// ----- cp.async (per thread) -----
/// cp.async.cg.shared.global [dst], [src], 16, src_bytes (src_bytes 16: copy, 0: zero-fill).
void cp_async16(std::uint32_t dst, void const* src, int src_bytes,
                ::emu::Where where = ::emu::Where::current());
/// cp.async.commit_group
void cp_async_commit();
/// cp.async.wait_group n
void cp_async_wait(int n);
/// fence.proxy.async.shared::cta
void fence_proxy_async();

// ----- wgmma (warpgroup collectives) -----
void wgmma_fence(::emu::Where where = ::emu::Where::current());
void wgmma_commit(::emu::Where where = ::emu::Where::current());
void wgmma_wait(int n, ::emu::Where where = ::emu::Where::current());
/// wgmma.mma_async.sync.aligned.m64n{n}k16.f32.bf16.bf16 with both operands in shared memory,
/// K-major (no transposition), scale-a = scale-b = 1: D (64 x n) = A (64 x 16) * B (n x 16)^T, plus
/// D when scale_d. `d` is this thread's n / 2 accumulator registers.
void wgmma_mma_bf16(int n, float* d, std::uint64_t a_desc, std::uint64_t b_desc, bool scale_d,
                    ::emu::Where where = ::emu::Where::current());

/// Row and column of register i of lane `lane` of warp `warp` (0-3 in the warpgroup) in the 64 x N
/// accumulator of m64nNk16 (fp32).
constexpr int fragment_row(int warp, int lane, int i) { return 16 * warp + lane / 4 + 8 * ((i / 2) % 2); }
constexpr int fragment_col(int lane, int i) { return 8 * (i / 4) + 2 * (lane % 4) + i % 2; }

}  // namespace emu::sm90
