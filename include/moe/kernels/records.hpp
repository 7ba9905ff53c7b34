#pragma once
// The dispatch record, the one format every layer path sends a token to an expert rank in:
//
//   [int32 token, int32 count, int32 expert[k], float weight[k]]   the metadata (`count` of the k
//                                                                   entries used, the rest zero)
//   padding to 16 bytes (the sequential paths and every CUDA kernel; the host disaggregated
//   executor packs the metadata without it)
//   the token's hidden row in storage precision, padded to 16 bytes (the one-GPU device path sends
//   the metadata alone: its experts read the rows from x)
//
// `token` is the index in the sender's batch, `count` how many of the token's experts the receiver
// serves (1 without de-duplication), `expert` and `weight` those experts and their gate weights.
// The host paths and the CUDA kernels (dispatch.cuh packs and groups, combine.cuh combines) read
// and write it through the accessors below; those the kernels use are host-device functions on
// records that start 16-byte aligned (the kernels' records always do).

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "moe/config.hpp"

namespace moe::detail {

struct RecordHeader {
  std::int32_t token;
  std::int32_t count;
};

constexpr std::size_t round16(std::size_t n) { return (n + 15) / 16 * 16; }

/// Bytes of the metadata for top_k experts, without padding.
constexpr std::size_t record_meta_bytes_unpadded(int top_k) {
  return sizeof(RecordHeader) + static_cast<std::size_t>(top_k) * (sizeof(std::int32_t) + sizeof(float));
}
/// Bytes of the metadata for top_k experts, padded to 16 bytes (the payload's alignment).
constexpr std::size_t record_meta_bytes(int top_k) { return round16(record_meta_bytes_unpadded(top_k)); }

/// Where a record's expert ids and gate weights lie (writable, for packing in place).
MOE_HOST_DEVICE inline std::int32_t* record_experts(std::byte* record) {
  return reinterpret_cast<std::int32_t*>(record + sizeof(RecordHeader));
}
MOE_HOST_DEVICE inline float* record_weights(std::byte* record, int top_k) {
  return reinterpret_cast<float*>(record + sizeof(RecordHeader) + static_cast<std::size_t>(top_k) * sizeof(std::int32_t));
}
MOE_HOST_DEVICE inline std::int32_t const* record_experts(std::byte const* record) {
  return reinterpret_cast<std::int32_t const*>(record + sizeof(RecordHeader));
}
MOE_HOST_DEVICE inline float const* record_weights(std::byte const* record, int top_k) {
  return reinterpret_cast<float const*>(record + sizeof(RecordHeader) +
                                        static_cast<std::size_t>(top_k) * sizeof(std::int32_t));
}
/// The header of an aligned record, in place (the kernels' records).
MOE_HOST_DEVICE inline RecordHeader* record_header(std::byte* record) { return reinterpret_cast<RecordHeader*>(record); }
MOE_HOST_DEVICE inline RecordHeader const* record_header(std::byte const* record) {
  return reinterpret_cast<RecordHeader const*>(record);
}
inline void write_record_header(std::byte* record, int token, int count) {
  RecordHeader hdr{token, count};
  std::memcpy(record, &hdr, sizeof(hdr));
}

/// Writes a record's metadata: token, the `experts.size()` experts it names and their weights;
/// the rest of the `meta_bytes` is zeroed.
inline void write_record_meta(std::byte* out, std::size_t meta_bytes, int top_k, int token,
                              std::span<std::int32_t const> experts, std::span<float const> weights) {
  std::memset(out, 0, meta_bytes);
  write_record_header(out, token, static_cast<int>(experts.size()));
  std::memcpy(record_experts(out), experts.data(), experts.size_bytes());
  std::memcpy(record_weights(out, top_k), weights.data(), weights.size_bytes());
}

/// Read access to one received record.
class RecordView {
public:
  RecordView(std::byte const* record, int top_k) : p_(record), k_(top_k) {}
  [[nodiscard]] RecordHeader header() const {
    RecordHeader h;
    std::memcpy(&h, p_, sizeof(h));
    return h;
  }
  [[nodiscard]] std::int32_t const* experts() const { return record_experts(p_); }
  [[nodiscard]] float const* weights() const { return record_weights(p_, k_); }

private:
  std::byte const* p_;
  int k_;
};

}  // namespace moe::detail
