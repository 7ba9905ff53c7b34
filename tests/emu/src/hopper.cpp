// moe-emu: the sm_90a PTX models of emu/hopper.hpp (cp.async groups, fence.proxy.async, wgmma
// groups, mma_async on shared-memory descriptors with the 128-byte swizzle). The semantics and the
// PTX ISA sections they follow are described in the header.
//
// State lives per block on the worker that runs it (one OS thread runs one block at a time) and is
// reset when a new block starts (emu::block_serial): per thread its open and committed cp.async
// groups, per warpgroup its open and committed wgmma groups and the accumulators in flight, and per
// 16-byte chunk of dynamic shared memory whether a cp.async to it is pending or retired but not yet
// fenced for the async proxy.

#include "emu/hopper.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "emu/core.hpp"

namespace emu::sm90 {

bool sm90a_code() {
  static bool const on = [] {
    char const* e = std::getenv("MOE_EMU_SM90A");
    return !(e && std::strcmp(e, "0") == 0);
  }();
  return on;
}

namespace {

std::string hex32(std::uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", v);
  return b;
}

struct Copy {
  std::uint32_t dst;
  char const* src;
  bool full;
};

struct ThreadAsync {
  std::vector<Copy> open;                 // issued, not yet committed
  std::deque<std::vector<Copy>> groups;   // committed, oldest first
  std::vector<std::uint32_t> unfenced;    // chunks this thread's retired copies wrote, not yet fenced
};

/// One accumulator chain in flight: the 64 x n tile taken from the warpgroup's registers.
struct Acc {
  int n = 0;
  std::vector<float> tile;  // row-major 64 x n
  float* regs[128] = {};
  int pending = 0;          // mma_async of this chain not yet retired
};

struct Mma {
  std::uint64_t a, b;
  bool scale_d;
  Acc* acc;
  ::emu::Where where;
};

struct Warpgroup {
  std::vector<Mma> open;
  std::deque<std::vector<Mma>> groups;
  std::map<float*, std::unique_ptr<Acc>> acc;  // keyed by the warpgroup's first thread's registers
  bool fenced = false;
};

struct Block {
  std::uint64_t serial = 0;
  std::vector<ThreadAsync> threads;
  std::unique_ptr<Warpgroup[]> groups;   // one per warpgroup (and one for a partial tail)
  std::size_t smem_bytes = 0;
  std::vector<std::uint16_t> pending;     // per 16-byte chunk: copies issued and not retired
  std::vector<std::int16_t> pending_by;   // the thread that issued the latest of them
  std::vector<std::int16_t> unfenced_by;  // the thread whose retired copy is not fenced yet, or -1
};

thread_local Block tl_block;

Block& block() {
  std::uint64_t const s = ::emu::block_serial();
  Block& b = tl_block;
  if (b.serial != s) {
    b.serial = s;
    int const threads = ::emu::self().block_threads;
    b.threads.assign(static_cast<std::size_t>(threads), ThreadAsync{});
    b.groups = std::make_unique<Warpgroup[]>(static_cast<std::size_t>(threads / 128 + 1));
    b.smem_bytes = ::emu::dynamic_shared_bytes();
    std::size_t const chunks = b.smem_bytes / 16 + 1;
    b.pending.assign(chunks, 0);
    b.pending_by.assign(chunks, -1);
    b.unfenced_by.assign(chunks, -1);
  }
  return b;
}

int me() { return ::emu::self().linear; }

void retire_copies(Block& b, std::vector<Copy> const& group, int thread) {
  auto& t = b.threads[static_cast<std::size_t>(thread)];
  for (Copy const& c : group) {
    void* dst = ::emu::shared_pointer(c.dst, 16);
    if (c.full) std::memcpy(dst, c.src, 16);
    else std::memset(dst, 0, 16);
    std::size_t const chunk = c.dst / 16;
    --b.pending[chunk];
    b.unfenced_by[chunk] = static_cast<std::int16_t>(thread);
    t.unfenced.push_back(static_cast<std::uint32_t>(chunk));
  }
}

std::string at(char const* what, ::emu::Where const& where) {
  std::string f = where.file_name();
  auto slash = f.rfind('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return std::string(what) + " (" + f + ":" + std::to_string(where.line()) + ")";
}

/// The 16-byte chunk at a shared address (16-byte aligned), read by the async proxy (wgmma) as eight
/// bf16 values: the bytes must have no pending cp.async and no retired-but-unfenced one.
void async_read_chunk(Block const& b, std::uint32_t addr, float* out, char const* operand, ::emu::Where const& where) {
  if (std::size_t{addr} + 16 > b.smem_bytes)
    ::emu::kernel_fail(at("wgmma.mma_async", where) + ": operand " + operand + " reads shared address " + hex32(addr) + ", outside the " +
                       std::to_string(b.smem_bytes) + " bytes of dynamic shared memory");
  std::size_t const chunk = addr / 16;
  if (b.pending[chunk] != 0)
    ::emu::kernel_fail(at("wgmma.mma_async", where) + ": operand " + operand + " reads shared address " + hex32(addr) +
                       " while a cp.async of thread " + std::to_string(b.pending_by[chunk]) +
                       " to it is still pending (no cp.async.wait_group retired it)");
  if (b.unfenced_by[chunk] >= 0)
    ::emu::kernel_fail(at("wgmma.mma_async", where) + ": operand " + operand + " reads shared address " + hex32(addr) +
                       " written by a cp.async of thread " + std::to_string(b.unfenced_by[chunk]) +
                       " that has not executed fence.proxy.async since");
  std::uint16_t bits[8];
  std::memcpy(bits, static_cast<unsigned char const*>(::emu::dynamic_shared()) + addr, 16);
  for (int i = 0; i < 8; ++i) {
    std::uint32_t const f = static_cast<std::uint32_t>(bits[i]) << 16;
    std::memcpy(out + i, &f, 4);
  }
}

/// Row `row` (k = 0 .. 15) of a K-major operand. kmajor_address(desc, row, k) for k = 0 .. 7 lies in
/// one 16-byte chunk and k = 8 .. 15 in the next one: the row's logical start is 16-byte aligned and the
/// 128-byte swizzle moves whole 16-byte chunks. So the row is two chunk reads.
void read_operand_row(Block const& b, std::uint64_t desc, int row, float* out, char const* operand,
                      ::emu::Where const& where) {
  async_read_chunk(b, kmajor_address(desc, row, 0), out, operand, where);
  async_read_chunk(b, kmajor_address(desc, row, 8), out + 8, operand, where);
}

/// D (64 x n, fp32) = A (64 x 16) * B^T (n x 16) (+ D). Each output is summed in k order, 0 to 15,
/// one rounded product at a time (the emulator builds with -ffp-contract=off): the loops run k outside
/// the output columns so that the compiler can vectorise across columns, and every sum is added in
/// the order it would be with k innermost.
/// Without the sanitizers' checks: the operand reads check their shared addresses themselves
/// (async_read_chunk, instrumented), and the rest is arithmetic on the model's fixed-size arrays.
/// Instrumented, this loop was half of an ASan run of the bf16 layer tests (test_cuda_layer_emu,
/// "each grouped-GEMM kernel (bf16)": 41 s, 26 s without, on the 2-core CI machine).
__attribute__((no_sanitize("address", "undefined"))) void compute(Block const& b, Mma const& m) {
  Acc& acc = *m.acc;
  int const n = acc.n;
  static thread_local float A[64][16], Bt[16][256], row[16];
  for (int r = 0; r < 64; ++r) read_operand_row(b, m.a, r, A[r], "A", m.where);
  for (int c = 0; c < n; ++c) {
    read_operand_row(b, m.b, c, row, "B", m.where);
    for (int k = 0; k < 16; ++k) Bt[k][c] = row[k];
  }
  constexpr int cols = 64;  // n is 128 or 256: whole blocks of 64 columns, summed in registers
  for (int r = 0; r < 64; ++r) {
    float* out = acc.tile.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
    for (int c0 = 0; c0 < n; c0 += cols) {
      float s[cols];
      for (int j = 0; j < cols; ++j) s[j] = m.scale_d ? out[c0 + j] : 0.0f;
      for (int k = 0; k < 16; ++k) {
        float const a = A[r][k];
        float const* bk = Bt[k] + c0;
        for (int j = 0; j < cols; ++j) s[j] += a * bk[j];
      }
      for (int j = 0; j < cols; ++j) out[c0 + j] = s[j];
    }
  }
}

void give_back(Acc const& acc) {
  int const n = acc.n;
  for (int t = 0; t < 128; ++t)
    for (int i = 0; i < n / 2; ++i)
      acc.regs[t][i] = acc.tile[static_cast<std::size_t>(fragment_row(t / 32, t % 32, i)) * static_cast<std::size_t>(n) +
                                static_cast<std::size_t>(fragment_col(t % 32, i))];
}

}  // namespace

std::uint32_t kmajor_address(std::uint64_t desc, int row, int k) {
  Descriptor const d = decode(desc);
  if (d.swizzle != 1)
    ::emu::kernel_fail("wgmma descriptor " + hex32(static_cast<std::uint32_t>(desc >> 32)) + hex32(static_cast<std::uint32_t>(desc)).substr(2) +
                       ": swizzle mode " + std::to_string(d.swizzle) +
                       " is not modelled (the emulator models the 128-byte swizzle, mode 1)");
  if (d.base_offset != 0 || ((d.start >> 7) & 7u) != 0)
    ::emu::kernel_fail("wgmma descriptor: start address " + hex32(d.start) + " with base offset " +
                       std::to_string(d.base_offset) +
                       " is not modelled (the start must lie in the first 128-byte row of a 1024-byte swizzle pattern)");
  if (d.stride == 0) ::emu::kernel_fail("wgmma descriptor: stride byte offset 0");
  std::uint32_t const logical = d.start + static_cast<std::uint32_t>(row / 8) * d.stride +
                                static_cast<std::uint32_t>(row % 8) * 128u + static_cast<std::uint32_t>(k) * 2u;
  return swizzle128(logical);
}

// ---------------------------------------------------------------------------------------------
// cp.async
// ---------------------------------------------------------------------------------------------
void cp_async16(std::uint32_t dst, void const* src, int src_bytes, ::emu::Where where) {
  Block& b = block();
  int const t = me();
  if (dst % 16 != 0)
    ::emu::kernel_fail(at("cp.async", where) + ": shared destination " + hex32(dst) + " is not 16-byte aligned");
  if (reinterpret_cast<std::uintptr_t>(src) % 16 != 0)
    ::emu::kernel_fail(at("cp.async", where) + ": global source is not 16-byte aligned");
  if (src_bytes != 0 && src_bytes != 16)
    ::emu::kernel_fail(at("cp.async", where) + ": source size " + std::to_string(src_bytes) +
                       " (the model handles 16 and 0)");
  void* p = ::emu::shared_pointer(dst, 16);
  std::memset(p, 0xff, 16);  // poison until the wait that retires the copy
  std::size_t const chunk = dst / 16;
  ++b.pending[chunk];
  b.pending_by[chunk] = static_cast<std::int16_t>(t);
  b.threads[static_cast<std::size_t>(t)].open.push_back(Copy{dst, static_cast<char const*>(src), src_bytes == 16});
}

void cp_async_commit() {
  Block& b = block();
  auto& t = b.threads[static_cast<std::size_t>(me())];
  t.groups.push_back(std::move(t.open));
  t.open.clear();
}

void cp_async_wait(int n) {
  Block& b = block();
  int const self = me();
  auto& t = b.threads[static_cast<std::size_t>(self)];
  while (t.groups.size() > static_cast<std::size_t>(n)) {
    std::vector<Copy> g = std::move(t.groups.front());
    t.groups.pop_front();
    retire_copies(b, g, self);
  }
}

void fence_proxy_async() {
  Block& b = block();
  int const self = me();
  auto& t = b.threads[static_cast<std::size_t>(self)];
  for (std::uint32_t c : t.unfenced)
    if (b.unfenced_by[c] == self) b.unfenced_by[c] = -1;
  t.unfenced.clear();
}

// ---------------------------------------------------------------------------------------------
// wgmma
// ---------------------------------------------------------------------------------------------
void wgmma_fence(::emu::Where where) {
  Block& b = block();
  Warpgroup& wg = b.groups[me() / 128];
  ::emu::group_collective(128, "wgmma.fence", nullptr, [&wg](void* const*) { wg.fenced = true; }, where);
}

void wgmma_commit(::emu::Where where) {
  Block& b = block();
  Warpgroup& wg = b.groups[me() / 128];
  ::emu::group_collective(128, "wgmma.commit_group", nullptr,
                          [&wg](void* const*) {
                            wg.groups.push_back(std::move(wg.open));
                            wg.open.clear();
                          },
                          where);
}

void wgmma_wait(int n, ::emu::Where where) {
  Block& b = block();
  Warpgroup& wg = b.groups[me() / 128];
  ::emu::group_collective(128, "wgmma.wait_group", &n,
                          [&b, &wg, where](void* const* threads) {
                            int const want = *static_cast<int const*>(threads[0]);
                            for (int t = 1; t < 128; ++t)
                              if (*static_cast<int const*>(threads[t]) != want)
                                ::emu::kernel_fail(at("wgmma.wait_group", where) + ": N differs between threads of the warpgroup");
                            while (wg.groups.size() > static_cast<std::size_t>(want)) {
                              std::vector<Mma> g = std::move(wg.groups.front());
                              wg.groups.pop_front();
                              for (Mma const& m : g) {
                                compute(b, m);
                                if (--m.acc->pending == 0) {
                                  give_back(*m.acc);
                                  wg.acc.erase(m.acc->regs[0]);
                                  wg.fenced = false;  // the registers are the threads' again
                                }
                              }
                            }
                          },
                          where);
}

void wgmma_mma_bf16(int n, float* d, std::uint64_t a_desc, std::uint64_t b_desc, bool scale_d, ::emu::Where where) {
  if (n != 128 && n != 256) ::emu::kernel_fail(at("wgmma.mma_async", where) + ": only m64n128k16 and m64n256k16 are modelled");
  Block& b = block();
  Warpgroup& wg = b.groups[me() / 128];
  struct Arg {
    int n;
    float* d;
    std::uint64_t a, b;
    bool scale_d;
  } mine{n, d, a_desc, b_desc, scale_d};
  ::emu::group_collective(
      128, "wgmma.mma_async", &mine,
      [&wg, where](void* const* threads) {
        auto const* first = static_cast<Arg const*>(threads[0]);
        for (int t = 1; t < 128; ++t) {
          auto const* o = static_cast<Arg const*>(threads[t]);
          if (o->n != first->n || o->a != first->a || o->b != first->b || o->scale_d != first->scale_d)
            ::emu::kernel_fail(at("wgmma.mma_async", where) + ": thread " + std::to_string(t) +
                               " of the warpgroup passes other operands (shape, descriptors or scale-d) than thread 0");
        }
        int const n = first->n;
        auto it = wg.acc.find(first->d);
        Acc* acc = nullptr;
        if (it == wg.acc.end()) {
          if (!wg.fenced)
            ::emu::kernel_fail(at("wgmma.mma_async", where) +
                               ": starts an accumulator chain without a wgmma.fence since the warpgroup last "
                               "accessed its registers");
          auto fresh = std::make_unique<Acc>();
          fresh->n = n;
          fresh->tile.assign(static_cast<std::size_t>(64 * n), 0.0f);
          for (int t = 0; t < 128; ++t) {
            fresh->regs[t] = static_cast<Arg const*>(threads[t])->d;
            for (int i = 0; i < n / 2; ++i) {
              fresh->tile[static_cast<std::size_t>(fragment_row(t / 32, t % 32, i)) * static_cast<std::size_t>(n) +
                          static_cast<std::size_t>(fragment_col(t % 32, i))] = fresh->regs[t][i];
              // Taken away until the wait that retires the chain: reading them meanwhile gives NaN.
              fresh->regs[t][i] = std::numeric_limits<float>::quiet_NaN();
            }
          }
          acc = fresh.get();
          wg.acc.emplace(first->d, std::move(fresh));
        } else {
          acc = it->second.get();
          if (acc->n != n)
            ::emu::kernel_fail(at("wgmma.mma_async", where) + ": accumulator registers in flight with another shape");
          for (int t = 0; t < 128; ++t)
            if (static_cast<Arg const*>(threads[t])->d != acc->regs[t])
              ::emu::kernel_fail(at("wgmma.mma_async", where) + ": thread " + std::to_string(t) +
                                 " names other accumulator registers than the chain in flight");
        }
        ++acc->pending;
        wg.open.push_back(Mma{first->a, first->b, first->scale_d, acc, where});
      },
      where);
}

}  // namespace emu::sm90
