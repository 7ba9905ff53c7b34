#pragma once
// The CuTe oracle of test_emu_hopper: CuTe's answers (layouts, descriptors, swizzle) as plain
// functions. cute_oracle.cpp is the only file that includes CuTe; it is compiled host-only with
// g++ against the CuTe headers of the PyPI package nvidia-cutlass (and the CUDA toolkit's headers
// they include), apart from the emulator's stand-ins for those headers (tests/emu/hopper.cmake).

#include <cstdint>

namespace cute_oracle {

/// Byte offset of bf16 element (row, k) in a `rows` x 64 tile of
/// tile_to_shape(GMMA::Layout_K_SW128_Atom<bfloat16_t>, (rows, 64)) whose first byte is
/// 1024-byte aligned (rows: 64, 128 or 256).
std::uint32_t sw128_offset(int rows, int row, int k);

/// CuTe's make_gmma_desc<Major::K> for the (sub_rows x 16) operand (sub, kk) of such a tile that
/// starts at shared address `tile_addr` (a multiple of 1024): the full 64-bit descriptor.
std::uint64_t kmajor_desc(int rows, int sub_rows, std::uint32_t tile_addr, int sub, int kk);

/// CuTe's GMMA::CLayout_64xN<n>(thread, value): the accumulator element m + 64 * col (n: 128, 256).
int clayout_64xn(int n, int thread, int value);

/// Swizzle<3,4,3> applied to a byte offset.
std::uint32_t swizzle_343(std::uint32_t offset);

/// The fields of a descriptor as CuTe's GmmaDescriptor bit-fields read them.
struct DescFields {
  std::uint32_t start, leading, stride, base_offset, layout_type;
};
DescFields fields(std::uint64_t desc);
/// GMMA::LayoutType::B128 as CuTe numbers it.
unsigned layout_b128();

}  // namespace cute_oracle
