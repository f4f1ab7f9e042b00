// A run's checkpoints in its folder: each save is checkpoint-<step>.safetensors, written
// atomically (io/checkpoint.h), and the newest is also checkpoint.safetensors (a hard link,
// so no second copy): the file a user takes for --init or an evaluation. The `keep` newest
// saves stay; older ones go. Resuming takes the newest save that loads and passes its hash,
// and names each one it skips, so a save cut short by a crash costs the steps since the one
// before it and nothing else.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lockstep/io/checkpoint.h"

namespace lockstep::train {

struct FoundCheckpoint {
  std::string path;
  Checkpoint checkpoint;
};

class CheckpointFolder {
 public:
  static constexpr const char* kLatestFile = "checkpoint.safetensors";

  // keep: how many saves stay (at least 1). Creates the folder; removes the temporary files
  // of saves whose process is gone.
  CheckpointFolder(std::string dir, int keep);

  // Saves step's checkpoint and makes it the latest. Saves of later steps (left by a run
  // that resumed from an earlier one) go, then all but the `keep` newest. A failed write
  // is an Error naming the file and the space left, and leaves the previous saves as
  // they were.
  void save(int64_t step, const NamedTensors& tensors, const Metadata& metadata) const;

  const std::string& dir() const { return dir_; }
  std::string path_of(int64_t step) const;

  // The steps of the saves in `dir`, oldest first.
  static std::vector<int64_t> saved_steps(const std::string& dir);
  // The newest checkpoint in `dir` that loads and passes its hash: the saves newest first,
  // then checkpoint.safetensors (a run of an older version, or one that links cannot
  // reach). Each one skipped is named in a warning on stderr. nullopt when none loads.
  static std::optional<FoundCheckpoint> load_newest(const std::string& dir);
  // The metadata of the newest checkpoint in `dir` whose header reads (its tensors
  // unchecked: what a program needs to rebuild the run before load_newest), with its path.
  static std::optional<std::pair<std::string, Metadata>> newest_metadata(const std::string& dir);

 private:
  std::string dir_;
  int keep_;
};

}  // namespace lockstep::train
