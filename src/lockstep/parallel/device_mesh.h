// A device mesh: D × T × P ranks as data-parallel replicas, tensor-parallel groups and
// pipeline stages. Rank r sits at tp = r mod T, dp = (r / T) mod D, pp = r / (T·D): the
// tensor-parallel ranks, which talk in every layer, are neighbours (Megatron-LM's order), and
// the pipeline stages, which pass one activation per micro-batch, are farthest apart.
#pragma once

#include <memory>
#include <string>

#include "lockstep/comm/communicator.h"

namespace lockstep::parallel {

struct MeshShape {
  int dp = 1, tp = 1, pp = 1;
  int size() const { return dp * tp * pp; }
  std::string str() const;  // "dp 2 x tp 2 x pp 2"
};

struct MeshCoord {
  int dp = 0, tp = 0, pp = 0;
};

MeshCoord mesh_coord(const MeshShape& shape, int rank);
int mesh_rank(const MeshShape& shape, const MeshCoord& coord);

// "" when `devices` devices make the mesh (every size at least 1, their product the device
// count), else the error with the arithmetic.
std::string check_mesh(const MeshShape& shape, int devices);

class DeviceMesh {
 public:
  // Collective over `world` (its size must be shape.size()): splits it into the three kinds
  // of group this rank belongs to.
  DeviceMesh(std::shared_ptr<comm::Communicator> world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoord& coord() const { return coord_; }
  const std::shared_ptr<comm::Communicator>& world() const { return world_; }
  // The ranks that differ from this one only in that coordinate, ranked by it.
  const std::shared_ptr<comm::Communicator>& dp_group() const { return dp_; }
  const std::shared_ptr<comm::Communicator>& tp_group() const { return tp_; }
  const std::shared_ptr<comm::Communicator>& pp_group() const { return pp_; }

 private:
  MeshShape shape_;
  MeshCoord coord_;
  std::shared_ptr<comm::Communicator> world_, dp_, tp_, pp_;
};

}  // namespace lockstep::parallel
