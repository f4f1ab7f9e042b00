// A Store in a directory that every rank of one host sees: how ranks meet when the launcher
// gave no MASTER_ADDR (mpirun or srun on one host). One file per key, written under a
// temporary name and renamed, so a reader sees a whole value or none; add() holds an
// flock on a lock file. get() polls, which costs a few milliseconds: fine for rendezvous.
#pragma once

#include <chrono>
#include <string>

#include "lockstep/comm/store.h"

namespace lockstep::comm {

class FileStore : public Store {
 public:
  // Creates directory (its parent must exist) unless it is there; it must be this user's,
  // since whoever can write it can feed the ranks keys. Each store signs in with a file
  // naming its process; a directory whose processes have all ended (a job whose rank 0 was
  // killed before it could clean up) is emptied first, so a later job of the same id does
  // not read its keys. remove_on_destroy: the destructor
  // calls remove_directory(). rendezvous_store() gives that to rank 0 alone, whose store,
  // like a TcpStore's server, must then outlive every other rank's use of it.
  explicit FileStore(std::string directory, bool remove_on_destroy = false);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  bool check(const std::string& key) override;

  // Removes the files a FileStore writes, then the directory if nothing else is left in it.
  // Only once every rank is done with the store: a rank still waiting for a key then waits
  // in vain. Never throws.
  void remove_directory() noexcept;
  const std::string& directory() const { return directory_; }

 private:
  std::string path_of(const std::string& key) const;
  // Under the lock: empties a directory left by processes that are gone, then signs in.
  void sign_in();
  // Writes value to a temporary file and renames it to path.
  void write_atomically(const std::string& path, const std::string& value) const;

  std::string directory_;
  bool remove_on_destroy_;
};

}  // namespace lockstep::comm
