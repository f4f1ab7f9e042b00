#include "lockstep/data/idx.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <vector>

namespace lockstep {
namespace {

struct IdxType {
  uint8_t code;
  const char* name;
  size_t file_size;  // bytes per element in the file
  DType dtype;
};

constexpr IdxType kIdxTypes[] = {
    {0x08, "unsigned byte", 1, DType::u8}, {0x09, "signed byte", 1, DType::i32}, {0x0B, "short", 2, DType::i32},
    {0x0C, "int", 4, DType::i32},          {0x0D, "float", 4, DType::f32},       {0x0E, "double", 8, DType::f64},
};

// Deflate cannot expand data by more than about 1032:1, so a gzip file of c bytes holds at
// most this much: a header promising more is truncated, and we say so without allocating it.
int64_t max_uncompressed_bytes(int64_t compressed) { return compressed * 1040 + (int64_t{1} << 20); }

// gzopen/gzread read gzip and plain files alike; this adds the checks and the messages.
class IdxReader {
 public:
  explicit IdxReader(const std::string& path) : path_(path) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) {
      const int err = errno;
      LOCKSTEP_FAIL() << "IDX file '" << path << "' cannot be opened: " << std::strerror(err);
    }
    LOCKSTEP_CHECK(S_ISREG(info.st_mode)) << "IDX file '" << path << "' is not a regular file";
    file_bytes_ = static_cast<int64_t>(info.st_size);
    LOCKSTEP_CHECK(file_bytes_ > 0) << "IDX file '" << path << "' is empty";
    file_ = gzopen(path.c_str(), "rb");
    if (file_ == nullptr) {
      const int err = errno;
      LOCKSTEP_FAIL() << "IDX file '" << path << "' cannot be opened: " << std::strerror(err);
    }
    gzbuffer(file_, 1 << 17);
  }
  ~IdxReader() { gzclose(file_); }
  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;

  // Reads up to n bytes; fewer only at the end of the data. A damaged gzip stream throws.
  int64_t read(void* buffer, int64_t n) {
    int64_t done = 0;
    while (done < n) {
      const unsigned chunk = static_cast<unsigned>(std::min<int64_t>(n - done, int64_t{1} << 30));
      const int got = gzread(file_, static_cast<char*>(buffer) + done, chunk);
      if (got < 0) fail_corrupt(done);
      done += got;
      if (got == 0) break;
    }
    if (done < n) check_stream(done);
    consumed_ += done;
    return done;
  }

  // The most payload bytes this file can still hold.
  int64_t capacity() const {
    return gzdirect(file_) ? file_bytes_ - consumed_ : max_uncompressed_bytes(file_bytes_) - consumed_;
  }

  const std::string& path() const { return path_; }

 private:
  // A gzip stream that ends early reports Z_BUF_ERROR; one with bad data Z_DATA_ERROR.
  void check_stream(int64_t done) {
    int errnum = Z_OK;
    gzerror(file_, &errnum);
    if (errnum != Z_OK) fail_corrupt(done);
  }

  [[noreturn]] void fail_corrupt(int64_t done) {
    int errnum = Z_OK;
    std::string message = gzerror(file_, &errnum);
    // zlib prefixes its message with the path, which ours already names.
    if (message.rfind(path_ + ": ", 0) == 0) message.erase(0, path_.size() + 2);
    LOCKSTEP_FAIL() << "IDX file '" << path_ << "': corrupt gzip stream (" << message << ") after " << consumed_ + done
                    << " uncompressed bytes; the file is damaged or incomplete, download it again";
    std::abort();  // unreachable: the line above throws
  }

  std::string path_;
  gzFile file_ = nullptr;
  int64_t file_bytes_ = 0;
  int64_t consumed_ = 0;
};

std::string hex_bytes(const uint8_t* bytes, int64_t n) {
  std::ostringstream out;
  for (int64_t i = 0; i < n; ++i)
    out << (i ? " " : "") << std::hex << std::setw(2) << std::setfill('0') << static_cast<int>(bytes[i]);
  return out.str();
}

// Converts n big-endian elements of the file's type into the tensor's dtype, in place when
// the sizes match.
void decode_payload(const IdxType& type, const uint8_t* src, void* dst, int64_t n) {
  switch (type.code) {
    case 0x08:
      if (src != dst) std::memcpy(dst, src, static_cast<size_t>(n));
      break;
    case 0x09: {
      auto* out = static_cast<int32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int8_t>(src[i]);
      break;
    }
    case 0x0B: {
      auto* out = static_cast<int32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int16_t>((src[2 * i] << 8) | src[2 * i + 1]);
      break;
    }
    case 0x0C:
    case 0x0D: {
      uint32_t word;
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(&word, src + 4 * i, 4);
        word = __builtin_bswap32(word);
        std::memcpy(static_cast<uint8_t*>(dst) + 4 * i, &word, 4);
      }
      break;
    }
    case 0x0E: {
      uint64_t word;
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(&word, src + 8 * i, 8);
        word = __builtin_bswap64(word);
        std::memcpy(static_cast<uint8_t*>(dst) + 8 * i, &word, 8);
      }
      break;
    }
  }
}

}  // namespace

Tensor read_idx(const std::string& path) {
  IdxReader reader(path);
  uint8_t magic[4];
  const int64_t magic_got = reader.read(magic, 4);
  LOCKSTEP_CHECK(magic_got == 4) << "IDX file '" << path << "' is too short for an IDX header: " << magic_got
                                 << " bytes";
  LOCKSTEP_CHECK(magic[0] == 0 && magic[1] == 0)
      << "IDX file '" << path << "' has a bad magic number: its first bytes are " << hex_bytes(magic, 4)
      << ", but an IDX file starts with 00 00, a type code and the rank (00 00 08 03 for MNIST images)";
  const IdxType* type = nullptr;
  for (const IdxType& t : kIdxTypes) {
    if (t.code == magic[2]) type = &t;
  }
  if (type == nullptr) {
    LOCKSTEP_FAIL() << "IDX file '" << path << "' has unsupported type code 0x" << hex_bytes(&magic[2], 1)
                    << "; IDX defines 08 (unsigned byte), 09 (signed byte), 0B (short), 0C (int), 0D (float), "
                       "0E (double)";
  }

  const int64_t rank = magic[3];
  std::vector<uint8_t> dim_bytes(static_cast<size_t>(4 * rank));
  const int64_t dims_got = reader.read(dim_bytes.data(), 4 * rank);
  LOCKSTEP_CHECK(dims_got == 4 * rank) << "IDX file '" << path << "' has a truncated header: rank " << rank << " needs "
                                       << 4 * rank << " bytes of dimensions, got " << dims_got;
  Shape shape(static_cast<size_t>(rank));
  int64_t count = 1;
  for (int64_t i = 0; i < rank; ++i) {
    const uint8_t* b = &dim_bytes[static_cast<size_t>(4 * i)];
    shape[static_cast<size_t>(i)] = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | b[3];
    const int64_t d = shape[static_cast<size_t>(i)];
    LOCKSTEP_CHECK(d == 0 || count <= std::numeric_limits<int64_t>::max() / 16 / d)
        << "IDX file '" << path << "' has dimensions " << shape_str(shape) << " too large to hold in memory";
    count *= d;
  }
  const int64_t expected = count * static_cast<int64_t>(type->file_size);

  auto truncated = [&](int64_t got) {
    LOCKSTEP_FAIL() << "IDX file '" << path << "' has a truncated payload: expected " << expected << " bytes ("
                    << shape_str(shape) << " of " << type->name << "), got " << got
                    << "; the file is incomplete, download it again";
  };
  if (expected > reader.capacity()) {
    // Count what is there (bounded by the file's capacity) to say how much is missing.
    std::vector<uint8_t> scratch(1 << 16);
    int64_t got = 0, step;
    while ((step = reader.read(scratch.data(), static_cast<int64_t>(scratch.size()))) > 0) got += step;
    truncated(got);
  }

  Tensor out = Tensor::empty(shape, type->dtype);
  const bool in_place = type->file_size == dtype_size(type->dtype);
  std::vector<uint8_t> staging(in_place ? 0 : static_cast<size_t>(expected));
  uint8_t* target = in_place ? static_cast<uint8_t*>(out.raw_data()) : staging.data();
  const int64_t got = reader.read(target, expected);
  if (got < expected) truncated(got);
  uint8_t extra;
  LOCKSTEP_CHECK(reader.read(&extra, 1) == 0)
      << "IDX file '" << path << "' has bytes after the payload of dimensions " << shape_str(shape) << " of "
      << type->name << " (" << expected << " bytes): the header does not describe this file";
  decode_payload(*type, target, out.raw_data(), count);
  return out;
}

}  // namespace lockstep
