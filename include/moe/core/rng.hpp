#pragma once
// The project's seeded random stream: SplitMix64 (Steele, Lea and Flood, 2014), with portable
// uniform draws, so that a seed gives the same synthetic data, shuffles and restarts on every
// platform and compiler (std::uniform_*_distribution is implementation-defined).

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace moe::core {

class Rng {
public:
  explicit Rng(std::uint64_t seed) : s_(seed + 0x9E3779B97F4A7C15ull) {}
  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// In [0, n) (modulo draw: a bias below n / 2^64, irrelevant at the sizes used here).
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
  /// Fisher-Yates shuffle.
  template <class T>
  void shuffle(std::vector<T>& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[below(i)]);
  }

private:
  std::uint64_t s_;
};

}  // namespace moe::core
