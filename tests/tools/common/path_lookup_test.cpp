// find_on_path as a POSIX shell searches PATH: the first executable file in order, an empty
// entry meaning the current folder, a name with a slash taken as a path.
#include "tools/common/path_lookup.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace lockstep::tools {
namespace {

namespace fs = std::filesystem;

class PathLookup : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("lockstep-path-lookup-" + std::to_string(getpid()));
    for (const char* dir : {"a", "b", "here", "b/tool.d"}) fs::create_directories(root_ / dir);
    file("a/tool", 0644);  // not executable: skipped
    file("b/tool", 0755);
    file("here/local", 0755);
    old_cwd_ = fs::current_path();
    fs::current_path(root_ / "here");
  }
  void TearDown() override {
    fs::current_path(old_cwd_);
    fs::remove_all(root_);
  }
  void file(const std::string& name, mode_t mode) {
    std::ofstream(root_ / name) << "#!/bin/sh\n";
    chmod((root_ / name).c_str(), mode);
  }
  std::string at(const std::string& name) const { return (root_ / name).string(); }

  fs::path root_, old_cwd_;
};

TEST_F(PathLookup, TheFirstExecutableInPathOrderWins) {
  EXPECT_EQ(find_on_path(at("a") + ":" + at("b"), "tool"), at("b") + "/tool");
  EXPECT_EQ(find_on_path(at("a"), "tool"), "");
  EXPECT_EQ(find_on_path(at("b"), "tool.d"), "");  // a folder is not a program
  EXPECT_EQ(find_on_path("", "tool"), "");
}

TEST_F(PathLookup, AnEmptyEntryIsTheCurrentFolder) {
  EXPECT_EQ(find_on_path(at("a") + "::" + at("b"), "local"), "./local");
  EXPECT_EQ(find_on_path(at("a") + ":", "local"), "./local");
  EXPECT_EQ(find_on_path(at("a") + ":" + at("b"), "local"), "");
}

TEST_F(PathLookup, ANameWithASlashIsAPath) {
  EXPECT_EQ(find_on_path(at("a"), at("b") + "/tool"), at("b") + "/tool");
  EXPECT_EQ(find_on_path(at("b"), at("a") + "/tool"), "");
  EXPECT_EQ(find_on_path("", "./local"), "./local");
}

}  // namespace
}  // namespace lockstep::tools
