#include "lockstep/comm/job_secret.h"

#include <fcntl.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "lockstep/core/error.h"
#include "lockstep/core/file_descriptor.h"

namespace lockstep::comm {
namespace {

constexpr size_t kSecretBytes = 32;

std::string from_hex(const std::string& text) {
  LOCKSTEP_CHECK(text.size() == 2 * kSecretBytes)
      << kJobSecretVariable << " must be " << 2 * kSecretBytes << " hex digits (lockstep run makes one), got "
      << text.size() << " characters";
  std::string out;
  for (size_t i = 0; i < text.size(); i += 2) {
    const auto digit = [&](char c) {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      LOCKSTEP_FAIL() << kJobSecretVariable << " must be hex digits, got '" << c << "'";
      return 0;
    };
    out += static_cast<char>(digit(text[i]) * 16 + digit(text[i + 1]));
  }
  return out;
}

// The user's key: read, or made on first use. Only a file of this user that nobody else
// may read or write is a key.
std::string user_key() {
  const char* home = std::getenv("HOME");
  LOCKSTEP_CHECK(home != nullptr && *home != '\0')
      << "the job has no " << kJobSecretVariable << " and HOME is not set, so its ranks cannot share a key: start "
      << "it with lockstep run, or set " << kJobSecretVariable << " on every rank (e.g. to `lockstep run`'s)";
  const std::filesystem::path dir = std::filesystem::path(home) / ".lockstep";
  const std::string path = (dir / "job-key").string();
  ::mkdir(dir.c_str(), 0700);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0 && errno == ENOENT) {
    const std::string key = random_bytes(kSecretBytes);
    const std::string temporary = path + ".tmp." + std::to_string(::getpid());
    const int out = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    LOCKSTEP_CHECK(out >= 0) << "cannot make the job key " << temporary << ": " << std::strerror(errno);
    const bool written = ::write(out, key.data(), key.size()) == static_cast<ssize_t>(key.size());
    ::close(out);
    // link(): of two processes making it at once, one key wins and both read it.
    const bool linked = written && ::link(temporary.c_str(), path.c_str()) == 0;
    const int link_error = errno;
    ::unlink(temporary.c_str());
    LOCKSTEP_CHECK(linked || link_error == EEXIST)
        << "cannot make the job key " << path << ": " << std::strerror(link_error);
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  }
  LOCKSTEP_CHECK(fd >= 0) << "cannot read the job key " << path << ": " << std::strerror(errno);
  const FileDescriptor file(fd);
  struct stat info {};
  LOCKSTEP_CHECK(::fstat(fd, &info) == 0 && S_ISREG(info.st_mode) && info.st_uid == ::getuid() &&
                 (info.st_mode & 077) == 0)
      << "the job key " << path << " must be a file of this user that no one else can read or write (chmod 600 " << path
      << ")";
  std::string key(kSecretBytes, '\0');
  LOCKSTEP_CHECK(::read(fd, key.data(), key.size()) == static_cast<ssize_t>(key.size()))
      << "the job key " << path << " is shorter than " << kSecretBytes << " bytes: remove it, and it is made again";
  return key;
}

}  // namespace

std::string random_bytes(size_t count) {
  std::string bytes(count, '\0');
  for (size_t got = 0; got < count;) {
    const ssize_t n = ::getrandom(bytes.data() + got, count - got, 0);
    if (n < 0 && errno == EINTR) continue;
    LOCKSTEP_CHECK(n > 0) << "getrandom: " << std::strerror(errno);
    got += static_cast<size_t>(n);
  }
  return bytes;
}

std::string to_hex(const std::string& bytes) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string make_job_secret() { return to_hex(random_bytes(kSecretBytes)); }

std::string hmac_sha256(const std::string& key, const std::string& message) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  LOCKSTEP_CHECK(HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
                      reinterpret_cast<const unsigned char*>(message.data()), message.size(), digest,
                      &length) != nullptr)
      << "HMAC-SHA256 failed";
  return {reinterpret_cast<const char*>(digest), length};
}

std::string job_secret(const LaunchInfo& info) {
  if (const char* given = std::getenv(kJobSecretVariable); given != nullptr && *given != '\0') return from_hex(given);
  // What every rank of this job, and no other job of this user, shares.
  return hmac_sha256(user_key(), "lockstep job " + info.launcher + " " + info.job_id + " " + info.master_addr + ":" +
                                     std::to_string(info.master_port));
}

}  // namespace lockstep::comm
