#include "lockstep/parallel/shard.h"

#include "lockstep/ops/ops.h"

namespace lockstep::parallel {

Tensor shard_of(const Tensor& full, int64_t axis, int rank, int ranks, const std::string& what, int64_t parts) {
  const int64_t n = full.size(axis) / parts;
  LOCKSTEP_CHECK(n * parts == full.size(axis) && n % ranks == 0)
      << what << ": " << n << " features do not cut into " << ranks
      << " equal tensor-parallel shards; use a tensor-parallel size that divides " << n;
  const int64_t size = n / ranks;
  std::vector<Tensor> pieces;
  for (int64_t p = 0; p < parts; ++p) {
    const int64_t begin = p * n + size * rank;
    pieces.push_back(slice(full, axis, begin, begin + size));
  }
  return (parts == 1 ? pieces[0] : concat(pieces, axis)).contiguous().clone();
}

Tensor unshard(const std::vector<Tensor>& shards, const ShardSpec& spec) {
  LOCKSTEP_CHECK(!shards.empty()) << "unshard " << spec.full_name << ": no shards";
  if (spec.axis < 0) return shards[0].contiguous().clone();
  const int64_t size = shards[0].size(spec.axis) / spec.parts;
  std::vector<Tensor> pieces;
  for (int64_t p = 0; p < spec.parts; ++p) {
    for (const Tensor& shard : shards) pieces.push_back(slice(shard, spec.axis, p * size, (p + 1) * size));
  }
  return concat(pieces, spec.axis).contiguous();
}

}  // namespace lockstep::parallel
