#include "lockstep/parallel/device_mesh.h"

#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::parallel {

std::string MeshShape::str() const {
  std::ostringstream out;
  out << "dp " << dp << " x tp " << tp << " x pp " << pp;
  return out.str();
}

MeshCoord mesh_coord(const MeshShape& shape, int rank) {
  return {.dp = (rank / shape.tp) % shape.dp, .tp = rank % shape.tp, .pp = rank / (shape.tp * shape.dp)};
}

int mesh_rank(const MeshShape& shape, const MeshCoord& coord) {
  return coord.tp + shape.tp * (coord.dp + shape.dp * coord.pp);
}

std::string check_mesh(const MeshShape& shape, int devices) {
  std::ostringstream error;
  if (shape.dp < 1 || shape.tp < 1 || shape.pp < 1) {
    error << "the mesh's sizes must be at least 1, got " << shape.str();
  } else if (shape.size() != devices) {
    error << "a mesh of " << shape.str() << " needs " << shape.size() << " devices, not " << devices
          << " (devices = dp x tp x pp): change --devices or the mesh's sizes";
  }
  return error.str();
}

DeviceMesh::DeviceMesh(std::shared_ptr<comm::Communicator> world, const MeshShape& shape)
    : shape_(shape), world_(std::move(world)) {
  const std::string error = check_mesh(shape, world_->size());
  LOCKSTEP_CHECK(error.empty()) << error;
  coord_ = mesh_coord(shape, world_->rank());
  const MeshCoord c = coord_;
  // Color: the coordinates the group shares; key: the one it varies in.
  dp_ = world_->split(c.tp + shape.tp * c.pp, c.dp);
  tp_ = world_->split(c.dp + shape.dp * c.pp, c.tp);
  pp_ = world_->split(c.tp + shape.tp * c.dp, c.pp);
}

}  // namespace lockstep::parallel
