#pragma once
// Sanitizer hooks of the emulator: fiber switches announced to AddressSanitizer and
// ThreadSanitizer, explicit happens-before edges, and sections whose locks ThreadSanitizer must not
// treat as synchronisation (the emulator's own bookkeeping would otherwise order the device work it
// runs and hide the races the tests look for). All of it compiles to nothing without sanitizers.

#include <cstddef>

// g++ says AddressSanitizer is on with __SANITIZE_ADDRESS__, clang 14 only through __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define MOE_EMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MOE_EMU_ASAN 1
#endif
#endif

#if defined(MOE_EMU_ASAN)
extern "C" {
void __sanitizer_start_switch_fiber(void** fake_stack_save, void const* bottom, std::size_t size);
void __sanitizer_finish_switch_fiber(void* fake_stack_save, void const** bottom_old, std::size_t* size_old);
void __asan_unpoison_memory_region(void const volatile* addr, std::size_t size);
}
#endif

#if defined(MOE_EMU_TSAN)
extern "C" {
void* __tsan_get_current_fiber();
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_set_fiber_name(void* fiber, char const* name);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void AnnotateIgnoreSyncBegin(char const* file, int line);
void AnnotateIgnoreSyncEnd(char const* file, int line);
void AnnotateIgnoreReadsBegin(char const* file, int line);
void AnnotateIgnoreReadsEnd(char const* file, int line);
void AnnotateIgnoreWritesBegin(char const* file, int line);
void AnnotateIgnoreWritesEnd(char const* file, int line);
}
#endif

namespace emu::san {

/// Happens-before edge: everything the caller did before release(a) is ordered before everything
/// a thread (or fiber) does after a later acquire(a).
inline void release([[maybe_unused]] void* a) {
#if defined(MOE_EMU_TSAN)
  __tsan_release(a);
#endif
}
inline void acquire([[maybe_unused]] void* a) {
#if defined(MOE_EMU_TSAN)
  __tsan_acquire(a);
#endif
}

/// While alive, the calling thread's lock and unlock operations create no happens-before edges.
struct IgnoreSync {
#if defined(MOE_EMU_TSAN)
  IgnoreSync() { AnnotateIgnoreSyncBegin(__FILE__, __LINE__); }
  ~IgnoreSync() { AnnotateIgnoreSyncEnd(__FILE__, __LINE__); }
#else
  IgnoreSync() {}
#endif
  IgnoreSync(IgnoreSync const&) = delete;
  IgnoreSync& operator=(IgnoreSync const&) = delete;
};

/// While alive, ThreadSanitizer does not see the calling thread's memory accesses (allocations and
/// frees included). For the emulator's own structures that a lock hidden by IgnoreSync guards: the
/// lock orders them, but ThreadSanitizer cannot see it, and a stream's queue is grown by whichever
/// host thread enqueues (two in-process ranks on one device share its legacy stream).
struct IgnoreAccesses {
#if defined(MOE_EMU_TSAN)
  IgnoreAccesses() {
    AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
    AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
  }
  ~IgnoreAccesses() {
    AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
    AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
  }
#else
  IgnoreAccesses() {}
#endif
  IgnoreAccesses(IgnoreAccesses const&) = delete;
  IgnoreAccesses& operator=(IgnoreAccesses const&) = delete;
};

}  // namespace emu::san
