// The job's secret: LOCKSTEP_JOB_SECRET when set (and well formed), else derived from the
// user's key — the same for every rank of one job, another for another job — which is made
// on first use, readable by its user alone, and refused when others may read it.
#include "lockstep/comm/job_secret.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

#include "io/test_files.h"

namespace lockstep::comm {
namespace {

// HOME and LOCKSTEP_JOB_SECRET as a test sets them, restored after.
class ScopedEnvironment {
 public:
  ScopedEnvironment(const std::string& home, const char* secret) {
    save("HOME");
    save(kJobSecretVariable);
    ::setenv("HOME", home.c_str(), 1);
    if (secret) {
      ::setenv(kJobSecretVariable, secret, 1);
    } else {
      ::unsetenv(kJobSecretVariable);
    }
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        ::setenv(name.c_str(), value->c_str(), 1);
      } else {
        ::unsetenv(name.c_str());
      }
    }
  }

 private:
  void save(const char* name) {
    const char* value = std::getenv(name);
    saved_.emplace_back(name, value ? std::optional<std::string>(value) : std::nullopt);
  }
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

LaunchInfo job(const std::string& id) {
  LaunchInfo info;
  info.launcher = "openmpi";
  info.job_id = id;
  info.master_addr = "10.0.0.1";
  info.master_port = 29500;
  return info;
}

TEST(JobSecret, DerivedFromTheUsersKeyOnePerJob) {
  testing::TempDir home;
  const ScopedEnvironment environment(home.path(), nullptr);
  const std::string first = job_secret(job("41"));
  EXPECT_EQ(first.size(), 32u);
  EXPECT_EQ(job_secret(job("41")), first) << "every rank of the job derives the same";
  EXPECT_NE(job_secret(job("42")), first) << "another job, another secret";
  struct stat info {};
  ASSERT_EQ(::stat((home.path() + "/.lockstep/job-key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
  // A key others may read is no key.
  ::chmod((home.path() + "/.lockstep/job-key").c_str(), 0644);
  testing::expect_error([] { job_secret(job("41")); }, {"job-key", "chmod 600"});
}

TEST(JobSecret, TheLaunchersSecretWinsAndMustBeWellFormed) {
  testing::TempDir home;
  const std::string hex = make_job_secret();
  EXPECT_EQ(hex.size(), 64u);
  EXPECT_NE(make_job_secret(), hex);
  {
    const ScopedEnvironment environment(home.path(), hex.c_str());
    EXPECT_EQ(job_secret(job("1")), job_secret(job("2"))) << "the launcher's, whatever the job id";
    EXPECT_FALSE(std::filesystem::exists(home.path() + "/.lockstep")) << "no key needed";
  }
  const ScopedEnvironment environment(home.path(), "abc");
  testing::expect_error([] { job_secret(job("1")); }, {"LOCKSTEP_JOB_SECRET must be 64 hex digits"});
}

// RFC 4231, test case 2.
TEST(JobSecret, HmacSha256MatchesTheRfc) {
  EXPECT_EQ(to_hex(hmac_sha256("Jefe", "what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

}  // namespace
}  // namespace lockstep::comm
