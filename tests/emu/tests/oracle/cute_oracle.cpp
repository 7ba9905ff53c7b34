// CuTe's answers for test_emu_hopper (see cute_oracle.hpp). Host-only: CuTe's
// cast_smem_ptr_to_uint is pointed (CUTE_CVTA_GENERIC_TO_SHARED_ACTIVATED) at the function below,
// which maps a 1024-aligned host buffer standing for shared memory to shared-window addresses.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>

namespace {
// Shared memory as CuTe sees it here: 256 KiB, 1024-byte aligned; address = byte offset.
unsigned char* window() {
  static unsigned char* const base = [] {
    void* p = nullptr;
    if (posix_memalign(&p, 1024, 256 * 1024) != 0) throw std::bad_alloc();
    return static_cast<unsigned char*>(p);
  }();
  return base;
}
}  // namespace

std::size_t __cvta_generic_to_shared(void const* p) {
  auto const* c = static_cast<unsigned char const*>(p);
  if (c < window() || c >= window() + 256 * 1024) throw std::logic_error("cute_oracle: pointer outside the window");
  return static_cast<std::size_t>(c - window());
}

#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>

#include "cute_oracle.hpp"

namespace cute_oracle {

using namespace cute;
using bf = cute::bfloat16_t;

namespace {
template <int R>
auto tile(std::uint32_t addr) {
  return make_tensor(make_smem_ptr(reinterpret_cast<bf*>(window() + addr)),
                     tile_to_shape(GMMA::Layout_K_SW128_Atom<bf>{}, Shape<Int<R>, _64>{}));
}
template <int R>
std::uint32_t offset(int row, int k) {
  auto t = tile<R>(0);
  return static_cast<std::uint32_t>(reinterpret_cast<unsigned char const*>(&t(row, k)) - window());
}
template <int R, int S>
std::uint64_t desc(std::uint32_t addr, int sub, int kk) {
  auto t = tile<R>(addr);
  auto op = local_tile(t, Shape<Int<S>, _16>{}, make_coord(sub, kk));
  GmmaDescriptor d = GMMA::make_gmma_desc<GMMA::Major::K>(op);
  return d.desc_;
}
}  // namespace

std::uint32_t sw128_offset(int rows, int row, int k) {
  switch (rows) {
    case 64: return offset<64>(row, k);
    case 128: return offset<128>(row, k);
    case 256: return offset<256>(row, k);
    default: throw std::invalid_argument("cute_oracle::sw128_offset: rows");
  }
}

std::uint64_t kmajor_desc(int rows, int sub_rows, std::uint32_t tile_addr, int sub, int kk) {
  if (rows == 128 && sub_rows == 64) return desc<128, 64>(tile_addr, sub, kk);
  if (rows == 256 && sub_rows == 256) return desc<256, 256>(tile_addr, sub, kk);
  if (rows == 256 && sub_rows == 128) return desc<256, 128>(tile_addr, sub, kk);
  if (rows == 64 && sub_rows == 64) return desc<64, 64>(tile_addr, sub, kk);
  throw std::invalid_argument("cute_oracle::kmajor_desc: shape");
}

int clayout_64xn(int n, int thread, int value) {
  if (n == 128) return static_cast<int>(GMMA::CLayout_64xN<128>{}(thread, value));
  if (n == 256) return static_cast<int>(GMMA::CLayout_64xN<256>{}(thread, value));
  throw std::invalid_argument("cute_oracle::clayout_64xn: n");
}

std::uint32_t swizzle_343(std::uint32_t offset) { return static_cast<std::uint32_t>(Swizzle<3, 4, 3>{}(offset)); }

DescFields fields(std::uint64_t d) {
  GmmaDescriptor g(d);
  return {static_cast<std::uint32_t>(g.bitfield.start_address_) << 4,
          static_cast<std::uint32_t>(g.bitfield.leading_byte_offset_) << 4,
          static_cast<std::uint32_t>(g.bitfield.stride_byte_offset_) << 4, g.bitfield.base_offset_,
          g.bitfield.layout_type_};
}

unsigned layout_b128() { return static_cast<unsigned>(GMMA::LayoutType::B128); }

}  // namespace cute_oracle
