#pragma once
// moe-compose: one include for everything host-side. Backends with their own dependencies are
// included separately: moe/collective/mpi.hpp (MPI), moe/collective/nccl.hpp (CUDA + NCCL),
// moe/placement/cocluster_metis.hpp (METIS), and the CUDA kernels in moe/kernels/*.cuh (nvcc).

// Foundation: configuration, shapes, routers, tables, collectives, the layer.
#include "moe/config.hpp"
#include "moe/core/bf16.hpp"
#include "moe/core/shape.hpp"
#include "moe/core/tsv.hpp"
#include "moe/core/workspace.hpp"
#include "moe/models/models.hpp"
#include "moe/router/router.hpp"
#include "moe/placement/table.hpp"
#include "moe/replication/table.hpp"
#include "moe/schedule/sequential.hpp"
#include "moe/collective/concept.hpp"
#include "moe/collective/in_process.hpp"
#include "moe/kernels/host.hpp"
#include "moe/layer/weights.hpp"
#include "moe/layer/reference.hpp"
#include "moe/layer/layer.hpp"
#include "moe/layer/shuffled.hpp"

// Profiles and topologies.
#include "moe/profile/load_profile.hpp"
#include "moe/profile/olmoe_tokens.hpp"
#include "moe/profile/route_profile.hpp"
#include "moe/profile/route_split.hpp"
#include "moe/profile/route_synthetic.hpp"
#include "moe/topology/topology.hpp"
#include "moe/topology/presets.hpp"
#include "moe/topology/traffic.hpp"

// Offline planners: placement (ILP/ILPLoad, heuristics, s-EG co-clustering) and replication.
#include "moe/placement/problem.hpp"
#include "moe/placement/heuristics.hpp"
#include "moe/placement/network_simplex.hpp"
#include "moe/placement/ilp.hpp"
#include "moe/placement/eplb_packing.hpp"
#include "moe/placement/cocluster.hpp"
#include "moe/placement/metrics.hpp"
#include "moe/placement/plan_io.hpp"
#include "moe/replication/eplb.hpp"
#include "moe/replication/craft.hpp"

// Speculative MoE: predictors, shuffle plans, metrics.
#include "moe/speculative/predictor.hpp"
#include "moe/speculative/table_io.hpp"
#include "moe/speculative/shuffle_plan.hpp"
#include "moe/speculative/metrics.hpp"
#include "moe/speculative/comm_volume.hpp"

// FinDEP: performance models, solver, simulator, host executor.
#include "moe/schedule/findep.hpp"
#include "moe/schedule/findep_executor.hpp"
#include "moe/schedule/disaggregated.hpp"
#include "moe/layer/disaggregated.hpp"
