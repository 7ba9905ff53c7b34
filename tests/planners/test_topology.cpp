// Topologies: hop distances against Floyd-Warshall on the written link list, the paper's cluster,
// and bad topology files.
#include <catch2/catch.hpp>

#include <map>
#include <sstream>

#include "moe/topology/topology.hpp"

using namespace moe::topology;

static Topology parse_topology(std::string const& s) {
  std::istringstream in(s);
  moe::core::TsvReader r(in, "topo.tsv");
  return read_topology(r);
}

/// Independent reference: Floyd-Warshall over the file's vertices and links.
static void check_against_floyd(Topology const& t) {
  std::ostringstream os;
  t.write(os);
  std::istringstream in(os.str());
  std::map<std::string, int> id;
  std::vector<std::pair<std::string, int>> servers;
  std::vector<std::pair<int, int>> links;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ls(line);
    std::string kind, a, b;
    ls >> kind >> a;
    if (kind == "link") {
      ls >> b;
      links.emplace_back(id.at(a), id.at(b));
    } else {
      int n = static_cast<int>(id.size());
      id[a] = n;
      if (kind == "server") {
        int g;
        ls >> g;
        servers.emplace_back(a, g);
      }
    }
  }
  int V = static_cast<int>(id.size());
  const int INF = 1 << 20;
  std::vector<std::vector<int>> d(V, std::vector<int>(V, INF));
  for (int v = 0; v < V; ++v) d[v][v] = 0;
  for (auto [a, b] : links) d[a][b] = d[b][a] = 1;
  for (int k = 0; k < V; ++k)
    for (int i = 0; i < V; ++i)
      for (int j = 0; j < V; ++j) d[i][j] = std::min(d[i][j], d[i][k] + d[k][j]);
  std::vector<int> gpu_vertex;
  for (auto& [name, g] : servers)
    for (int i = 0; i < g; ++i) gpu_vertex.push_back(id.at(name));
  REQUIRE(static_cast<int>(gpu_vertex.size()) == t.gpus());
  for (int a = 0; a < t.gpus(); ++a)
    for (int b = 0; b < t.gpus(); ++b) REQUIRE(t.hops(a, b) == d[gpu_vertex[a]][gpu_vertex[b]]);
  Topology back = parse_topology(os.str());
  CHECK(back.gpu_hops() == t.gpu_hops());
}

TEST_CASE("paper cluster: 256 GPUs, 4 per server, 16 leaves of 4 servers") {
  for (Kind k : {Kind::fat_tree, Kind::dragonfly, Kind::fat_tree_sparse, Kind::dragonfly_sparse}) {
    Topology t = paper_cluster(k);
    CHECK(t.gpus() == 256);
    CHECK(t.servers() == 64);
    CHECK(t.hops(0, 3) == 0);   // one server
    CHECK(t.hops(0, 4) == 2);   // one leaf
    CHECK(t.hops(0, 16) >= 3);  // another leaf
  }
  Topology ft = paper_cluster(Kind::fat_tree);
  CHECK(ft.hops(0, 255) == 4);
  Topology fs = paper_cluster(Kind::fat_tree_sparse);
  CHECK(fs.hops(0, 16) == 4);   // same pod
  CHECK(fs.hops(0, 255) == 6);  // other pod
  Topology df = paper_cluster(Kind::dragonfly);
  Topology ds = paper_cluster(Kind::dragonfly_sparse);
  long long sum_df = 0, sum_ds = 0;
  for (int a = 0; a < 256; a += 4)
    for (int b = 0; b < 256; b += 4) sum_df += df.hops(a, b), sum_ds += ds.hops(a, b);
  CHECK(sum_ds > sum_df);  // fewer global links: longer paths on average
}

TEST_CASE("hop distances equal Floyd-Warshall on the link list") {
  check_against_floyd(fat_tree(4, 2, 2, 2));
  check_against_floyd(fat_tree_sparse(6, 2, 1, 3));
  check_against_floyd(dragonfly(8, 2, 1, 4));
  check_against_floyd(dragonfly_sparse(12, 1, 2, 6));
  check_against_floyd(dragonfly(6, 1, 3, 3));
}

TEST_CASE("topology files: bad input is reported") {
  CHECK_THROWS_WITH(parse_topology("server\ta\t1\nserver\tb\t1\nswitch\ts\nlink\ta\ts\n"), Catch::Contains("unreachable"));
  CHECK_THROWS_WITH(parse_topology("server\ta\t1\nlink\ta\tb\n"), Catch::Contains("unknown vertex 'b'"));
  CHECK_THROWS_WITH(parse_topology("server\ta\t1\nserver\ta\t2\n"), Catch::Contains("duplicate"));
  CHECK_THROWS_WITH(parse_topology("server\ta\t0\n"), Catch::Contains("topo.tsv:1: column 3 (gpus): 0 outside [1, 4096]"));
  // Absurd GPU counts (a corrupt file) are errors, not gigabytes of hop matrix or an int overflow.
  CHECK_THROWS_WITH(parse_topology("server\ta\t2000000000\n"), Catch::Contains("topo.tsv:1: column 3 (gpus)"));
  CHECK_THROWS_WITH(parse_topology("server\ta\t1000000\n"), Catch::Contains("topo.tsv:1: column 3 (gpus): 1000000 outside"));
  CHECK_THROWS_WITH(parse_topology("server\ta\t3000\nserver\tb\t3000\n"),
                    Catch::Contains("topo.tsv:2") && Catch::Contains("brings the cluster to 6000 GPUs"));
  {
    // 20,000 one-GPU servers: stopped at the 4097th GPU, before any S x S table is built.
    std::string many;
    for (int i = 0; i < 20000; ++i) many += "server\ts" + std::to_string(i) + "\t1\n";
    CHECK_THROWS_WITH(parse_topology(many), Catch::Contains("topo.tsv:4097") && Catch::Contains("above the limit of 4096"));
    // Switches and links are bounded too (they size the breadth-first searches).
    std::string switches = "server\ta\t1\n";
    for (int i = 0; i < 20000; ++i) switches += "switch\tw" + std::to_string(i) + "\n";
    CHECK_THROWS_WITH(parse_topology(switches), Catch::Contains("topo.tsv:16385") && Catch::Contains("more than 16384"));
    std::string links = "server\ta\t1\nswitch\tw\n";
    for (int i = 0; i < 70000; ++i) links += "link\ta\tw\n";
    CHECK_THROWS_WITH(parse_topology(links), Catch::Contains("topo.tsv:65539") && Catch::Contains("more than 65536 links"));
  }
  CHECK_THROWS_WITH(parse_topology("router\ta\n"), Catch::Contains("unknown line kind"));
  CHECK_THROWS_WITH(parse_topology("server\ta\n"), Catch::Contains("expected 3 fields"));
  CHECK_THROWS_WITH(parse_topology("switch\ts\n"), Catch::Contains("no servers"));
  Topology t = parse_topology("server\ta\t2\nserver\tb\t1\nswitch\ts\nlink\ta\ts\nlink\tb\ts\n");
  CHECK(t.gpus() == 3);
  CHECK(t.hops(0, 1) == 0);
  CHECK(t.hops(0, 2) == 2);
}
