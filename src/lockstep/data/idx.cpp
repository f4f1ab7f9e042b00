#include "lockstep/data/idx.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iomanip>
#include <limits>
#include <sstream>
#include <vector>

#include "lockstep/core/file_descriptor.h"

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

// Reads a plain file, or a gzip file (one member or several, as `cat a.gz b.gz` makes),
// with zlib's inflate: anything after the last member is an error, where gzread would drop
// it silently. This adds the checks and the messages.
class IdxReader {
 public:
  // O_NONBLOCK: a FIFO given as the file is refused below instead of blocking the open.
  explicit IdxReader(const std::string& path)
      : path_(path), file_(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)) {
    struct stat info {};
    if (file_.get() < 0 || ::fstat(file_.get(), &info) != 0) {
      const int err = errno;
      LOCKSTEP_FAIL() << "IDX file '" << path << "' cannot be opened: " << std::strerror(err);
    }
    LOCKSTEP_CHECK(S_ISREG(info.st_mode)) << "IDX file '" << path << "' is not a regular file";
    file_bytes_ = static_cast<int64_t>(info.st_size);
    LOCKSTEP_CHECK(file_bytes_ > 0) << "IDX file '" << path << "' is empty";
    input_.resize(1 << 17);
    fill();
    gzip_ = starts_gzip_member();
    if (gzip_ && inflateInit2(&stream_, 15 + 16) != Z_OK) {
      gzip_ = false;  // nothing for the destructor to end
      LOCKSTEP_FAIL() << "IDX file '" << path << "': zlib cannot start inflating it (out of memory?)";
    }
  }
  ~IdxReader() {
    if (gzip_) inflateEnd(&stream_);
  }
  IdxReader(const IdxReader&) = delete;
  IdxReader& operator=(const IdxReader&) = delete;

  // Reads up to n bytes; fewer only at the end of the data. A damaged gzip stream throws.
  int64_t read(void* buffer, int64_t n) {
    auto* out = static_cast<uint8_t*>(buffer);
    int64_t done = 0;
    while (done < n) {
      if (stream_.avail_in == 0 && !fill()) {
        if (gzip_ && !between_members_) fail_corrupt(done, "unexpected end of file");
        break;
      }
      if (!gzip_) {
        const int64_t take = std::min<int64_t>(n - done, stream_.avail_in);
        std::memcpy(out + done, stream_.next_in, static_cast<size_t>(take));
        stream_.next_in += take;
        stream_.avail_in -= static_cast<uInt>(take);
        done += take;
        continue;
      }
      if (between_members_) {
        // Another member follows, or the file must end here.
        if (!starts_gzip_member()) {
          LOCKSTEP_FAIL() << "IDX file '" << path_ << "' has " << file_bytes_ - read_bytes_ + stream_.avail_in
                          << " bytes after its gzip stream that are not gzip data; the file is damaged, download "
                             "it again";
        }
        inflateReset(&stream_);
        between_members_ = false;
      }
      const uInt room = static_cast<uInt>(std::min<int64_t>(n - done, int64_t{1} << 30));
      stream_.next_out = out + done;
      stream_.avail_out = room;
      const int status = inflate(&stream_, Z_NO_FLUSH);
      done += room - stream_.avail_out;
      if (status == Z_STREAM_END) {
        between_members_ = true;
      } else if (status != Z_OK && status != Z_BUF_ERROR) {
        fail_corrupt(done, stream_.msg != nullptr ? stream_.msg : "inflate failed");
      }
    }
    consumed_ += done;
    return done;
  }

  // The most payload bytes this file can still hold.
  int64_t capacity() const { return gzip_ ? max_uncompressed_bytes(file_bytes_) - consumed_ : file_bytes_ - consumed_; }

  const std::string& path() const { return path_; }

 private:
  // Reads the next piece of the file when the last is used up; false at its end.
  bool fill() {
    if (stream_.avail_in > 0) return true;
    ssize_t got;
    while ((got = ::read(file_.get(), input_.data(), input_.size())) < 0 && errno == EINTR) {
    }
    if (got < 0) {
      const int err = errno;
      LOCKSTEP_FAIL() << "IDX file '" << path_ << "' cannot be read: " << std::strerror(err);
    }
    read_bytes_ += got;
    stream_.next_in = input_.data();
    stream_.avail_in = static_cast<uInt>(got);
    return got > 0;
  }

  // Whether the unread input starts with gzip's magic bytes (1f 8b), the second perhaps in
  // the next piece of the file.
  bool starts_gzip_member() {
    if (stream_.avail_in == 0 && !fill()) return false;
    if (stream_.next_in[0] != 0x1f) return false;
    if (stream_.avail_in >= 2) return stream_.next_in[1] == 0x8b;
    const uint8_t first = stream_.next_in[0];
    stream_.avail_in = 0;
    if (!fill()) return false;
    // inflate must see both bytes: put the first back in front of the second.
    std::memmove(input_.data() + 1, input_.data(), stream_.avail_in);
    input_[0] = first;
    stream_.next_in = input_.data();
    ++stream_.avail_in;
    return input_[1] == 0x8b;
  }

  [[noreturn]] void fail_corrupt(int64_t done, const std::string& why) {
    LOCKSTEP_FAIL() << "IDX file '" << path_ << "': corrupt gzip stream (" << why << ") after " << consumed_ + done
                    << " uncompressed bytes; the file is damaged or incomplete, download it again";
    std::abort();  // unreachable: the line above throws
  }

  std::string path_;
  FileDescriptor file_;
  std::vector<uint8_t> input_;
  z_stream stream_{};
  bool gzip_ = false;
  bool between_members_ = false;  // a member ended; the next must start here, or the file end
  int64_t file_bytes_ = 0;
  int64_t read_bytes_ = 0;  // of the file, into input_
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
