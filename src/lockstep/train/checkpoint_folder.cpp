#include "lockstep/train/checkpoint_folder.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "lockstep/core/error.h"

namespace lockstep::train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPrefix = "checkpoint-";
constexpr const char* kSuffix = ".safetensors";

// The step of a save's file name, checkpoint-<digits>.safetensors.
std::optional<int64_t> step_of(const std::string& name) {
  const std::string prefix = kPrefix, suffix = kSuffix;
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size() - suffix.size();
  int64_t step = 0;
  const auto [end, error] = std::from_chars(first, last, step);
  if (error != std::errc() || end != last || step < 0) return std::nullopt;
  return step;
}

std::string free_space(const std::string& dir) {
  struct statvfs info {};
  if (::statvfs(dir.c_str(), &info) != 0) return "the free space is unknown";
  const double mib = static_cast<double>(info.f_bavail) * static_cast<double>(info.f_frsize) / (1024.0 * 1024.0);
  char text[64];
  std::snprintf(text, sizeof(text), "%.1f MiB free", mib);
  return text;
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// A temporary file of an interrupted save, <name>.tmp.<pid>, whose process is gone.
bool is_orphaned_temporary(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || name.rfind("checkpoint", 0) != 0) return false;
  int pid = 0;
  const char* first = name.data() + at + 5;
  const char* last = name.data() + name.size();
  const auto [end, error] = std::from_chars(first, last, pid);
  if (error != std::errc() || end != last || pid <= 0 || pid == ::getpid()) return false;
  return ::kill(pid, 0) != 0 && errno == ESRCH;
}

std::string save_path(const std::string& dir, int64_t step) {
  char name[64];
  std::snprintf(name, sizeof(name), "%s%08lld%s", kPrefix, static_cast<long long>(step), kSuffix);
  return (fs::path(dir) / name).string();
}

}  // namespace

CheckpointFolder::CheckpointFolder(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {
  LOCKSTEP_CHECK(keep_ >= 1) << "checkpoints: keep at least 1, got " << keep_;
  std::error_code error;
  fs::create_directories(dir_, error);
  LOCKSTEP_CHECK(!error) << "cannot create the run's folder '" << dir_ << "': " << error.message();
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, error)) {
    if (entry.is_regular_file() && is_orphaned_temporary(entry.path().filename().string()))
      fs::remove(entry.path(), error);
  }
}

std::string CheckpointFolder::path_of(int64_t step) const { return save_path(dir_, step); }

void CheckpointFolder::save(int64_t step, const NamedTensors& tensors, const Metadata& metadata) const {
  const std::string path = path_of(step);
  try {
    save_checkpoint(path, tensors, metadata);
  } catch (const Error& e) {
    LOCKSTEP_FAIL() << e.what() << " (" << free_space(dir_) << " in " << dir_ << "; the previous checkpoint is intact)";
  }
  // The latest is a second name of the same file: linked under a temporary name, renamed
  // over the old one. Where links are not allowed, it is written again.
  const std::string latest = (fs::path(dir_) / kLatestFile).string();
  const std::string temporary = latest + ".link." + std::to_string(::getpid());
  ::unlink(temporary.c_str());
  if (::link(path.c_str(), temporary.c_str()) == 0) {
    if (::rename(temporary.c_str(), latest.c_str()) != 0) {
      const int err = errno;
      ::unlink(temporary.c_str());
      LOCKSTEP_FAIL() << "cannot make " << path << " the latest checkpoint " << latest << ": " << std::strerror(err);
    }
    fsync_directory(dir_);
  } else {
    save_checkpoint(latest, tensors, metadata);
  }
  std::vector<int64_t> kept;
  std::error_code error;
  for (int64_t saved : saved_steps(dir_)) {
    if (saved > step) {
      fs::remove(path_of(saved), error);  // a future the run no longer has
    } else {
      kept.push_back(saved);
    }
  }
  for (size_t i = 0; i + static_cast<size_t>(keep_) < kept.size(); ++i) fs::remove(path_of(kept[i]), error);
}

std::vector<int64_t> CheckpointFolder::saved_steps(const std::string& dir) {
  std::vector<int64_t> steps;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, error)) {
    if (const std::optional<int64_t> step = step_of(entry.path().filename().string()); step && entry.is_regular_file())
      steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

namespace {

// The saves newest first, then the latest.
std::vector<std::string> candidates_in(const std::string& dir) {
  std::vector<std::string> candidates;
  const std::vector<int64_t> steps = CheckpointFolder::saved_steps(dir);
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) candidates.push_back(save_path(dir, *it));
  const std::string latest = (fs::path(dir) / CheckpointFolder::kLatestFile).string();
  std::error_code error;
  if (fs::exists(latest, error)) candidates.push_back(latest);
  return candidates;
}

}  // namespace

std::optional<std::pair<std::string, Metadata>> CheckpointFolder::newest_metadata(const std::string& dir) {
  for (const std::string& path : candidates_in(dir)) {
    try {
      return std::pair{path, load_safetensors_metadata(path)};
    } catch (const Error&) {
      // load_newest names it when it skips it
    }
  }
  return std::nullopt;
}

std::optional<FoundCheckpoint> CheckpointFolder::load_newest(const std::string& dir) {
  const std::vector<std::string> candidates = candidates_in(dir);
  std::error_code error;
  std::vector<std::string> tried;
  for (const std::string& path : candidates) {
    // The latest is usually a second name of the newest save: tried once.
    if (std::any_of(tried.begin(), tried.end(), [&](const std::string& t) { return fs::equivalent(t, path, error); }))
      continue;
    tried.push_back(path);
    try {
      return FoundCheckpoint{path, load_checkpoint(path)};
    } catch (const Error& e) {
      std::fprintf(stderr, "lockstep: warning: skipping checkpoint %s: %s\n", path.c_str(), e.what());
    }
  }
  return std::nullopt;
}

}  // namespace lockstep::train
