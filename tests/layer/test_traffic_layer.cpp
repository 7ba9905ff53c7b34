// The traffic model (moe/topology/traffic.hpp, Choice::like_layer) against what the expert-parallel
// layer actually sends: 4 ranks on InProcess<4>, each rank one GPU of a 2-server cluster; per GPU,
// the model's dispatch tokens on its NVLink up link equal the layer's remote dispatch records, and
// its combine bytes equal the layer's combine bytes. Routes and weights are synthetic (seeded).
#include <array>
#include <catch2/catch.hpp>

#include "layer_check.hpp"
#include "moe/topology/traffic.hpp"

TEST_CASE("traffic model bytes equal the layer's sent bytes", "[layer][traffic]") {
  using namespace moe;
  using namespace moe::test;
  using Model = models::Reduced<models::DeepSeekV3, 64, 32, DType::f32>;
  using Router = router::SigmoidGroupTopK;
  constexpr ShapeSpec s = Model::spec;
  constexpr int ranks = 4, per_rank = 12, total = ranks * per_rank;

  auto placement = placement::Table::contiguous(s.experts, ranks);
  // Every 8th expert gets one or two more copies, so the replica choice (own rank first, then
  // spread) matters.
  std::vector<std::vector<int>> copies(static_cast<std::size_t>(s.experts));
  for (int e = 0; e < s.experts; ++e) {
    int p = placement.rank_of(e);
    auto& c = copies[static_cast<std::size_t>(e)];
    c = {p};
    if (e % 8 == 0) c.push_back((p + 1) % ranks);
    if (e % 16 == 0) c.push_back((p + 2) % ranks);
  }
  replication::Table replicas(copies);

  for (std::uint64_t seed : {61u, 62u}) {
    INFO("seed " << seed);
    Scenario sc{{per_rank, per_rank, per_rank, per_rank}, placement, true, seed};
    std::array<Outcome, ranks> out;
    collective::run_in_process<ranks>([&](auto& comm) {
      out[static_cast<std::size_t>(comm.rank())] = run_scenario<Model, Router>(comm, sc, replicas);
    });

    // The same routes, from the reference with run_scenario's seeds.
    RandomLayerWeights<float> weights(s, sc.seed);
    auto x = random_tokens<float>(total, s.hidden, sc.seed + 1000);
    std::vector<float> ref(x.size());
    std::vector<int> ids(static_cast<std::size_t>(total) * static_cast<std::size_t>(s.top_k));
    std::vector<float> gw(ids.size());
    reference_forward<Router>(s, weights.view(), total, x.data(), ref.data(), ids, gw);

    topology::Topology t;
    int s0 = t.add_server("s0", 2), s1 = t.add_server("s1", 2), sw = t.add_switch("sw");
    t.add_link(s0, sw);
    t.add_link(s1, sw);
    t.finalize();
    topology::TrafficModel model(t);
    auto primary = placement.ranks();
    auto layer_copies = topology::equal_shares(replication::copy_lists(primary, replicas));
    std::vector<int> attention{0, 1, 2, 3};
    topology::Batch batch{s.top_k, topology::spread_tokens(total, attention), ids};
    topology::TrafficOptions opt;
    opt.hidden = s.hidden;
    opt.bytes_per_element = sizeof(float);
    opt.choice = topology::Choice::like_layer;
    auto r = model.evaluate(layer_copies, batch, opt);

    long long remote = 0;
    for (int g = 0; g < ranks; ++g) {
      INFO("rank " << g);
      auto const& st = out[static_cast<std::size_t>(g)].stats;
      CHECK(out[static_cast<std::size_t>(g)].error <= 1e-5);
      int up = -1;
      for (int i = 0; i < model.links(); ++i)
        if (model.link(i).from == t.vertices() + g) up = i;
      REQUIRE(up >= 0);
      CHECK(r.dispatch_bytes[static_cast<std::size_t>(up)] ==
            static_cast<double>(st.records_remote) * opt.token_bytes());
      CHECK(r.combine_bytes[static_cast<std::size_t>(up)] == static_cast<double>(st.combine_bytes));
      CHECK(st.records_remote > 0);
      remote += st.records_remote;
    }
    CHECK(r.remote_crossings == static_cast<double>(remote));
  }
}
