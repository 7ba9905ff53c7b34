// moe-emu block scheduler: CUDA threads as fibers on the worker that runs the launch.
//
// A block's threads are fibers with their own stacks, switched by a small assembly routine (callee-
// saved registers, the stack pointer, MXCSR and the x87 control word). The scheduler runs fibers
// round robin; a fiber runs until it waits (block barrier, warp or warpgroup rendezvous), exits or
// fails. When no fiber can run and some have not finished, the block is stuck: the message names
// every waiting thread and where it waits.
//
// Divergence rules (what the CUDA programming guide leaves undefined is an error here):
//  - __syncthreads: every thread of the block arrives at the same call site; a thread that exits
//    while others wait, or arrives after another has exited, is an error;
//  - warp operations: the caller is in the mask; every lane the mask names exists and has not
//    exited; lanes meet at the same operation with the same mask.
//
// Sanitizers: each fiber switch is announced to ASan (stack bounds) and TSan (one TSan fiber per
// CUDA thread, switched without synchronisation). Barriers create happens-before edges explicitly,
// alternating two sync objects per phase so that a thread running ahead into the next phase does
// not order a slow thread's accesses of the previous one. This file is compiled without TSan
// instrumentation: the scheduler's own state is outside TSan's view.

#include <sys/mman.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "internal.hpp"
#include "sanitizer.hpp"

// void moe_emu_switch(void** save_sp, void* next_sp): saves the callee-saved state on the current
// stack, stores the stack pointer in *save_sp and resumes the context whose stack pointer is next_sp.
// A new fiber's stack is prepared so that the switch "returns" into moe_emu_start with r12 = the
// fiber and r13 = the entry function.
asm(R"(
.text
.globl moe_emu_switch
.type moe_emu_switch,@function
.p2align 4
moe_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size moe_emu_switch,.-moe_emu_switch

.globl moe_emu_start
.type moe_emu_start,@function
.p2align 4
moe_emu_start:
  movq %r12, %rdi
  callq *%r13
  ud2
.size moe_emu_start,.-moe_emu_start
.section .note.GNU-stack,"",@progbits
.text
)");
extern "C" void moe_emu_switch(void** save_sp, void* next_sp);
extern "C" void moe_emu_start();

namespace emu::detail {

namespace {

constexpr int max_threads = 1024;

std::size_t stack_bytes() {
  static std::size_t const bytes = [] {
    std::size_t kb = 0;
    if (char const* e = std::getenv("MOE_EMU_STACK_KB")) kb = std::strtoul(e, nullptr, 10);
#if defined(MOE_EMU_ASAN) || defined(MOE_EMU_TSAN)
    if (kb == 0) kb = 512;
#else
    if (kb == 0) kb = 128;
#endif
    return kb * 1024;
  }();
  return bytes;
}

struct Rendezvous;

enum class State { ready, waiting, done, abandoned };

struct Fiber {
  void* sp = nullptr;
  char* stack = nullptr;       // lowest usable byte (a guard page lies below)
  std::size_t stack_size = 0;
  void* tsan = nullptr;
  void* fake_stack = nullptr;  // ASan fake stack of this fiber while it is switched out
  bool dirty = false;          // abandoned mid-run: unpoison the stack before reuse
  ThreadInfo info{};
  State state = State::ready;
  // What it waits at (block barrier: rv == nullptr and at_block).
  bool at_block = false;
  ::emu::Where where;
  Rendezvous* rv = nullptr;
};

/// A warp (or warpgroup) rendezvous in progress.
struct Rendezvous {
  bool active = false;
  int first = 0;               // first thread of the scope (warp * 32 or group start)
  int count = 0;               // threads in the scope (32 or the group size)
  unsigned mask = 0;           // warps: the lanes taking part; groups: unused
  unsigned arrived_mask = 0;   // warps
  int arrived = 0;
  char const* what = "";
  ::emu::Where where;
  void* ptrs[max_threads > 128 ? 128 : max_threads] = {};
  unsigned phase = 0;
  char hb[2] = {};             // TSan sync objects, alternating per phase
};

struct Worker {
  std::vector<Fiber> fibers;
  void* sched_sp = nullptr;
  void* sched_tsan = nullptr;
  void const* sched_stack_bottom = nullptr;
  std::size_t sched_stack_size = 0;
  void* sched_fake = nullptr;

  // The block in progress.
  KernelRun const* run = nullptr;
  int threads = 0;
  // Runnable fibers: a ring sized before the block starts (no allocation while fibers run; each
  // fiber is queued at most once at a time).
  std::vector<int> ready;
  std::size_t head = 0, tail = 0;
  int done = 0;
  int first_done = -1;     // first thread that exited
  // block barrier
  int bar_arrived = 0;
  ::emu::Where bar_where;
  int bar_first = -1;
  unsigned bar_phase = 0;
  char bar_hb[2] = {};
  char start_hb = 0, end_hb = 0;
  std::uint64_t block_serial = 0;  // the block in progress (unique in the process; see emu::block_serial)
  // warp rendezvous: one per warp at a time (disjoint masks of one warp use extra slots)
  std::vector<Rendezvous> warp_rv;   // [warps * 4]
  std::vector<Rendezvous> group_rv;  // [threads / 128 + 1]
  // shared memory
  std::unique_ptr<unsigned char, void (*)(void*)> smem{nullptr, std::free};
  std::size_t smem_capacity = 0;
  std::size_t smem_bytes = 0;
  // failure
  bool failed = false;
  std::string error;
  std::uint64_t switches = 0;

  ~Worker() {
    for (auto& f : fibers) {
      if (f.stack) munmap(f.stack - static_cast<std::size_t>(getpagesize()), f.stack_size + static_cast<std::size_t>(getpagesize()));
#if defined(MOE_EMU_TSAN)
      if (f.tsan) __tsan_destroy_fiber(f.tsan);
#endif
    }
  }
};

thread_local Worker* tl_worker = nullptr;
thread_local Fiber* tl_fiber = nullptr;

// Frees the worker when its thread ends.
struct WorkerReaper {
  ~WorkerReaper() {
    delete tl_worker;
    tl_worker = nullptr;
  }
};
thread_local WorkerReaper tl_reaper;

Worker& worker() {
  if (!tl_worker) {
    tl_worker = new Worker();  // one per OS thread that runs kernels; lives with it
    (void)&tl_reaper;          // constructs the thread's reaper (thread_locals start on first use)
  }
  return *tl_worker;
}

std::string dim_str(uint3 v) {
  // Appended piece by piece: g++ 12 warns (-Wrestrict, a false positive) on "(" + std::string.
  std::string s = "(";
  s += std::to_string(v.x);
  s += ',';
  s += std::to_string(v.y);
  s += ',';
  s += std::to_string(v.z);
  s += ')';
  return s;
}
std::string where_str(::emu::Where const& w) {
  std::string f = w.file_name();
  auto slash = f.rfind('/');
  if (slash != std::string::npos) f = f.substr(slash + 1);
  return f + ":" + std::to_string(w.line());
}
std::string hex(unsigned v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%08x", v);
  return b;
}

void switch_to_scheduler(Worker& w, Fiber& f, bool exiting) {
#if defined(MOE_EMU_ASAN)
  __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake_stack, w.sched_stack_bottom, w.sched_stack_size);
#else
  (void)exiting;
#endif
#if defined(MOE_EMU_TSAN)
  __tsan_switch_to_fiber(w.sched_tsan, 1);
#endif
  moe_emu_switch(&f.sp, w.sched_sp);
  // Resumed by the scheduler.
#if defined(MOE_EMU_ASAN)
  __sanitizer_finish_switch_fiber(f.fake_stack, &w.sched_stack_bottom, &w.sched_stack_size);
#endif
}

/// Thrown through the failing fiber's frames so that they are destroyed before it is abandoned.
struct KernelAbort {};

/// The calling fiber stops for good (error or divergence): the message is recorded (the first
/// error of the launch wins), the fiber's stack unwinds to fiber_main, and the scheduler abandons
/// the block.
[[noreturn]] void fail_here(std::string const& msg) {
  Worker& w = worker();
  Fiber& f = *tl_fiber;
  if (!w.failed) {
    w.failed = true;
    std::string const& name = w.run ? std::string(w.run->name) : std::string("?");
    w.error = "moe-emu: kernel " + name + ", block " + dim_str(f.info.block) + ", thread " + dim_str(f.info.thread) +
              ": " + msg;
  }
  throw KernelAbort{};
}

std::string thread_name(Fiber const& f) { return "thread " + dim_str(f.info.thread); }

/// Suspends the calling fiber until the scheduler resumes it.
void wait_here(Worker& w, Fiber& f) {
  f.state = State::waiting;
  switch_to_scheduler(w, f, false);
}

void make_ready(Worker& w, int i) {
  w.fibers[static_cast<std::size_t>(i)].state = State::ready;
  w.ready[w.tail++ % w.ready.size()] = i;
}

/// The warp operation in progress that names this lane, if any.
Rendezvous* find_warp_rv(Worker& w, int warp, int lane) {
  for (std::size_t i = static_cast<std::size_t>(warp) * 4; i < static_cast<std::size_t>(warp) * 4 + 4; ++i) {
    auto& rv = w.warp_rv[i];
    if (rv.active && (rv.mask & (1u << lane))) return &rv;
  }
  return nullptr;
}

/// The warpgroup collective in progress that includes this thread, if any. A group collective always
/// spans the 128 threads from (linear / 128) * 128 (group_collective refuses any other shape), so
/// the slot alone says whether it names the thread.
Rendezvous* find_group_rv(Worker& w, int linear) {
  auto& rv = w.group_rv[static_cast<std::size_t>(linear / 128)];
  return rv.active ? &rv : nullptr;
}

/// Checks at a thread's exit: nobody may be waiting for it.
void exit_checks(Worker& w, Fiber const& f) {
  if (w.bar_arrived > 0) {
    Fiber const& other = w.fibers[static_cast<std::size_t>(w.bar_first)];
    fail_here("exited while " + thread_name(other) + " waits at __syncthreads (" + where_str(other.where) + ")");
  }
  // Only this thread's warp (its four rendezvous slots) and its warpgroup can wait for it.
  if (auto const* rv = find_warp_rv(w, f.info.warp, f.info.lane))
    fail_here("exited while lanes " + hex(rv->arrived_mask) + " of its warp wait at " + rv->what + " (" +
              where_str(rv->where) + ") with mask " + hex(rv->mask) + ", which names this lane");
  if (auto const* rv = find_group_rv(w, f.info.linear))
    fail_here(std::string("exited while its warpgroup waits at ") + rv->what + " (" + where_str(rv->where) + ")");
}

void record_failure(Worker& w, Fiber const& f, char const* what) {
  if (w.failed) return;
  w.failed = true;
  w.error = "moe-emu: kernel " + std::string(w.run ? w.run->name : "?") + ", block " + dim_str(f.info.block) +
            ", thread " + dim_str(f.info.thread) + ": " + what;
}

extern "C" void fiber_main(Fiber* f) {
  Worker& w = worker();
#if defined(MOE_EMU_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &w.sched_stack_bottom, &w.sched_stack_size);
#endif
  san::acquire(&w.start_hb);
  bool aborted = false;
  try {
    w.run->body();
    exit_checks(w, *f);
  } catch (KernelAbort const&) {
    aborted = true;
  } catch (std::exception const&) {
    record_failure(w, *f, "an exception escaped the kernel");
    aborted = true;
  } catch (...) {
    record_failure(w, *f, "an exception escaped the kernel");
    aborted = true;
  }
  san::release(&w.end_hb);
  if (aborted) {
    f->state = State::abandoned;
  } else {
    f->state = State::done;
    ++w.done;
    if (w.first_done < 0) w.first_done = f->info.linear;
  }
  switch_to_scheduler(w, *f, true);
  std::abort();
}

void prepare_fiber(Worker& w, Fiber& f) {
  std::size_t const page = static_cast<std::size_t>(getpagesize());
  if (!f.stack) {
    f.stack_size = stack_bytes();
    void* m = mmap(nullptr, f.stack_size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) throw std::runtime_error("moe-emu: cannot map a fiber stack");
    mprotect(m, page, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting memory
    f.stack = static_cast<char*>(m) + page;
#if defined(MOE_EMU_TSAN)
    f.tsan = __tsan_create_fiber(0);
#endif
  }
#if defined(MOE_EMU_ASAN)
  if (f.dirty) __asan_unpoison_memory_region(f.stack, f.stack_size);
#endif
  f.dirty = false;
  f.fake_stack = nullptr;
  // Initial frame, read by moe_emu_switch: [mxcsr, fpucw] r15 r14 r13 r12 rbx rbp ret.
  auto top = reinterpret_cast<std::uintptr_t>(f.stack + f.stack_size) & ~std::uintptr_t{15};
  auto* x = reinterpret_cast<std::uint64_t*>(top - 16);  // x is 16-byte aligned after `ret`
  x[-1] = reinterpret_cast<std::uint64_t>(&moe_emu_start);
  x[-2] = 0;                                                   // rbp
  x[-3] = 0;                                                   // rbx
  x[-4] = reinterpret_cast<std::uint64_t>(&f);                 // r12: the fiber
  x[-5] = reinterpret_cast<std::uint64_t>(&fiber_main);        // r13: entry
  x[-6] = 0;                                                   // r14
  x[-7] = 0;                                                   // r15
  std::uint32_t csr[2] = {0x1f80u, 0x037fu};                   // default MXCSR and x87 control word
  std::memcpy(&x[-8], csr, 8);
  f.sp = &x[-8];
  (void)w;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Names.
// ---------------------------------------------------------------------------------------------
char const* kernel_name(void const* fn) {
  static std::mutex m;
  static auto* names = new std::map<void const*, std::string>();
  std::lock_guard lock(m);
  auto it = names->find(fn);
  if (it != names->end()) return it->second.c_str();
  std::string name;
  Dl_info info{};
  if (dladdr(fn, &info) && info.dli_sname) {
    int status = 0;
    char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    name = status == 0 && d ? d : info.dli_sname;
    std::free(d);
  } else if (info.dli_fname && info.dli_fbase) {
    // A local symbol (a kernel in an anonymous namespace): ask addr2line, once per kernel.
    char cmd[512];
    auto off = reinterpret_cast<std::uintptr_t>(fn) - reinterpret_cast<std::uintptr_t>(info.dli_fbase);
    std::snprintf(cmd, sizeof cmd, "addr2line -f -C -e '%s' 0x%lx 2>/dev/null",
                  info.dli_fname[0] ? info.dli_fname : "/proc/self/exe", static_cast<unsigned long>(off));
    if (FILE* p = popen(cmd, "r")) {
      char line[1024];
      if (std::fgets(line, sizeof line, p)) {
        name = line;
        while (!name.empty() && (name.back() == '\n' || name.back() == '\r')) name.pop_back();
        if (name == "??") name.clear();
      }
      pclose(p);
    }
  }
  if (name.empty()) {
    char b[32];
    std::snprintf(b, sizeof b, "kernel@%p", fn);
    name = b;
  }
  return names->emplace(fn, std::move(name)).first->second.c_str();
}

// ---------------------------------------------------------------------------------------------
// Running a launch.
// ---------------------------------------------------------------------------------------------
bool run_kernel(KernelRun const& k, std::string* error) {
  Worker& w = worker();
  int const threads = static_cast<int>(k.block.x * k.block.y * k.block.z);
  if (w.fibers.size() < static_cast<std::size_t>(threads)) w.fibers.resize(static_cast<std::size_t>(threads));
  int const warps = (threads + 31) / 32;
  w.warp_rv.assign(static_cast<std::size_t>(warps) * 4, Rendezvous{});
  w.group_rv.assign(static_cast<std::size_t>(threads / 128 + 1), Rendezvous{});
  std::size_t const smem_alloc = std::max<std::size_t>(k.shared_bytes, 16);
  if (w.smem_capacity < smem_alloc) {
    void* p = nullptr;
    if (posix_memalign(&p, 1024, smem_alloc) != 0) throw std::runtime_error("moe-emu: cannot allocate shared memory");
    w.smem.reset(static_cast<unsigned char*>(p));
    w.smem_capacity = smem_alloc;
  }
  w.smem_bytes = k.shared_bytes;
#if defined(MOE_EMU_TSAN)
  w.sched_tsan = __tsan_get_current_fiber();
#endif
  w.run = &k;
  w.threads = threads;
  w.failed = false;
  w.error.clear();
  std::uint64_t blocks = 0;
  std::uint64_t const switches0 = w.switches;

  for (unsigned bz = 0; bz < k.grid.z && !w.failed; ++bz)
    for (unsigned by = 0; by < k.grid.y && !w.failed; ++by)
      for (unsigned bx = 0; bx < k.grid.x && !w.failed; ++bx) {
        ++blocks;
        {
          static std::atomic<std::uint64_t> serials{0};
          w.block_serial = serials.fetch_add(1, std::memory_order_relaxed) + 1;
        }
        // Fresh shared memory contents are undefined on the GPU: fill them with a pattern that
        // is NaN as float and bf16 and -1 as an integer.
        std::memset(w.smem.get(), 0xff, w.smem_bytes);
        w.ready.assign(static_cast<std::size_t>(threads), -1);
        w.head = w.tail = 0;
        w.done = 0;
        w.first_done = -1;
        w.bar_arrived = 0;
        w.bar_first = -1;
        for (auto& rv : w.warp_rv) rv.active = false;
        for (auto& rv : w.group_rv) rv.active = false;
        san::release(&w.start_hb);
        for (int t = 0; t < threads; ++t) {
          Fiber& f = w.fibers[static_cast<std::size_t>(t)];
          prepare_fiber(w, f);
          unsigned tx = static_cast<unsigned>(t) % k.block.x;
          unsigned ty = (static_cast<unsigned>(t) / k.block.x) % k.block.y;
          unsigned tz = static_cast<unsigned>(t) / (k.block.x * k.block.y);
          f.info = ThreadInfo{{tx, ty, tz}, {bx, by, bz}, k.block, k.grid, t, t % 32, t / 32, threads, k.name};
          f.state = State::ready;
          f.rv = nullptr;
          f.at_block = false;
          w.ready[w.tail++ % w.ready.size()] = t;
        }
        while (w.head < w.tail && !w.failed) {
          int i = w.ready[w.head++ % w.ready.size()];
          Fiber& f = w.fibers[static_cast<std::size_t>(i)];
          if (f.state != State::ready) continue;
          tl_fiber = &f;
          detail::current = &f.info;
          ++w.switches;
#if defined(MOE_EMU_ASAN)
          __sanitizer_start_switch_fiber(&w.sched_fake, f.stack, f.stack_size);
#endif
#if defined(MOE_EMU_TSAN)
          __tsan_switch_to_fiber(f.tsan, 1);
#endif
          moe_emu_switch(&w.sched_sp, f.sp);
#if defined(MOE_EMU_ASAN)
          __sanitizer_finish_switch_fiber(w.sched_fake, nullptr, nullptr);
#endif
          tl_fiber = nullptr;
          detail::current = nullptr;
        }
        if (w.failed) break;
        if (w.done != threads) {
          // Stuck: every live thread waits and nobody can release it.
          std::ostringstream m;
          m << "moe-emu: kernel " << k.name << ", block " << dim_str({bx, by, bz})
            << ": divergence, no thread can proceed:";
          int listed = 0;
          for (int t = 0; t < threads && listed < 8; ++t) {
            Fiber const& f = w.fibers[static_cast<std::size_t>(t)];
            if (f.state != State::waiting) continue;
            ++listed;
            m << "\n  thread " << dim_str(f.info.thread) << " waits at ";
            if (f.at_block) {
              m << "__syncthreads (" << where_str(f.where) << ")";
            } else if (f.rv) {
              m << f.rv->what << " (" << where_str(f.rv->where) << ")";
              if (f.rv->count == 32) m << " with mask " << hex(f.rv->mask) << ", arrived " << hex(f.rv->arrived_mask);
            }
          }
          if (w.first_done >= 0) m << "\n  thread " << w.first_done << " (linear) has exited";
          w.failed = true;
          w.error = m.str();
          for (int t = 0; t < threads; ++t) w.fibers[static_cast<std::size_t>(t)].dirty = true;
        }
        san::acquire(&w.end_hb);
      }
  count(1, blocks, w.switches - switches0);
  w.run = nullptr;
  if (w.failed) {
    for (auto& f : w.fibers)
      if (f.state != State::done) f.dirty = true;
    *error = w.error;
    return false;
  }
  return true;
}

}  // namespace emu::detail

// ---------------------------------------------------------------------------------------------
// Primitives for device code and shims.
// ---------------------------------------------------------------------------------------------
namespace emu {

using namespace detail;

ThreadInfo const& self() { return detail::here(); }
bool in_kernel() { return tl_fiber != nullptr; }

void kernel_fail(std::string const& what) {
  if (!tl_fiber) throw std::logic_error("moe-emu: " + what);
  fail_here(what);
}

void block_barrier(::emu::Where where) {
  if (!tl_fiber) kernel_fail("__syncthreads outside a kernel");
  Worker& w = worker();
  Fiber& f = *tl_fiber;
  if (w.first_done >= 0)
    fail_here("waits at __syncthreads (" + where_str(where) + ") but thread " + std::to_string(w.first_done) +
              " (linear index) of the block has exited");
  if (f.rv)
    fail_here("waits at __syncthreads while inside a warp operation");
  if (w.bar_arrived > 0 && (std::strcmp(w.bar_where.file_name(), where.file_name()) != 0 || w.bar_where.line() != where.line())) {
    Fiber const& other = w.fibers[static_cast<std::size_t>(w.bar_first)];
    fail_here("waits at __syncthreads (" + where_str(where) + ") while " + thread_name(other) +
              " waits at another __syncthreads (" + where_str(w.bar_where) + ")");
  }
  // A lane of this warp waiting in a warp operation that names this thread can never complete.
  if (auto* rv = find_warp_rv(w, f.info.warp, f.info.lane))
    fail_here("waits at __syncthreads (" + where_str(where) + ") while lanes " + hex(rv->arrived_mask) +
              " of its warp wait at " + rv->what + " (" + where_str(rv->where) + ") with mask " + hex(rv->mask));
  // Nor can its warpgroup's collective, if one has started.
  if (auto const* g = find_group_rv(w, f.info.linear))
    fail_here("waits at __syncthreads (" + where_str(where) + ") while its warpgroup waits at " + g->what + " (" +
              where_str(g->where) + ")");
  unsigned const phase = w.bar_phase;
  san::release(&w.bar_hb[phase & 1]);
  if (w.bar_arrived == 0) {
    w.bar_where = where;
    w.bar_first = f.info.linear;
  }
  ++w.bar_arrived;
  if (w.bar_arrived == w.threads) {
    w.bar_arrived = 0;
    w.bar_first = -1;
    ++w.bar_phase;
    for (int t = 0; t < w.threads; ++t) {
      Fiber& o = w.fibers[static_cast<std::size_t>(t)];
      if (o.state == State::waiting && o.at_block) {
        o.at_block = false;
        make_ready(w, t);
      }
    }
  } else {
    f.at_block = true;
    f.where = where;
    wait_here(w, f);
  }
  san::acquire(&w.bar_hb[phase & 1]);
}

namespace {

/// Common arrival logic of warp and group rendezvous. Returns after every participant arrived and
/// `fn` ran once.
void rendezvous(Worker& w, Fiber& f, Rendezvous& rv, int participants, void* mine,
                CollectiveFn fn) {
  int const slot = rv.count == 32 ? f.info.lane : f.info.linear - rv.first;
  rv.ptrs[slot] = mine;
  unsigned const phase = rv.phase;
  san::release(&rv.hb[phase & 1]);
  ++rv.arrived;
  if (rv.count == 32) rv.arrived_mask |= 1u << f.info.lane;
  if (rv.arrived == participants) {
    // The operation reads every participant's contribution and writes their results: it runs
    // after all their arrivals and before any of them continues.
    san::acquire(&rv.hb[phase & 1]);
    fn(rv.ptrs);
    san::release(&rv.hb[phase & 1]);
    ++rv.phase;
    rv.active = false;
    for (int t = rv.first; t < rv.first + rv.count && t < w.threads; ++t) {
      Fiber& o = w.fibers[static_cast<std::size_t>(t)];
      if (o.rv == &rv && &o != &f) {
        o.rv = nullptr;
        make_ready(w, t);
      }
    }
    f.rv = nullptr;
  } else {
    f.rv = &rv;
    wait_here(w, f);
  }
  san::acquire(&rv.hb[phase & 1]);
}

}  // namespace

void warp_collective(unsigned mask, char const* what, void* mine, CollectiveFn fn,
                     ::emu::Where where) {
  if (!tl_fiber) kernel_fail(std::string(what) + " outside a kernel");
  Worker& w = worker();
  Fiber& f = *tl_fiber;
  int const lane = f.info.lane, warp = f.info.warp;
  int const lanes_here = std::min(32, w.threads - warp * 32);
  unsigned const present = lanes_here == 32 ? 0xffffffffu : ((1u << lanes_here) - 1u);
  if (!(mask & (1u << lane)))
    fail_here(std::string(what) + " (" + where_str(where) + "): mask " + hex(mask) + " does not name the calling lane " +
              std::to_string(lane));
  if (mask & ~present)
    fail_here(std::string(what) + " (" + where_str(where) + "): mask " + hex(mask) + " names lanes that do not exist (warp " +
              std::to_string(warp) + " has " + std::to_string(lanes_here) + " lanes)");
  Rendezvous* rv = find_warp_rv(w, warp, lane);
  // Lanes named by the mask that have exited, or wait at __syncthreads, can never arrive. Checked when
  // the operation starts: afterwards a named lane that exits (exit_checks) or reaches __syncthreads
  // (block_barrier) fails there.
  for (int l = 0; !rv && l < lanes_here; ++l) {
    if (!(mask & (1u << l))) continue;
    Fiber const& o = w.fibers[static_cast<std::size_t>(warp * 32 + l)];
    if (o.state == State::done)
      fail_here(std::string(what) + " (" + where_str(where) + "): mask " + hex(mask) + " names lane " + std::to_string(l) +
                ", which has exited");
    if (o.state == State::waiting && o.at_block)
      fail_here(std::string(what) + " (" + where_str(where) + "): mask " + hex(mask) + " names lane " + std::to_string(l) +
                ", which waits at __syncthreads (" + where_str(o.where) + ")");
  }
  if (rv) {
    if (rv->mask != mask || (rv->what != what && std::strcmp(rv->what, what) != 0))
      fail_here(std::string(what) + " (" + where_str(where) + ") with mask " + hex(mask) + " while lanes " +
                hex(rv->arrived_mask) + " wait at " + rv->what + " (" + where_str(rv->where) + ") with mask " + hex(rv->mask));
  } else {
    for (std::size_t i = static_cast<std::size_t>(warp) * 4; i < static_cast<std::size_t>(warp) * 4 + 4; ++i) {
      auto& c = w.warp_rv[i];
      if (c.active && (c.mask & mask))
        fail_here(std::string(what) + " (" + where_str(where) + ") with mask " + hex(mask) + " overlaps lanes " +
                  hex(c.mask) + " waiting at " + c.what + " (" + where_str(c.where) + ")");
    }
    for (std::size_t i = static_cast<std::size_t>(warp) * 4; i < static_cast<std::size_t>(warp) * 4 + 4 && !rv; ++i)
      if (!w.warp_rv[i].active) rv = &w.warp_rv[i];
    if (!rv) fail_here(std::string(what) + ": more than 4 disjoint warp operations in flight in one warp");
    unsigned ph = rv->phase;
    char hb0 = rv->hb[0], hb1 = rv->hb[1];
    (void)hb0;
    (void)hb1;
    rv->active = true;
    rv->first = warp * 32;
    rv->count = 32;
    rv->mask = mask;
    rv->arrived_mask = 0;
    rv->arrived = 0;
    rv->what = what;
    rv->where = where;
    rv->phase = ph;
    std::fill(std::begin(rv->ptrs), std::begin(rv->ptrs) + 32, nullptr);
  }
  rendezvous(w, f, *rv, std::popcount(mask), mine, fn);
}

void group_collective(int count, char const* what, void* mine, CollectiveFn fn,
                      ::emu::Where where) {
  if (!tl_fiber) kernel_fail(std::string(what) + " outside a kernel");
  Worker& w = worker();
  Fiber& f = *tl_fiber;
  if (count != 128) fail_here(std::string(what) + ": group collectives are warpgroups of 128 threads");
  int const g = f.info.linear / count;
  if ((g + 1) * count > w.threads)
    fail_here(std::string(what) + " (" + where_str(where) + "): the block has " + std::to_string(w.threads) +
              " threads, not a whole warpgroup at thread " + std::to_string(g * count));
  Rendezvous& rv = w.group_rv[static_cast<std::size_t>(g)];
  // Checked when the collective starts, as for warp operations: a thread of the warpgroup that exits
  // or reaches __syncthreads afterwards fails there.
  for (int t = g * count; !rv.active && t < (g + 1) * count; ++t) {
    Fiber const& o = w.fibers[static_cast<std::size_t>(t)];
    if (o.state == State::done)
      fail_here(std::string(what) + " (" + where_str(where) + "): thread " + std::to_string(t) + " of the warpgroup has exited");
    if (o.state == State::waiting && o.at_block)
      fail_here(std::string(what) + " (" + where_str(where) + "): thread " + std::to_string(t) +
                " of the warpgroup waits at __syncthreads (" + where_str(o.where) + ")");
  }
  if (rv.active) {
    if (rv.what != what && std::strcmp(rv.what, what) != 0)
      fail_here(std::string(what) + " (" + where_str(where) + ") while its warpgroup waits at " + rv.what + " (" +
                where_str(rv.where) + ")");
  } else {
    rv.active = true;
    rv.first = g * count;
    rv.count = count;
    rv.arrived = 0;
    rv.what = what;
    rv.where = where;
  }
  rendezvous(w, f, rv, count, mine, fn);
}

std::uint64_t block_serial() {
  if (!tl_fiber) kernel_fail("block_serial outside a kernel");
  return worker().block_serial;
}

void* dynamic_shared() {
  if (!tl_fiber) kernel_fail("dynamic shared memory outside a kernel");
  return worker().smem.get();
}
std::size_t dynamic_shared_bytes() {
  if (!tl_fiber) kernel_fail("dynamic shared memory outside a kernel");
  return worker().smem_bytes;
}
std::uint32_t shared_address(void const* p) {
  Worker& w = worker();
  auto const* b = w.smem.get();
  auto const* c = static_cast<unsigned char const*>(p);
  if (!tl_fiber || c < b || c > b + w.smem_bytes)
    kernel_fail("__cvta_generic_to_shared: the pointer is not in the launch's dynamic shared memory");
  return static_cast<std::uint32_t>(c - b);
}
void* shared_pointer(std::uint32_t addr, std::size_t bytes) {
  Worker& w = worker();
  if (!tl_fiber || std::size_t{addr} + bytes > w.smem_bytes)
    kernel_fail("shared address " + std::to_string(addr) + " + " + std::to_string(bytes) + " bytes leaves the " +
                std::to_string(w.smem_bytes) + " bytes of dynamic shared memory");
  return w.smem.get() + addr;
}

namespace detail {

std::uint64_t shuffle(unsigned mask, char const* kind, std::uint64_t value, int src_lane, ::emu::Where where) {
  struct Arg {
    std::uint64_t value;
    int src;
    std::uint64_t out;
  } a{value, src_lane, 0};
  warp_collective(mask, kind, &a,
                  [mask, kind](void* const* lanes) {
                    for (int l = 0; l < 32; ++l) {
                      auto* me = static_cast<Arg*>(lanes[l]);
                      if (!me) continue;
                      if (me->src < 0 || me->src > 31 || !lanes[me->src])
                        kernel_fail(std::string(kind) + ": lane " + std::to_string(l) + " reads lane " +
                                    std::to_string(me->src) + ", which is not in the mask " + hex(mask));
                      me->out = static_cast<Arg*>(lanes[me->src])->value;
                    }
                  },
                  where);
  return a.out;
}

unsigned vote(unsigned mask, char const* kind, bool pred, ::emu::Where where) {
  struct Arg {
    bool pred;
    unsigned out;
  } a{pred, 0};
  warp_collective(mask, kind, &a,
                  [](void* const* lanes) {
                    unsigned ballot = 0;
                    for (int l = 0; l < 32; ++l)
                      if (lanes[l] && static_cast<Arg*>(lanes[l])->pred) ballot |= 1u << l;
                    for (int l = 0; l < 32; ++l)
                      if (lanes[l]) static_cast<Arg*>(lanes[l])->out = ballot;
                  },
                  where);
  return a.out;
}

std::uint32_t reduce(unsigned mask, char const* kind, ReduceOp op, bool is_signed, std::uint32_t value,
                     ::emu::Where where) {
  struct Arg {
    std::uint32_t value, out;
  } a{value, 0};
  warp_collective(mask, kind, &a,
                  [op, is_signed](void* const* lanes) {
                    bool first = true;
                    std::uint32_t r = 0;
                    for (int l = 0; l < 32; ++l) {
                      if (!lanes[l]) continue;
                      std::uint32_t v = static_cast<Arg*>(lanes[l])->value;
                      if (first) {
                        r = v, first = false;
                        continue;
                      }
                      bool less = is_signed ? static_cast<std::int32_t>(v) < static_cast<std::int32_t>(r) : v < r;
                      bool more = is_signed ? static_cast<std::int32_t>(v) > static_cast<std::int32_t>(r) : v > r;
                      switch (op) {
                        case ReduceOp::add: r += v; break;  // modulo 2^32, as the hardware's
                        case ReduceOp::min: r = less ? v : r; break;
                        case ReduceOp::max: r = more ? v : r; break;
                        case ReduceOp::and_: r &= v; break;
                        case ReduceOp::or_: r |= v; break;
                        case ReduceOp::xor_: r ^= v; break;
                      }
                    }
                    for (int l = 0; l < 32; ++l)
                      if (lanes[l]) static_cast<Arg*>(lanes[l])->out = r;
                  },
                  where);
  return a.out;
}

}  // namespace detail
}  // namespace emu
