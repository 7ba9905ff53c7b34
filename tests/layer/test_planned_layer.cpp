// End to end: a CRAFT replication plan built from real OLMoE routing statistics is written to a
// plan file, read back, and drives the expert-parallel layer of each planned MoE layer on 4 ranks;
// the output equals the single-process reference, and replicas serve some tokens locally. A joint
// plan drives it the same way, with the plan's routing or with routing that reacts to each batch.
#include <array>
#include <catch2/catch.hpp>
#include <sstream>

#include "joint_layer_case.hpp"
#include "layer_check.hpp"
#include "moe/plan/plan_io.hpp"
#include "moe/profile/load_profile.hpp"
#include "moe/replication/craft.hpp"
#include "moe/replication/reactive.hpp"

using namespace moe;

TEST_CASE("a CRAFT plan file drives the expert-parallel layer", "[layer][plan]") {
  // OLMoE routing (64 experts, top-8) at reduced width; loads: real arxiv marginals of layers 0, 7, 15,
  // per-batch loads drawn from them (seeded).
  using Model = models::Reduced<models::OLMoE_1B_7B, 32, 16, DType::f32>;
  using Lyr = Layer<Model, router::SoftmaxTopK, placement::Table, replication::Table, schedule::Sequential,
                    collective::InProcess<4>>;
  auto marginals =
      profile::marginals_from_olmoe(std::string(MOE_SHARED_DATA_DIR) + "/olmoe-routing/olmoe-1b-7b/arxiv/expert_counts.tsv");
  auto prof = profile::sample_profile(marginals, {.batches = 40, .tokens_per_batch = 512, .top_k = 8, .seed = 3});
  auto craft = replication::craft::plan(prof, 4, {.replication_factor = 4, .threads = 1});
  REQUIRE(craft.tables.size() == 3);

  std::vector<placement::LayerPlan> layers;
  for (std::size_t l = 0; l < craft.tables.size(); ++l) layers.push_back({craft.placement[l], craft.tables[l]});
  std::stringstream file;
  placement::write_plan(file, layers, 4);
  core::TsvReader reader(file, "craft.plan");
  auto plan = placement::read_plan(reader);
  REQUIRE(plan.gpus == 4);
  REQUIRE(plan.layers.size() == 3);

  constexpr ShapeSpec s = Model::spec;
  auto h = static_cast<std::size_t>(s.hidden);
  std::array<int, 4> counts{13, 7, 0, 20};
  int total = 40;
  for (std::size_t l = 0; l < plan.layers.size(); ++l) {
    auto const& lp = plan.layers[l];
    int copies = 0;
    for (auto const& c : lp.replicas.replicas()) copies += static_cast<int>(c.size());
    INFO("layer " << l << ": " << copies << " copies of 64 experts");
    CHECK(copies > 64);  // the plan replicates something

    RandomLayerWeights<float> weights(s, 100 + l);
    auto x = test::random_tokens<float>(total, s.hidden, 200 + l);
    std::vector<float> ref(x.size()), y(x.size());
    reference_forward<router::SoftmaxTopK>(s, weights.view(), total, x.data(), ref.data());
    std::array<LayerStats, 4> stats;
    collective::run_in_process<4>([&](auto& comm) {
      int r = comm.rank();
      auto primary = lp.placement.ranks();
      auto local = weights.experts_where([&](int e) { return lp.replicas.holds(e, primary[std::size_t(e)], r); });
      auto view = weights.view();
      view.experts = local;
      Lyr layer(comm, lp.placement, lp.replicas, view, {.max_tokens = 20});
      std::vector<std::byte> ws(layer.workspace_size());
      int first = 0;
      for (int q = 0; q < r; ++q) first += counts[std::size_t(q)];
      layer.run({.tokens = counts[std::size_t(r)], .x = x.data() + std::size_t(first) * h,
                 .y = y.data() + std::size_t(first) * h, .first_token = first},
                ws);
      stats[std::size_t(r)] = layer.stats();
    });
    CHECK(test::max_relative_error(y, ref) <= 1e-5);
    long long local = 0;
    for (auto const& st : stats) local += st.local_assignments;
    CHECK(local > 0);
  }
}

TEST_CASE("a joint plan file drives the expert-parallel layer with its routing", "[layer][plan][joint]") {
  auto plan = test::joint_plan_from_file();
  REQUIRE(plan.gpus == 4);
  REQUIRE(plan.layers.size() == 3);
  for (std::size_t l = 0; l < plan.layers.size(); ++l) {
    int copies = 0;
    for (auto const& c : plan.layers[l].replicas.replicas()) copies += static_cast<int>(c.size());
    INFO("layer " << l << ": " << copies << " copies of 64 experts");
    CHECK(copies == 4 * 17);  // S = ceil((64 + 4) / 4) slots on each GPU
    std::array<test::Outcome, 4> out;
    collective::run_in_process<4>(
        [&](auto& comm) { out[std::size_t(comm.rank())] = test::run_joint_layer(comm, plan, l); });
    long long local = 0;
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      CHECK(out[std::size_t(r)].error <= 1e-5);
      CHECK(out[std::size_t(r)].vs_textbook <= 1e-4);
      // The layer sends what the plan's routing predicts (records to each distinct remote rank).
      CHECK(out[std::size_t(r)].stats.dispatch_bytes == out[std::size_t(r)].expected_dispatch);
      local += out[std::size_t(r)].stats.local_assignments;
    }
    CHECK(local > 0);
  }
}

namespace {

/// Pairs each rank serves in one pass (from the routes the test expects, Outcome::dest).
std::array<long long, 4> served(test::Outcome const& o) {
  std::array<long long, 4> out{};
  for (int d : o.dest) ++out.at(std::size_t(d));
  return out;
}

}  // namespace

TEST_CASE("a joint plan file drives the layer with routing that reacts to each batch", "[layer][plan][joint][reactive]") {
  auto plan = test::joint_plan_from_file();
  for (std::size_t l = 0; l < plan.layers.size(); ++l) {
    std::array<test::Outcome, 4> out;
    collective::run_in_process<4>(
        [&](auto& comm) { out[std::size_t(comm.rank())] = test::run_reactive_layer(comm, plan, l); });
    // The balance the rule aims at: every GPU within (1 + eps) x the mean, or what the batch forces
    // if more (an expert's pairs over its copies; a GPU's single-copy experts), from the reference
    // routes and the copies alone.
    auto const& copies = plan.layers[l].replicas.replicas();
    std::vector<double> pairs(copies.size(), 0.0), forced(4, 0.0);
    for (int e : out[0].ids) pairs[std::size_t(e)] += 1;
    double cap = 1.05 * static_cast<double>(out[0].ids.size()) / 4;
    for (std::size_t e = 0; e < copies.size(); ++e) {
      cap = std::max(cap, std::ceil(pairs[e] / static_cast<double>(copies[e].size())));
      if (copies[e].size() == 1) cap = std::max(cap, forced[std::size_t(copies[e][0])] += pairs[e]);
    }
    std::array<long long, 4> load = served(out[0]);
    for (int r = 0; r < 4; ++r) {
      INFO("layer " << l << ", rank " << r << ": " << load[std::size_t(r)] << " pairs, cap " << cap);
      auto const& o = out[std::size_t(r)];
      CHECK(o.error <= 1e-5);
      CHECK(o.vs_textbook <= 1e-4);
      // The layer deals its pairs as the documented rule does, read back from the routes the policy
      // chose: the bytes it sends and sends back match the test's own walk of those routes.
      CHECK(o.stats.dispatch_bytes == o.expected_dispatch);
      CHECK(o.stats.combine_bytes == o.expected_combine);
      CHECK(o.stats.control_bytes == test::reactive_control_bytes);
      CHECK(served(o) == load);  // every rank computed the same routes
      CHECK(static_cast<double>(load[std::size_t(r)]) <= cap);
    }
  }
}

TEST_CASE("routing that reacts to the batch keeps every pair on its server when each server has a copy",
          "[layer][reactive]") {
  // Hand-worked: 2 servers x 2 GPUs; expert e has copies on GPU e % 2 (server 0) and 2 + e % 2
  // (server 1). With a loose balance bound (eps = 1: a GPU may take half of all pairs), each
  // server's own copies can take all its pairs, so none crosses the NIC. replication::Table on the
  // same copies sends the pairs of a rank without a copy to copy (rank + token) mod 2: some cross.
  std::vector<std::vector<int>> copies(64);
  std::vector<int> primary(64);
  for (int e = 0; e < 64; ++e) copies[std::size_t(e)] = {e % 2, 2 + e % 2}, primary[std::size_t(e)] = e % 2;
  test::Scenario sc{.tokens_per_rank = {13, 7, 0, 20}, .placement = placement::Table(primary), .seed = 7};
  auto crossings = [](test::Outcome const& o) {
    int n = 0;
    for (std::size_t i = 0; i < o.dest.size(); ++i) n += o.dest[i] / 2 != o.source[i / 8] / 2;
    return n;
  };
  std::array<test::Outcome, 4> reactive, table;
  collective::run_in_process<4>([&](auto& comm) {
    reactive[std::size_t(comm.rank())] = test::run_scenario<test::JointModel, router::SoftmaxTopK>(
        comm, sc, replication::Reactive(copies, test::joint_cluster(), 1.0));
    table[std::size_t(comm.rank())] =
        test::run_scenario<test::JointModel, router::SoftmaxTopK>(comm, sc, replication::Table(copies));
  });
  CHECK(crossings(table[0]) > 0);
  CHECK(crossings(reactive[0]) == 0);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    CHECK(reactive[std::size_t(r)].error <= 1e-5);
    CHECK(reactive[std::size_t(r)].stats.dispatch_bytes == reactive[std::size_t(r)].expected_dispatch);
    CHECK(table[std::size_t(r)].stats.dispatch_bytes == table[std::size_t(r)].expected_dispatch);
  }
}
