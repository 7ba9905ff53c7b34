// A collective of one's own: Metered<N> forwards every operation to an in-process collective and
// counts, per operation, the calls and the bytes this rank hands to it. A collective is what
// moe::Layer communicates through; the host path needs its Exchange capability
// (collective/concept.hpp: rank(), size(), all_to_all, all_to_all_v, all_gather_v, counters() and
// reset_counters()); this one models the whole moe::collective::Collective concept. The layer
// calls, per run(): all_gather_v (the ranks' agreement on the pass, 256 bytes per rank), all_to_all
// (each rank's record counts and bytes per peer), then all_to_all_v (the dispatch records), then
// all_to_all_v again (the partial sums back); every rank calls them in the same order. counters() must count the bytes sent to other ranks (the layer's statistics are
// differences of it).
//
// Checks: the layer on 4 in-process ranks over Metered matches moe::reference_forward; each rank
// made exactly 1 all_gather_v, 1 all_to_all and 2 all_to_all_v calls; the bytes Metered saw leave
// for other ranks equal the layer's agreement + dispatch + combine + control bytes.
#include <array>
#include <memory>
#include <span>

#include "check.hpp"

template <int N>
class Metered {
public:
  static constexpr moe::collective::Memory memory = moe::collective::Memory::host;
  explicit Metered(moe::collective::InProcess<N>& inner) : inner_(inner) {}

  [[nodiscard]] int rank() const { return inner_.rank(); }
  [[nodiscard]] int size() const { return inner_.size(); }

  void all_to_all(std::span<std::byte const> in, std::span<std::byte> out, std::size_t block) {
    note(0, (static_cast<std::size_t>(size()) - 1) * block);
    inner_.all_to_all(in, out, block);
  }
  void all_to_all_v(std::span<std::byte const> in, std::span<std::size_t const> send, std::span<std::byte> out,
                    std::span<std::size_t const> recv) {
    std::size_t others = 0;
    for (int p = 0; p < size(); ++p)
      if (p != rank()) others += send[static_cast<std::size_t>(p)];
    note(1, others);
    inner_.all_to_all_v(in, send, out, recv);
  }
  void reduce_scatter_v(std::span<float const> in, std::span<float> out, std::span<std::size_t const> counts) {
    note(2, 0);
    inner_.reduce_scatter_v(in, out, counts);
  }
  void all_gather_v(std::span<std::byte const> in, std::span<std::byte> out, std::span<std::size_t const> counts) {
    note(3, (static_cast<std::size_t>(size()) - 1) * in.size());
    inner_.all_gather_v(in, out, counts);
  }
  void all_reduce(std::span<float> data) {
    note(4, 0);
    inner_.all_reduce(data);
  }
  void send(std::span<std::byte const> in, int peer, int tag) {
    note(5, peer == rank() ? 0 : in.size());
    inner_.send(in, peer, tag);
  }
  void recv(std::span<std::byte> out, int peer, int tag) { inner_.recv(out, peer, tag); }
  void barrier() { inner_.barrier(); }
  [[nodiscard]] moe::collective::Counters const& counters() const { return inner_.counters(); }
  void reset_counters() { inner_.reset_counters(); }

  struct Meter {
    std::array<long long, 6> calls{};
    std::array<std::size_t, 6> bytes{};  ///< to other ranks
  };
  [[nodiscard]] Meter const& meter() const { return meter_; }

private:
  void note(std::size_t op, std::size_t bytes) {
    ++meter_.calls[op];
    meter_.bytes[op] += bytes;
  }
  moe::collective::InProcess<N>& inner_;
  Meter meter_;
};
static_assert(moe::collective::Collective<Metered<4>>);

int main() {
  using namespace extending;
  using Router = moe::router::ForModel<Model>;
  constexpr int ranks = 4, tokens = 16;
  bool ok = true;

  std::array<std::unique_ptr<Metered<ranks>>, ranks> made;
  auto run = run_layer<Router, moe::placement::Table, moe::replication::None, moe::schedule::Sequential, ranks>(
      moe::placement::Table::contiguous(shape.experts, ranks), moe::replication::None{}, tokens,
      [&](moe::collective::InProcess<ranks>& inner) -> Metered<ranks>& {
        auto& slot = made[static_cast<std::size_t>(inner.rank())];
        slot = std::make_unique<Metered<ranks>>(inner);
        return *slot;
      });
  std::printf("Metered: relative error %.2e\n", run.relative_error());
  ok &= expect(run.relative_error() < 1e-5, "layer over Metered matches the reference");

  bool calls_ok = true, bytes_ok = true;
  for (int r = 0; r < ranks; ++r) {
    auto const& m = made[static_cast<std::size_t>(r)]->meter();
    auto const& st = run.stats[static_cast<std::size_t>(r)];
    std::size_t seen = m.bytes[0] + m.bytes[1] + m.bytes[3],
                layer = st.agreement_bytes + st.dispatch_bytes + st.combine_bytes + st.control_bytes;
    std::printf("rank %d: all_to_all x%lld, all_to_all_v x%lld; %zu bytes to other ranks, layer stats %zu\n", r,
                m.calls[0], m.calls[1], seen, layer);
    calls_ok = calls_ok && m.calls[3] == 1 && m.calls[0] == 1 && m.calls[1] == 2 && m.calls[2] + m.calls[4] + m.calls[5] == 0;
    bytes_ok = bytes_ok && seen == layer;
  }
  ok &= expect(calls_ok, "one all_gather_v, one all_to_all and two all_to_all_v per rank, nothing else");
  ok &= expect(bytes_ok, "bytes metered = the layer's agreement + dispatch + combine + control bytes");
  return ok ? 0 : 1;
}
