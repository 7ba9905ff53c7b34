// The emulator's CUB, cuBLAS and WMMA shims: results against brute-force loops written here, and
// each contract of the real library (as its documentation states it) enforced: a violation is the
// documented error code plus a message naming the rule, or a kernel error inside a kernel.

#include <catch2/catch.hpp>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

template <class T>
T* device_alloc(std::size_t n) {
  T* p = nullptr;
  REQUIRE(cudaMalloc(&p, std::max<std::size_t>(n, 1) * sizeof(T)) == cudaSuccess);
  return p;
}
template <class T>
std::vector<T> download(T const* p, std::size_t n) {
  std::vector<T> v(n);
  if (n) REQUIRE(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return v;
}
template <class T>
void upload(T* p, std::vector<T> const& v) {
  if (!v.empty()) REQUIRE(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
}

/// What the calling thread writes to stderr (emu::diagnose) while it lives.
class StderrCapture {
public:
  StderrCapture() {
    std::fflush(stderr);
    saved_ = dup(2);
    file_ = std::tmpfile();
    dup2(fileno(file_), 2);
  }
  ~StderrCapture() {
    restore();
    std::fclose(file_);
  }
  std::string text() {
    restore();
    std::string s;
    std::rewind(file_);
    char buf[512];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) s.append(buf, n);
    return s;
  }

private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  int saved_ = -1;
  std::FILE* file_ = nullptr;
};

/// Checks that `text` holds every part.
void has_all(std::string const& text, std::vector<std::string> const& parts) {
  INFO(text);
  for (auto const& p : parts) CHECK(text.find(p) != std::string::npos);
}

/// Expects the last launch to have failed with a kernel error whose message holds every part.
void expect_kernel_error(std::vector<std::string> const& parts) {
  REQUIRE(cudaDeviceSynchronize() == cudaErrorLaunchFailure);
  has_all(emu::last_kernel_error(), parts);
  emu::reset_errors();
  REQUIRE(cudaGetLastError() == cudaSuccess);
}

// =============================================================================================
// CUB BlockScan.
// =============================================================================================

template <int B>
__global__ void block_scan_kernel(int const* in, int* excl, int* excl_agg, int* incl, int* incl_agg, int* agg1,
                                  int* agg2) {
  using Scan = cub::BlockScan<int, B>;
  __shared__ typename Scan::TempStorage tmp;
  int const i = static_cast<int>(blockIdx.x) * B + static_cast<int>(threadIdx.x);
  int const v = in[i];
  int a = 0, b = 0, c = 0, d = 0, t1 = 0, t2 = 0;
  Scan(tmp).ExclusiveSum(v, a);
  __syncthreads();
  Scan(tmp).ExclusiveSum(v, b, t1);
  __syncthreads();
  Scan(tmp).InclusiveSum(v, c);
  __syncthreads();
  Scan(tmp).InclusiveSum(v, d, t2);
  excl[i] = a;
  excl_agg[i] = b;
  incl[i] = c;
  incl_agg[i] = d;
  agg1[i] = t1;
  agg2[i] = t2;
}

__global__ void block_scan_wrong_size_kernel(int* out) {
  using Scan = cub::BlockScan<int, 128>;
  __shared__ Scan::TempStorage tmp;
  int r = 0;
  Scan(tmp).ExclusiveSum(1, r);
  out[threadIdx.x] = r;
}

__global__ void block_scan_skipped_kernel(int* out) {
  using Scan = cub::BlockScan<int, 64>;
  __shared__ Scan::TempStorage tmp;
  int r = -1;
  if (threadIdx.x != 5) Scan(tmp).ExclusiveSum(1, r);
  out[threadIdx.x] = r;
}

/// Two scans on one TempStorage with (`barrier`) or without the __syncthreads CUB requires between.
__global__ void block_scan_reuse_kernel(int const* in, int* first, int* second, int* agg, bool barrier) {
  using Scan = cub::BlockScan<int, 64>;
  __shared__ Scan::TempStorage tmp;
  int const t = static_cast<int>(threadIdx.x);
  int a = 0, b = 0, total = 0;
  Scan(tmp).ExclusiveSum(in[t], a);
  if (barrier) __syncthreads();
  Scan(tmp).ExclusiveSum(in[t] * 100 + 1, b, total);
  first[t] = a;
  second[t] = b;
  agg[t] = total;
}

template <int B>
void check_block_scan(int blocks, std::mt19937& rng) {
  int const n = blocks * B;
  std::uniform_int_distribution<int> dist(-50, 50);
  std::vector<int> h(static_cast<std::size_t>(n));
  for (auto& v : h) v = dist(rng);
  int* in = device_alloc<int>(n);
  upload(in, h);
  std::vector<int*> out(6);
  for (auto& p : out) p = device_alloc<int>(n);
  REQUIRE(emu::kernel_launch(block_scan_kernel<B>, dim3(blocks), dim3(B), 0, nullptr, in, out[0], out[1], out[2], out[3],
                             out[4], out[5]) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<std::vector<int>> got;
  for (auto* p : out) got.push_back(download(p, n));
  int bad = 0;
  for (int blk = 0; blk < blocks; ++blk) {
    int total = 0;
    for (int t = 0; t < B; ++t) total += h[static_cast<std::size_t>(blk * B + t)];
    int run = 0;
    for (int t = 0; t < B; ++t) {
      auto const i = static_cast<std::size_t>(blk * B + t);
      int const excl = run;
      run += h[i];
      bad += got[0][i] != excl;
      bad += got[1][i] != excl;
      bad += got[2][i] != run;
      bad += got[3][i] != run;
      bad += got[4][i] != total;  // every thread receives the block aggregate
      bad += got[5][i] != total;
    }
  }
  CHECK(bad == 0);
  cudaFree(in);
  for (auto* p : out) cudaFree(p);
}

TEST_CASE("cub::BlockScan: exclusive and inclusive sums with and without the block aggregate", "[shims][cub]") {
  std::mt19937 rng(7);
  check_block_scan<32>(3, rng);
  check_block_scan<96>(2, rng);  // not a power of two
  check_block_scan<256>(5, rng);
}

TEST_CASE("cub::BlockScan: a block of another size, a thread that skips the scan", "[shims][cub][errors]") {
  int* out = device_alloc<int>(128);
  SECTION("blockDim differs from BLOCK_THREADS") {
    REQUIRE(emu::kernel_launch(block_scan_wrong_size_kernel, dim3(1), dim3(96), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"block_scan_wrong_size_kernel", "cub::BlockScan<128>", "block of 96 threads"});
  }
  SECTION("one thread does not call the block-wide collective") {
    REQUIRE(emu::kernel_launch(block_scan_skipped_kernel, dim3(1), dim3(64), 0, nullptr, out) == cudaSuccess);
    expect_kernel_error({"block_scan_skipped_kernel", "__syncthreads"});
  }
  cudaFree(out);
}

// Without the barrier the second scan overwrites TempStorage while threads of the first still read
// it: a wrong result here (and a data race for ThreadSanitizer, hence [errors]).
TEST_CASE("cub::BlockScan: reusing TempStorage needs a __syncthreads in between", "[shims][cub][errors]") {
  std::vector<int> h(64);
  for (int t = 0; t < 64; ++t) h[static_cast<std::size_t>(t)] = (t * 7) % 11 + 1;
  int* in = device_alloc<int>(64);
  upload(in, h);
  int *first = device_alloc<int>(64), *second = device_alloc<int>(64), *agg = device_alloc<int>(64);
  auto wrong = [&](bool barrier) {
    REQUIRE(emu::kernel_launch(block_scan_reuse_kernel, dim3(1), dim3(64), 0, nullptr, in, first, second, agg, barrier) ==
            cudaSuccess);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    auto f = download(first, 64), s = download(second, 64), a = download(agg, 64);
    int e1 = 0, e2 = 0, total = 0, bad = 0;
    for (int t = 0; t < 64; ++t) total += h[static_cast<std::size_t>(t)] * 100 + 1;
    for (int t = 0; t < 64; ++t) {
      auto const i = static_cast<std::size_t>(t);
      bad += f[i] != e1;
      bad += s[i] != e2;
      bad += a[i] != total;
      e1 += h[i];
      e2 += h[i] * 100 + 1;
    }
    return bad;
  };
  CHECK(wrong(true) == 0);
  CHECK(wrong(false) > 0);
  cudaFree(in);
  cudaFree(first);
  cudaFree(second);
  cudaFree(agg);
}

// =============================================================================================
// CUB DeviceScan::ExclusiveSum.
// =============================================================================================

TEST_CASE("cub::DeviceScan::ExclusiveSum: size query, results, in place, stream order", "[shims][cub]") {
  std::mt19937 rng(11);
  for (int n : {0, 1, 7, 2047, 2049, 100003}) {
    INFO("num_items " << n);
    std::vector<int> h(static_cast<std::size_t>(n));
    for (auto& v : h) v = static_cast<int>(rng() % 1000) - 300;
    int* in = device_alloc<int>(n);
    int* out = device_alloc<int>(n);
    upload(in, h);
    // Phase 1: nothing but the size (null operands are fine).
    std::size_t bytes = 0;
    REQUIRE(cub::DeviceScan::ExclusiveSum(nullptr, bytes, static_cast<int const*>(nullptr), static_cast<int*>(nullptr), n) ==
            cudaSuccess);
    CHECK(bytes > 0);
    std::size_t again = 0;
    REQUIRE(cub::DeviceScan::ExclusiveSum(nullptr, again, in, out, n) == cudaSuccess);
    CHECK(again == bytes);
    void* temp = device_alloc<unsigned char>(bytes);
    cudaStream_t s;
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cub::DeviceScan::ExclusiveSum(temp, bytes, in, out, n, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    auto got = download(out, static_cast<std::size_t>(n));
    int run = 0, bad = 0;
    for (int i = 0; i < n; ++i) {
      bad += got[static_cast<std::size_t>(i)] != run;
      run += h[static_cast<std::size_t>(i)];
    }
    CHECK(bad == 0);
    // In place (d_in == d_out), as the documentation allows.
    REQUIRE(cub::DeviceScan::ExclusiveSum(temp, bytes, in, in, n, s) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(download(in, static_cast<std::size_t>(n)) == got);
    cudaStreamDestroy(s);
    cudaFree(temp);
    cudaFree(in);
    cudaFree(out);
  }
}

TEST_CASE("cub::DeviceScan::ExclusiveSum runs in stream order (a captured call runs at graph launch)", "[shims][cub]") {
  int const n = 1000;
  std::vector<int> h(n, 2);
  int* in = device_alloc<int>(n);
  int* out = device_alloc<int>(n);
  upload(in, h);
  REQUIRE(cudaMemset(out, 0, n * sizeof(int)) == cudaSuccess);
  std::size_t bytes = 0;
  REQUIRE(cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, out, n) == cudaSuccess);
  void* temp = device_alloc<unsigned char>(bytes);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  REQUIRE(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  REQUIRE(cub::DeviceScan::ExclusiveSum(temp, bytes, in, out, n, s) == cudaSuccess);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(s, &g) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download(out, n)[n - 1] == 0);  // captured, not run
  cudaGraphExec_t x;
  REQUIRE(cudaGraphInstantiate(&x, g, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(x, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  CHECK(download(out, n)[n - 1] == 2 * (n - 1));
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  cudaStreamDestroy(s);
  cudaFree(temp);
  cudaFree(in);
  cudaFree(out);
}

TEST_CASE("cub::DeviceScan::ExclusiveSum contract: temp size, device operands, overlap", "[shims][cub]") {
  int const n = 5000;
  int* in = device_alloc<int>(n);
  int* out = device_alloc<int>(n);
  REQUIRE(cudaMemset(in, 0, n * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMemset(out, 0x7f, n * sizeof(int)) == cudaSuccess);
  std::size_t bytes = 0;
  REQUIRE(cub::DeviceScan::ExclusiveSum(nullptr, bytes, in, out, n) == cudaSuccess);
  unsigned char* temp = device_alloc<unsigned char>(bytes + 4096);
  SECTION("too-small temporary storage") {
    std::size_t small = bytes - 1;
    StderrCapture err;
    CHECK(cub::DeviceScan::ExclusiveSum(temp, small, in, out, n) == cudaErrorInvalidValue);
    has_all(err.text(), {"cub::DeviceScan::ExclusiveSum", "temp_storage_bytes = " + std::to_string(bytes - 1)});
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(download(out, 1)[0] == 0x7f7f7f7f);  // nothing ran
  }
  SECTION("temporary storage that is not device memory") {
    std::vector<unsigned char> host(bytes);
    StderrCapture err;
    CHECK(cub::DeviceScan::ExclusiveSum(host.data(), bytes, in, out, n) == cudaErrorInvalidValue);
    has_all(err.text(), {"d_temp_storage", "device memory"});
  }
  SECTION("a host pointer as d_in, a too-short d_out") {
    std::vector<int> host(n);
    StderrCapture err;
    CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, host.data(), out, n) == cudaErrorInvalidValue);
    CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, in, out + 1, n) == cudaErrorInvalidValue);
    has_all(err.text(), {"d_in is not 5000 items of device memory", "d_out is not 5000 items"});
  }
  SECTION("partly overlapping operands, temp storage inside an operand") {
    StderrCapture err;
    CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, in, in + 1, n - 1) == cudaErrorInvalidValue);
    CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, reinterpret_cast<int*>(temp + 64), out, 16) == cudaErrorInvalidValue);
    has_all(err.text(), {"overlap without being equal", "d_temp_storage overlaps d_in"});
  }
  SECTION("negative num_items") {
    StderrCapture err;
    CHECK(cub::DeviceScan::ExclusiveSum(temp, bytes, in, out, -1) == cudaErrorInvalidValue);
    has_all(err.text(), {"num_items"});
  }
  cudaFree(temp);
  cudaFree(in);
  cudaFree(out);
}

// =============================================================================================
// CUB DeviceRadixSort::SortPairs.
// =============================================================================================

/// Sorts (keys, values) with SortPairs over bits [lo, hi) and checks it against a stable sort of
/// the indices by those bits of the keys' order-preserving unsigned image.
void check_sort(std::vector<int> const& keys, int lo, int hi, cudaStream_t s) {
  int const n = static_cast<int>(keys.size());
  INFO("num_items " << n << ", bits [" << lo << ", " << hi << ")");
  std::vector<int> vals(keys.size());
  std::iota(vals.begin(), vals.end(), 1000);
  int *k_in = device_alloc<int>(keys.size()), *k_out = device_alloc<int>(keys.size());
  int *v_in = device_alloc<int>(keys.size()), *v_out = device_alloc<int>(keys.size());
  upload(k_in, keys);
  upload(v_in, vals);
  std::size_t bytes = 0;
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k_in, k_out, v_in, v_out, n, lo, hi, s) == cudaSuccess);
  CHECK(bytes > 0);
  void* temp = device_alloc<unsigned char>(bytes);
  REQUIRE(cub::DeviceRadixSort::SortPairs(temp, bytes, k_in, k_out, v_in, v_out, n, lo, hi, s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(s) == cudaSuccess);
  // Reference: insertion sort (stable by construction) on the selected bits.
  auto bits = [&](int k) {
    std::uint32_t u = static_cast<std::uint32_t>(k) ^ 0x80000000u;  // signed order as unsigned
    std::uint64_t m = hi - lo >= 32 ? 0xffffffffull : ((1ull << (hi - lo)) - 1);
    return (static_cast<std::uint64_t>(u) >> lo) & m;
  };
  std::vector<int> order;
  for (int i = 0; i < n; ++i) {
    auto at = order.end();
    while (at != order.begin() && bits(keys[static_cast<std::size_t>(*(at - 1))]) > bits(keys[static_cast<std::size_t>(i)]))
      --at;
    order.insert(at, i);
  }
  auto gk = download(k_out, keys.size()), gv = download(v_out, keys.size());
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    auto const o = static_cast<std::size_t>(order[static_cast<std::size_t>(i)]);
    bad += gk[static_cast<std::size_t>(i)] != keys[o];
    bad += gv[static_cast<std::size_t>(i)] != vals[o];
  }
  CHECK(bad == 0);
  cudaFree(temp);
  cudaFree(k_in);
  cudaFree(k_out);
  cudaFree(v_in);
  cudaFree(v_out);
}

TEST_CASE("cub::DeviceRadixSort::SortPairs: bit ranges, stable on ties, signed keys", "[shims][cub]") {
  std::mt19937 rng(3);
  cudaStream_t s;
  REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  for (int n : {0, 1, 2, 13, 1001}) {
    std::vector<int> ties(static_cast<std::size_t>(n)), wide(static_cast<std::size_t>(n));
    for (auto& k : ties) k = static_cast<int>(rng() % 9);  // many equal keys
    for (auto& k : wide) k = static_cast<int>(rng());      // negative keys too
    check_sort(ties, 0, 32, s);
    check_sort(ties, 0, 4, s);
    check_sort(ties, 1, 3, s);  // bit 0 ignored: 2k and 2k+1 tie and keep their input order
    check_sort(ties, 2, 2, s);  // no bits: the input order
    check_sort(wide, 0, 32, s);
    check_sort(wide, 8, 20, s);
  }
  // Keys that differ only outside the range keep their input order.
  check_sort({0x100, 0x001, 0x200, 0x000, 0x101}, 8, 12, s);
  cudaStreamDestroy(s);
}

TEST_CASE("cub::DeviceRadixSort::SortPairs contract: temp size, bit range, device operands", "[shims][cub]") {
  int const n = 300;
  int *k_in = device_alloc<int>(n), *k_out = device_alloc<int>(n), *v_in = device_alloc<int>(n), *v_out = device_alloc<int>(n);
  REQUIRE(cudaMemset(k_in, 0, n * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMemset(v_in, 0, n * sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMemset(k_out, 0x7f, n * sizeof(int)) == cudaSuccess);
  std::size_t bytes = 0;
  REQUIRE(cub::DeviceRadixSort::SortPairs(nullptr, bytes, k_in, k_out, v_in, v_out, n) == cudaSuccess);
  CHECK(bytes >= n * 2 * sizeof(int));  // CUB keeps alternate key and value buffers
  CHECK(download(k_out, 1)[0] == 0x7f7f7f7f);  // the size query ran nothing
  unsigned char* temp = device_alloc<unsigned char>(bytes);
  SECTION("too-small temporary storage") {
    std::size_t small = bytes / 2;
    StderrCapture err;
    CHECK(cub::DeviceRadixSort::SortPairs(temp, small, k_in, k_out, v_in, v_out, n) == cudaErrorInvalidValue);
    has_all(err.text(), {"cub::DeviceRadixSort::SortPairs", "temp_storage_bytes", "needs " + std::to_string(bytes)});
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    CHECK(download(k_out, 1)[0] == 0x7f7f7f7f);
  }
  SECTION("bad bit ranges") {
    StderrCapture err;
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k_in, k_out, v_in, v_out, n, 0, 33) == cudaErrorInvalidValue);
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k_in, k_out, v_in, v_out, n, 9, 8) == cudaErrorInvalidValue);
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k_in, k_out, v_in, v_out, n, -1, 8) == cudaErrorInvalidValue);
    std::size_t q = 0;
    CHECK(cub::DeviceRadixSort::SortPairs(nullptr, q, k_in, k_out, v_in, v_out, n, 0, 40) == cudaErrorInvalidValue);
    has_all(err.text(), {"bits [0, 33) of a 32-bit key", "bits [9, 8)", "bits [-1, 8)"});
  }
  SECTION("host memory as an operand, a too-short operand") {
    std::vector<int> host(n);
    StderrCapture err;
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k_in, k_out, v_in, host.data(), n) == cudaErrorInvalidValue);
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k_in + 1, k_out, v_in, v_out, n) == cudaErrorInvalidValue);
    has_all(err.text(), {"d_values_out is not 300 items of device memory", "d_keys_in is not 300 items"});
  }
  SECTION("in-place or overlapping buffers") {
    StderrCapture err;
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k_in, k_in, v_in, v_out, n) == cudaErrorInvalidValue);
    CHECK(cub::DeviceRadixSort::SortPairs(temp, bytes, k_in, k_out, reinterpret_cast<int*>(temp), v_out, 10) ==
          cudaErrorInvalidValue);
    has_all(err.text(), {"overlap", "d_temp_storage overlaps d_values_in"});
  }
  cudaFree(temp);
  for (int* p : {k_in, k_out, v_in, v_out}) cudaFree(p);
}

// =============================================================================================
// cuBLAS.
// =============================================================================================

/// C = alpha op(A) op(B) + beta C in double, column-major, as the cuBLAS documentation defines it.
std::vector<double> gemm_reference(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, double alpha,
                                   std::vector<float> const& A, int lda, std::vector<float> const& B, int ldb,
                                   double beta, std::vector<float> const& C, int ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < m; ++i) {
      double acc = 0;
      for (int p = 0; p < k; ++p) {
        double a = ta == CUBLAS_OP_N ? A[static_cast<std::size_t>(p * lda + i)] : A[static_cast<std::size_t>(i * lda + p)];
        double b = tb == CUBLAS_OP_N ? B[static_cast<std::size_t>(j * ldb + p)] : B[static_cast<std::size_t>(p * ldb + j)];
        acc += a * b;
      }
      auto const c = static_cast<std::size_t>(j * ldc + i);
      out[c] = alpha * acc + (beta == 0 ? 0.0 : beta * C[c]);
    }
  return out;
}

std::vector<float> random_floats(std::size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

struct Blas {
  cublasHandle_t h = nullptr;
  cudaStream_t s = nullptr;
  Blas() {
    REQUIRE(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    REQUIRE(cublasSetStream(h, s) == CUBLAS_STATUS_SUCCESS);
  }
  ~Blas() {
    cublasDestroy(h);
    cudaStreamDestroy(s);
  }
};

TEST_CASE("cublasGemmEx fp32: every transpose, odd sizes, padded leading dimensions, alpha and beta", "[shims][cublas]") {
  std::mt19937 rng(5);
  Blas b;
  for (auto ta : {CUBLAS_OP_N, CUBLAS_OP_T})
    for (auto tb : {CUBLAS_OP_N, CUBLAS_OP_T})
      for (auto [m, n, k] : {std::array{7, 5, 13}, std::array{33, 17, 40}, std::array{1, 1, 1}}) {
        INFO("transa " << ta << " transb " << tb << " m " << m << " n " << n << " k " << k);
        int const a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
        int const b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
        int const lda = a_rows + 3, ldb = b_rows + 1, ldc = m + 2;
        auto A = random_floats(static_cast<std::size_t>(lda * a_cols), rng);
        auto B = random_floats(static_cast<std::size_t>(ldb * b_cols), rng);
        auto C = random_floats(static_cast<std::size_t>(ldc * n), rng);
        float *dA = device_alloc<float>(A.size()), *dB = device_alloc<float>(B.size()), *dC = device_alloc<float>(C.size());
        upload(dA, A);
        upload(dB, B);
        upload(dC, C);
        float const alpha = 1.5f, beta = -0.5f;
        REQUIRE(cublasGemmEx(b.h, ta, tb, m, n, k, &alpha, dA, CUDA_R_32F, lda, dB, CUDA_R_32F, ldb, &beta, dC, CUDA_R_32F,
                             ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
        REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
        auto want = gemm_reference(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc);
        auto got = download(dC, C.size());
        int bad = 0;
        for (int j = 0; j < n; ++j)
          for (int i = 0; i < ldc; ++i) {
            auto const c = static_cast<std::size_t>(j * ldc + i);
            if (i < m)
              bad += std::abs(got[c] - want[c]) > 1e-5 * (1 + std::abs(want[c]));
            else
              bad += got[c] != C[c];  // padding rows untouched
          }
        CHECK(bad == 0);
        cudaFree(dA);
        cudaFree(dB);
        cudaFree(dC);
      }
}

TEST_CASE("cublasGemmEx bf16: fp32 accumulation, bf16 outputs rounded to nearest even", "[shims][cublas]") {
  Blas b;
  auto bf = [](float v) { return __float2bfloat16_rn(v); };
  SECTION("ties: 257 -> 256, 259 -> 260, 261 -> 260 (bf16 keeps 8 significant bits)") {
    // C (1 x 3) = A (1 x 2) B (2 x 3); the sums are exact in fp32, so only the output rounds.
    std::vector<__nv_bfloat16> A{bf(256), bf(1)}, B{bf(1), bf(1), bf(1), bf(3), bf(1), bf(5)};
    auto* dA = device_alloc<__nv_bfloat16>(2);
    auto* dB = device_alloc<__nv_bfloat16>(6);
    auto* dC = device_alloc<__nv_bfloat16>(3);
    upload(dA, A);
    upload(dB, B);
    float const one = 1, zero = 0;
    REQUIRE(cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 3, 2, &one, dA, CUDA_R_16BF, 1, dB, CUDA_R_16BF, 2, &zero, dC,
                         CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
    auto got = download(dC, 3);
    CHECK(__bfloat162float(got[0]) == 256.0f);
    CHECK(__bfloat162float(got[1]) == 260.0f);
    CHECK(__bfloat162float(got[2]) == 260.0f);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
  }
  SECTION("integer-valued products against an exact reference, fp32 and bf16 C") {
    std::mt19937 rng(9);
    int const m = 19, n = 11, k = 37, lda = k, ldb = k, ldc = m;  // op(A) = A^T, op(B) = B (the gate's shape)
    std::vector<float> A(static_cast<std::size_t>(lda * m)), B(static_cast<std::size_t>(ldb * n)),
        C(static_cast<std::size_t>(ldc * n), 0.0f);
    for (auto& v : A) v = static_cast<float>(static_cast<int>(rng() % 15) - 7);
    for (auto& v : B) v = static_cast<float>(static_cast<int>(rng() % 15) - 7);
    std::vector<__nv_bfloat16> Ab, Bb;
    for (float v : A) Ab.push_back(bf(v));
    for (float v : B) Bb.push_back(bf(v));
    auto* dA = device_alloc<__nv_bfloat16>(Ab.size());
    auto* dB = device_alloc<__nv_bfloat16>(Bb.size());
    auto* dC32 = device_alloc<float>(C.size());
    auto* dC16 = device_alloc<__nv_bfloat16>(C.size());
    upload(dA, Ab);
    upload(dB, Bb);
    float const one = 1, zero = 0;
    REQUIRE(cublasGemmEx(b.h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, lda, dB, CUDA_R_16BF, ldb, &zero,
                         dC32, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasGemmEx(b.h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16BF, lda, dB, CUDA_R_16BF, ldb, &zero,
                         dC16, CUDA_R_16BF, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
    auto want = gemm_reference(CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, 1, A, lda, B, ldb, 0, C, ldc);
    auto g32 = download(dC32, C.size());
    auto g16 = download(dC16, C.size());
    int bad = 0;
    for (std::size_t i = 0; i < C.size(); ++i) {
      bad += g32[i] != static_cast<float>(want[i]);
      bad += __bfloat16_as_ushort(g16[i]) != __bfloat16_as_ushort(bf(static_cast<float>(want[i])));
    }
    CHECK(bad == 0);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC32);
    cudaFree(dC16);
  }
}

TEST_CASE("cublasGemmStridedBatchedEx: batches with padded strides, a shared B (stride 0), both transposes",
          "[shims][cublas]") {
  std::mt19937 rng(13);
  Blas b;
  for (auto ta : {CUBLAS_OP_N, CUBLAS_OP_T})
    for (auto tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      int const m = 9, n = 6, k = 5, batch = 3;
      int const a_rows = ta == CUBLAS_OP_N ? m : k, a_cols = ta == CUBLAS_OP_N ? k : m;
      int const b_rows = tb == CUBLAS_OP_N ? k : n, b_cols = tb == CUBLAS_OP_N ? n : k;
      int const lda = a_rows + 1, ldb = b_rows, ldc = m;
      long long const sa = lda * a_cols + 7, sb = 0, sc = ldc * n + 2;
      auto A = random_floats(static_cast<std::size_t>(sa * batch), rng);
      auto B = random_floats(static_cast<std::size_t>(ldb * b_cols), rng);
      auto C = random_floats(static_cast<std::size_t>(sc * batch), rng);
      float *dA = device_alloc<float>(A.size()), *dB = device_alloc<float>(B.size()), *dC = device_alloc<float>(C.size());
      upload(dA, A);
      upload(dB, B);
      upload(dC, C);
      float const alpha = 0.75f, beta = 2.0f;
      REQUIRE(cublasGemmStridedBatchedEx(b.h, ta, tb, m, n, k, &alpha, dA, CUDA_R_32F, lda, sa, dB, CUDA_R_32F, ldb, sb,
                                         &beta, dC, CUDA_R_32F, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
      REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
      auto got = download(dC, C.size());
      int bad = 0;
      for (int q = 0; q < batch; ++q) {
        std::vector<float> Aq(A.begin() + q * sa, A.begin() + q * sa + lda * a_cols);
        std::vector<float> Cq(C.begin() + q * sc, C.begin() + q * sc + ldc * n);
        auto want = gemm_reference(ta, tb, m, n, k, alpha, Aq, lda, B, ldb, beta, Cq, ldc);
        for (std::size_t i = 0; i < want.size(); ++i)
          bad += std::abs(got[static_cast<std::size_t>(q * sc) + i] - want[i]) > 1e-5 * (1 + std::abs(want[i]));
        if (q + 1 < batch)  // the gap between two C matrices is not written
          for (long long i = ldc * n; i < sc; ++i)
            bad += got[static_cast<std::size_t>(q * sc + i)] != C[static_cast<std::size_t>(q * sc + i)];
      }
      CHECK(bad == 0);
      cudaFree(dA);
      cudaFree(dB);
      cudaFree(dC);
    }
}

TEST_CASE("cuBLAS contract: leading dimensions, types, handles, pointers", "[shims][cublas]") {
  Blas b;
  int const m = 8, n = 4, k = 6;
  float *dA = device_alloc<float>(64), *dB = device_alloc<float>(64), *dC = device_alloc<float>(64);
  // The GEMMs below run on the handle's non-blocking stream, which does not wait for the legacy
  // default stream: zero C on that stream so the zeroing is ordered before them.
  REQUIRE(cudaMemsetAsync(dC, 0, 64 * sizeof(float), b.s) == cudaSuccess);
  float const one = 1, zero = 0;
  auto gemm = [&](cublasOperation_t ta, cublasOperation_t tb, int lda, int ldb, int ldc) {
    return cublasGemmEx(b.h, ta, tb, m, n, k, &one, dA, CUDA_R_32F, lda, dB, CUDA_R_32F, ldb, &zero, dC, CUDA_R_32F, ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  SECTION("lda, ldb, ldc below the stored rows") {
    CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, k, m) == CUBLAS_STATUS_SUCCESS);
    CHECK(gemm(CUBLAS_OP_T, CUBLAS_OP_T, k, n, m) == CUBLAS_STATUS_SUCCESS);
    StderrCapture err;
    CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m - 1, k, m) == CUBLAS_STATUS_INVALID_VALUE);  // lda >= m with N
    CHECK(gemm(CUBLAS_OP_T, CUBLAS_OP_N, k - 1, k, m) == CUBLAS_STATUS_INVALID_VALUE);  // lda >= k with T
    CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, k - 1, m) == CUBLAS_STATUS_INVALID_VALUE);  // ldb >= k with N
    CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_T, m, n - 1, m) == CUBLAS_STATUS_INVALID_VALUE);  // ldb >= n with T
    CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, k, m - 1) == CUBLAS_STATUS_INVALID_VALUE);  // ldc >= m
    has_all(err.text(), {"cublasGemmEx: lda = 7 < max(1, 8)", "lda = 5 < max(1, 6)", "ldb = 5 < max(1, 6)",
                         "ldb = 3 < max(1, 4)", "ldc = 7 < max(1, m = 8)"});
    // A k = 0 product still checks lda >= max(1, m).
    CHECK(cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, 0, &one, dA, CUDA_R_32F, 0, dB, CUDA_R_32F, 1, &zero, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  }
  SECTION("an operand that does not fit its allocation (a too-large leading dimension)") {
    StderrCapture err;
    CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, 16, k, m) == CUBLAS_STATUS_INVALID_VALUE);  // 5 * 16 + 8 > 64 floats
    has_all(err.text(), {"A is not inside one device allocation"});
  }
  SECTION("unsupported type combinations") {
    auto* hb = device_alloc<__nv_bfloat16>(64);
    StderrCapture err;
    CHECK(cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, hb, CUDA_R_16BF, m, dB, CUDA_R_32F, k, &zero, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, m, dB, CUDA_R_32F, k, &zero, hb,
                       CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, hb, CUDA_R_16BF, m, hb, CUDA_R_16BF, k, &zero, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F_FAST_16BF, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_16F, m, dB, CUDA_R_16F, k, &zero, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK(cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, m, dB, CUDA_R_32F, k, &zero, dC,
                       CUDA_R_32F, m, static_cast<cublasComputeType_t>(70), CUBLAS_GEMM_DEFAULT) ==
          CUBLAS_STATUS_NOT_SUPPORTED);  // CUBLAS_COMPUTE_64F
    CHECK(cublasGemmEx(b.h, CUBLAS_OP_C, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, k, dB, CUDA_R_32F, k, &zero, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
    has_all(err.text(), {"unsupported data types for CUBLAS_COMPUTE_32F", "takes CUDA_R_32F A, B and C only",
                         "compute type 70", "CUBLAS_OP_N or CUBLAS_OP_T"});
    cudaFree(hb);
  }
  SECTION("host memory as an operand, device memory as alpha") {
    std::vector<float> host(64);
    float* dev_one = device_alloc<float>(1);
    REQUIRE(cudaMemcpy(dev_one, &one, sizeof one, cudaMemcpyHostToDevice) == cudaSuccess);
    StderrCapture err;
    CHECK(cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, host.data(), CUDA_R_32F, m, dB, CUDA_R_32F, k, &zero,
                       dC, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
    CHECK(cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, dev_one, dA, CUDA_R_32F, m, dB, CUDA_R_32F, k, &zero, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
    has_all(err.text(), {"A is not inside one device allocation", "CUBLAS_POINTER_MODE_HOST"});
    cudaFree(dev_one);
  }
  SECTION("handles: null, destroyed, used with another device current or another device's stream") {
    StderrCapture err;
    CHECK(cublasGemmEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, m, dB, CUDA_R_32F, k, &zero, dC,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_NOT_INITIALIZED);
    cublasHandle_t gone;
    REQUIRE(cublasCreate(&gone) == CUBLAS_STATUS_SUCCESS);
    REQUIRE(cublasDestroy(gone) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublasSetStream(gone, b.s) == CUBLAS_STATUS_NOT_INITIALIZED);
    CHECK(cublasDestroy(gone) == CUBLAS_STATUS_NOT_INITIALIZED);
    REQUIRE(cudaSetDevice(1) == cudaSuccess);
    CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, k, m) == CUBLAS_STATUS_INVALID_VALUE);
    cudaStream_t other;
    REQUIRE(cudaStreamCreate(&other) == cudaSuccess);
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    REQUIRE(cublasSetStream(b.h, other) == CUBLAS_STATUS_SUCCESS);
    CHECK(gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, k, m) == CUBLAS_STATUS_INVALID_VALUE);
    REQUIRE(cublasSetStream(b.h, b.s) == CUBLAS_STATUS_SUCCESS);
    cudaStreamDestroy(other);
    has_all(err.text(), {"not initialised", "the handle belongs to device 0 but device 1 is current",
                         "stream belongs to another device"});
  }
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
}

TEST_CASE("cuBLAS workspace: device memory, 256-byte aligned, used by the call, reset by cublasSetStream",
          "[shims][cublas]") {
  Blas b;
  std::size_t const ws_bytes = 4096;
  auto* ws = device_alloc<unsigned char>(ws_bytes + 256);
  std::vector<unsigned char> host(ws_bytes);
  StderrCapture err;
  CHECK(cublasSetWorkspace(b.h, host.data(), ws_bytes) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSetWorkspace(b.h, ws + 16, ws_bytes) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublasSetWorkspace(b.h, ws, ws_bytes + 512) == CUBLAS_STATUS_INVALID_VALUE);
  has_all(err.text(), {"cublasSetWorkspace", "not device memory", "256-byte aligned"});

  float *dA = device_alloc<float>(16), *dB = device_alloc<float>(16), *dC = device_alloc<float>(16);
  float const one = 1, zero = 0;
  auto gemm = [&] {
    return cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, &one, dA, CUDA_R_32F, 4, dB, CUDA_R_32F, 4, &zero, dC,
                        CUDA_R_32F, 4, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  auto untouched = [&] {
    auto h = download(ws, ws_bytes);
    return std::all_of(h.begin(), h.end(), [](unsigned char c) { return c == 0; });
  };
  // The handle's stream is non-blocking: a cudaMemset on the legacy default stream would not be
  // ordered before the GEMM, so the zeroing goes on the same stream.
  REQUIRE(cudaMemsetAsync(ws, 0, ws_bytes, b.s) == cudaSuccess);
  REQUIRE(cublasSetWorkspace(b.h, ws, ws_bytes) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(gemm() == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
  CHECK_FALSE(untouched());  // the library owns it during the call
  REQUIRE(cudaMemsetAsync(ws, 0, ws_bytes, b.s) == cudaSuccess);
  REQUIRE(cublasSetStream(b.h, b.s) == CUBLAS_STATUS_SUCCESS);  // resets the workspace
  REQUIRE(gemm() == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
  CHECK(untouched());
  // A freed workspace is refused at the next call.
  REQUIRE(cublasSetWorkspace(b.h, ws, ws_bytes) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaFree(ws) == cudaSuccess);
  StderrCapture err2;
  CHECK(gemm() == CUBLAS_STATUS_INVALID_VALUE);
  has_all(err2.text(), {"workspace", "no longer device memory"});
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
}

TEST_CASE("cuBLAS runs on the handle's stream (a captured GEMM runs at graph launch); _FAST_ compute types round inputs",
          "[shims][cublas]") {
  Blas b;
  float *dA = device_alloc<float>(1), *dB = device_alloc<float>(1), *dC = device_alloc<float>(1);
  float const a = 1.0f + 1.0f / 1024.0f, one = 1, zero = 0;  // not a bf16 value; a tf32 value
  REQUIRE(cudaMemcpy(dA, &a, sizeof a, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemcpy(dB, &one, sizeof one, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(dC, 0, sizeof(float)) == cudaSuccess);
  auto gemm = [&](cublasComputeType_t c) {
    return cublasGemmEx(b.h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, dA, CUDA_R_32F, 1, dB, CUDA_R_32F, 1, &zero, dC,
                        CUDA_R_32F, 1, c, CUBLAS_GEMM_DEFAULT);
  };
  REQUIRE(cudaStreamBeginCapture(b.s, cudaStreamCaptureModeThreadLocal) == cudaSuccess);
  REQUIRE(gemm(CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_SUCCESS);
  cudaGraph_t g = nullptr;
  REQUIRE(cudaStreamEndCapture(b.s, &g) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(download(dC, 1)[0] == 0.0f);
  cudaGraphExec_t x;
  REQUIRE(cudaGraphInstantiate(&x, g, 0) == cudaSuccess);
  REQUIRE(cudaGraphLaunch(x, b.s) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
  CHECK(download(dC, 1)[0] == a);
  cudaGraphExecDestroy(x);
  cudaGraphDestroy(g);
  REQUIRE(gemm(CUBLAS_COMPUTE_32F_FAST_16BF) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
  CHECK(download(dC, 1)[0] == 1.0f);
  REQUIRE(gemm(CUBLAS_COMPUTE_32F_FAST_TF32) == CUBLAS_STATUS_SUCCESS);
  REQUIRE(cudaStreamSynchronize(b.s) == cudaSuccess);
  CHECK(download(dC, 1)[0] == a);
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
}

// =============================================================================================
// WMMA.
// =============================================================================================

namespace wmma = nvcuda::wmma;
using bf = __nv_bfloat16;

/// Warp w of the grid computes problem w: D = A B + C with A 16 x 16*ksteps, B 16*ksteps x 16.
template <class LA, class LB>
__global__ void wmma_kernel(bf const* A, unsigned lda, long long sa, bf const* B, unsigned ldb, long long sb,
                            float const* C, unsigned ldc, bool c_col, float* D, unsigned ldd, bool d_col, long long sc,
                            int ksteps) {
  int const w = static_cast<int>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
  A += w * sa;
  B += w * sb;
  C += w * sc;
  D += w * sc;
  constexpr bool a_col = std::is_same_v<LA, wmma::col_major>, b_col = std::is_same_v<LB, wmma::col_major>;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::load_matrix_sync(acc, C, ldc, c_col ? wmma::mem_col_major : wmma::mem_row_major);
  for (int s = 0; s < ksteps; ++s) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, bf, LB> fb;
    wmma::load_matrix_sync(fa, A + (a_col ? s * 16 * lda : s * 16), lda);
    wmma::load_matrix_sync(fb, B + (b_col ? s * 16 : s * 16 * ldb), ldb);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(D, acc, ldd, d_col ? wmma::mem_col_major : wmma::mem_row_major);
}

template <class LA, class LB>
void check_wmma(bool c_col, bool d_col) {
  constexpr bool a_col = std::is_same_v<LA, wmma::col_major>, b_col = std::is_same_v<LB, wmma::col_major>;
  INFO("A " << (a_col ? "col" : "row") << ", B " << (b_col ? "col" : "row") << ", C " << (c_col ? "col" : "row")
            << ", D " << (d_col ? "col" : "row"));
  int const ksteps = 3, K = 16 * ksteps, problems = 4;
  unsigned const lda = a_col ? 24 : K + 8, ldb = b_col ? K + 16 : 40, ldc = 20, ldd = 28;  // padded, multiples of 16 bytes
  long long const sa = 16LL * (a_col ? K : 16) * 2 * lda / (a_col ? 16 : 8) + 64;  // generous, 32-byte multiple
  long long const sb = 16LL * 3 * 64, sc = 16LL * 32;
  auto a_at = [&](int p, int m, int k) { return static_cast<std::size_t>(p * sa + (a_col ? k * lda + m : m * lda + k)); };
  auto b_at = [&](int p, int k, int n) { return static_cast<std::size_t>(p * sb + (b_col ? n * ldb + k : k * ldb + n)); };
  auto c_at = [&](int p, int r, int c, unsigned ld, bool col) {
    return static_cast<std::size_t>(p * sc + (col ? c * ld + r : r * ld + c));
  };
  std::vector<bf> A(static_cast<std::size_t>(sa * problems), __float2bfloat16_rn(0)),
      B(static_cast<std::size_t>(sb * problems), __float2bfloat16_rn(0));
  std::vector<float> C(static_cast<std::size_t>(sc * problems), 0.0f);
  std::mt19937 rng(17);
  std::vector<double> want(static_cast<std::size_t>(problems * 256));
  for (int p = 0; p < problems; ++p) {
    std::vector<int> a(16 * static_cast<std::size_t>(K)), b(16 * static_cast<std::size_t>(K));
    for (int m = 0; m < 16; ++m)
      for (int k = 0; k < K; ++k) {
        int v = static_cast<int>(rng() % 9) - 4;
        a[static_cast<std::size_t>(m * K + k)] = v;
        A[a_at(p, m, k)] = __float2bfloat16_rn(static_cast<float>(v));
      }
    for (int k = 0; k < K; ++k)
      for (int n = 0; n < 16; ++n) {
        int v = static_cast<int>(rng() % 9) - 4;
        b[static_cast<std::size_t>(k * 16 + n)] = v;
        B[b_at(p, k, n)] = __float2bfloat16_rn(static_cast<float>(v));
      }
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c) {
        float cv = static_cast<float>(r * 16 + c) * 0.5f;
        C[c_at(p, r, c, ldc, c_col)] = cv;
        double acc = cv;
        for (int k = 0; k < K; ++k) acc += a[static_cast<std::size_t>(r * K + k)] * b[static_cast<std::size_t>(k * 16 + c)];
        want[static_cast<std::size_t>(p * 256 + r * 16 + c)] = acc;
      }
  }
  auto* dA = device_alloc<bf>(A.size());
  auto* dB = device_alloc<bf>(B.size());
  auto* dC = device_alloc<float>(C.size());
  auto* dD = device_alloc<float>(C.size());
  upload(dA, A);
  upload(dB, B);
  upload(dC, C);
  REQUIRE(cudaMemset(dD, 0, C.size() * sizeof(float)) == cudaSuccess);
  REQUIRE(emu::kernel_launch(wmma_kernel<LA, LB>, dim3(2), dim3(64), 0, nullptr, dA, lda, sa, dB, ldb, sb, dC, ldc, c_col,
                             dD, ldd, d_col, sc, ksteps) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto D = download(dD, C.size());
  int bad = 0;
  for (int p = 0; p < problems; ++p)
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c)
        bad += D[c_at(p, r, c, ldd, d_col)] != static_cast<float>(want[static_cast<std::size_t>(p * 256 + r * 16 + c)]);
  CHECK(bad == 0);
  cudaFree(dA);
  cudaFree(dB);
  cudaFree(dC);
  cudaFree(dD);
}

TEST_CASE("wmma bf16 m16n16k16: load, mma, store against a brute-force product, every layout", "[shims][wmma]") {
  check_wmma<wmma::row_major, wmma::row_major>(false, false);
  check_wmma<wmma::row_major, wmma::col_major>(false, true);  // the grouped GEMM's pair
  check_wmma<wmma::col_major, wmma::row_major>(true, false);
  check_wmma<wmma::col_major, wmma::col_major>(true, true);
}

/// Loads a 16 x 16 accumulator tile M (row-major) and writes x[i] of lane l to out[l * 8 + i]: what
/// code that assumed "lane l holds elements 8l .. 8l+7 in row-major order" would compute.
__global__ void wmma_assumed_order_kernel(float const* M, float* out, float* scaled) {
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> f;
  wmma::load_matrix_sync(f, M, 16, wmma::mem_row_major);
  int const lane = static_cast<int>(threadIdx.x);
  for (int i = 0; i < f.num_elements; ++i) out[lane * f.num_elements + i] = f.x[i];
  for (int i = 0; i < f.num_elements; ++i) f.x[i] *= 2.0f;  // order-independent: fine
  wmma::store_matrix_sync(scaled, f, 16, wmma::mem_row_major);
}

TEST_CASE("wmma fragments: element order is unspecified (permuted); element-wise scaling works", "[shims][wmma]") {
  std::vector<float> M(256);
  std::iota(M.begin(), M.end(), 0.0f);
  float *dM = device_alloc<float>(256), *dout = device_alloc<float>(256), *dscaled = device_alloc<float>(256);
  upload(dM, M);
  REQUIRE(emu::kernel_launch(wmma_assumed_order_kernel, dim3(1), dim3(32), 0, nullptr, dM, dout, dscaled) == cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto out = download(dout, 256), scaled = download(dscaled, 256);
  int misplaced = 0;
  for (int i = 0; i < 256; ++i) misplaced += out[static_cast<std::size_t>(i)] != M[static_cast<std::size_t>(i)];
  CHECK(misplaced > 200);  // the assumption fails almost everywhere
  auto sorted = out;
  std::sort(sorted.begin(), sorted.end());
  CHECK(sorted == M);  // yet the warp's fragments hold each element exactly once
  int bad = 0;
  for (int i = 0; i < 256; ++i) bad += scaled[static_cast<std::size_t>(i)] != 2.0f * M[static_cast<std::size_t>(i)];
  CHECK(bad == 0);
  cudaFree(dM);
  cudaFree(dout);
  cudaFree(dscaled);
}

/// `which` selects the planted misuse: 0 pointer differs in lane 7, 1 ldm differs in lane 3,
/// 2 unaligned pointer, 3 ldm not a multiple of 16 bytes, 4 half the warp calls, 5 store ldm.
__global__ void wmma_misuse_kernel(bf const* A, float* D, int which) {
  int const lane = static_cast<int>(threadIdx.x % 32);
  wmma::fragment<wmma::matrix_a, 16, 16, 16, bf, wmma::row_major> fa;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
  switch (which) {
    case 0: wmma::load_matrix_sync(fa, A + (lane == 7 ? 16 : 0), 32); break;
    case 1: wmma::load_matrix_sync(fa, A, lane == 3 ? 48 : 32); break;
    case 2: wmma::load_matrix_sync(fa, A + 8, 32); break;
    case 3: wmma::load_matrix_sync(fa, A, 20); break;
    case 4:
      if (lane < 16) wmma::load_matrix_sync(fa, A, 32);
      break;
    case 5: wmma::store_matrix_sync(D, acc, 18, wmma::mem_row_major); break;
    default: break;
  }
}

TEST_CASE("wmma contract: warp-uniform pointer, ldm and layout; alignment; the whole warp", "[shims][wmma][errors]") {
  auto* A = device_alloc<bf>(32 * 32);
  auto* D = device_alloc<float>(32 * 32);
  auto run = [&](int which) {
    REQUIRE(emu::kernel_launch(wmma_misuse_kernel, dim3(1), dim3(32), 0, nullptr, A, D, which) == cudaSuccess);
  };
  SECTION("pointer") {
    run(0);
    expect_kernel_error({"wmma_misuse_kernel", "wmma::load_matrix_sync", "the pointer differs between lanes 0 and 7"});
  }
  SECTION("ldm") {
    run(1);
    expect_kernel_error({"wmma::load_matrix_sync", "ldm differs between lanes 0 and 3"});
  }
  SECTION("256-bit alignment") {
    run(2);
    expect_kernel_error({"wmma::load_matrix_sync", "not 256-bit aligned"});
  }
  SECTION("ldm a multiple of 8 bf16 elements") {
    run(3);
    expect_kernel_error({"wmma::load_matrix_sync", "ldm = 20 is not a multiple of 16 bytes"});
  }
  SECTION("half a warp") {
    run(4);
    expect_kernel_error({"wmma_misuse_kernel", "wmma::load_matrix_sync"});
  }
  SECTION("store: ldm a multiple of 4 floats") {
    run(5);
    expect_kernel_error({"wmma::store_matrix_sync", "ldm = 18 is not a multiple of 16 bytes"});
  }
  cudaFree(A);
  cudaFree(D);
}

}  // namespace
