#include "lockstep/io/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "lockstep/core/file_descriptor.h"

namespace lockstep {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian bytes, which this code copies as they are in memory");

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kMetadataKey = "__metadata__";
constexpr DType kDtypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8};

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t written = ::write(fd, p, std::min<size_t>(n, size_t{1} << 30));
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) {
      const int err = errno;
      LOCKSTEP_FAIL() << "cannot write safetensors file '" << path << "': " << std::strerror(err);
    }
    p += written;
    n -= static_cast<size_t>(written);
  }
}

// Reads exactly n bytes at offset; the caller has checked the file is long enough.
void read_all(int fd, void* data, size_t n, int64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, std::min<size_t>(n, size_t{1} << 30), offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      LOCKSTEP_FAIL() << "cannot read safetensors file '" << path << "': " << std::strerror(err);
    }
    LOCKSTEP_CHECK(got > 0) << "safetensors file '" << path << "' ended early at byte " << offset
                            << " (was it changed while being read?)";
    p += got;
    n -= static_cast<size_t>(got);
    offset += got;
  }
}

// A contiguous CPU tensor with t's values: t itself when it already is one.
Tensor host_contiguous(const Tensor& t) {
  Tensor host = t.detach();
  if (!host.device().is_cpu()) host = host.to(Device::cpu());
  if (host.is_contiguous()) return host;
  Tensor copy = Tensor::empty(host.shape(), host.dtype());
  copy.copy_from(host);
  return copy;
}

std::string header_json(const NamedTensors& tensors, const Metadata& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    LOCKSTEP_CHECK(!name.empty() && name != kMetadataKey)
        << "safetensors: a tensor cannot be named '" << name << "' (empty or reserved)";
    LOCKSTEP_CHECK(seen.insert(name).second) << "safetensors: two tensors are named '" << name << "'";
    LOCKSTEP_CHECK(tensor.defined()) << "safetensors: tensor '" << name << "' is undefined";
    const uint64_t end = offset + tensor.nbytes();
    header[name] = Json{
        {"dtype", dtype_safetensors_name(tensor.dtype())}, {"shape", tensor.shape()}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::exception& e) {
    LOCKSTEP_FAIL() << "safetensors: a tensor name or metadata string is not valid UTF-8 (" << e.what() << ")";
  }
  text.resize((text.size() + 7) / 8 * 8, ' ');
  return text;
}

// Text and JSON values as an error quotes them: at most 80 characters.
std::string shortened(std::string text) {
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}
std::string excerpt(const Json& value) { return shortened(value.dump()); }

DType parse_safetensors_dtype(const std::string& name, const std::string& where) {
  for (DType d : kDtypes) {
    if (name == dtype_safetensors_name(d)) return d;
  }
  LOCKSTEP_FAIL() << where << " has dtype '" << shortened(name)
                  << "', which Lockstep does not read; supported: F32, F64, BF16, F16, I32, I64, U8";
  return DType::f32;
}

int64_t json_size(const Json& value, const std::string& what, const std::string& where) {
  LOCKSTEP_CHECK(value.is_number_unsigned() &&
                 value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      << where << ": " << what << " must be a non-negative integer, got " << excerpt(value);
  return static_cast<int64_t>(value.get<uint64_t>());
}

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  int64_t begin, end;
};

Entry parse_entry(const std::string& name, const Json& info, int64_t buffer_bytes, const std::string& file) {
  const std::string where = "safetensors file '" + file + "': tensor '" + shortened(name) + "'";
  LOCKSTEP_CHECK(info.is_object()) << where << " is described by " << excerpt(info) << ", not an object";
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    LOCKSTEP_CHECK(info.contains(field)) << where << " has no '" << field << "' field";
  }
  LOCKSTEP_CHECK(info["dtype"].is_string()) << where << ": dtype must be a string, got " << excerpt(info["dtype"]);
  Entry entry{name, parse_safetensors_dtype(info["dtype"].get<std::string>(), where), {}, 0, 0};
  LOCKSTEP_CHECK(info["shape"].is_array()) << where << ": shape must be an array, got " << excerpt(info["shape"]);
  int64_t elements = 1;
  int64_t extent = 1;  // the product of the sizes that are not 0: a 0 must not let a huge size through
  for (const Json& d : info["shape"]) {
    const int64_t size = json_size(d, "each dimension", where);
    LOCKSTEP_CHECK(size == 0 || extent <= std::numeric_limits<int64_t>::max() / 8 / size)
        << where << ": shape " << excerpt(info["shape"]) << " is too large";
    elements *= size;
    if (size > 0) extent *= size;
    entry.shape.push_back(size);
  }
  const Json& offsets = info["data_offsets"];
  LOCKSTEP_CHECK(offsets.is_array() && offsets.size() == 2)
      << where << ": data_offsets must be [begin, end], got " << excerpt(offsets);
  entry.begin = json_size(offsets[0], "data_offsets", where);
  entry.end = json_size(offsets[1], "data_offsets", where);
  LOCKSTEP_CHECK(entry.begin <= entry.end)
      << where << ": data_offsets " << excerpt(offsets) << " end before they begin";
  LOCKSTEP_CHECK(entry.end <= buffer_bytes)
      << where << ": data_offsets " << excerpt(offsets) << " reach past the data, which holds " << buffer_bytes
      << " bytes (is the file truncated?)";
  const int64_t expected = elements * static_cast<int64_t>(dtype_size(entry.dtype));
  LOCKSTEP_CHECK(entry.end - entry.begin == expected)
      << where << ": data_offsets " << excerpt(offsets) << " span " << entry.end - entry.begin << " bytes, but "
      << info["dtype"].get<std::string>() << " " << shape_str(entry.shape) << " needs " << expected;
  return entry;
}

// The spec requires the tensors to tile the data exactly: no overlaps, no holes, no tail.
void check_layout(std::vector<Entry> entries, int64_t buffer_bytes, const std::string& file) {
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  int64_t covered = 0;
  const Entry* previous = nullptr;
  for (const Entry& e : entries) {
    LOCKSTEP_CHECK(e.begin >= covered) << "safetensors file '" << file << "': tensor '" << e.name << "' (bytes "
                                       << e.begin << ".." << e.end << ") overlaps tensor '"
                                       << (previous ? previous->name : "") << "' (bytes " << previous->begin << ".."
                                       << previous->end << ")";
    LOCKSTEP_CHECK(e.begin == covered) << "safetensors file '" << file << "': bytes " << covered << ".." << e.begin
                                       << " before tensor '" << e.name << "' belong to no tensor";
    covered = e.end;
    previous = &e;
  }
  LOCKSTEP_CHECK(covered == buffer_bytes)
      << "safetensors file '" << file << "': the tensors cover " << covered << " bytes of data but the file holds "
      << buffer_bytes << "; the header does not describe this file";
}

}  // namespace

bool TensorFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& entry) { return entry.first == name; });
}

const Tensor& TensorFile::at(const std::string& name) const {
  for (const auto& entry : tensors) {
    if (entry.first == name) return entry.second;
  }
  std::string names;
  for (size_t i = 0; i < tensors.size() && i < 8; ++i) names += (i ? ", " : "") + tensors[i].first;
  if (tensors.size() > 8) names += ", ...";
  LOCKSTEP_FAIL() << "no tensor named '" << name << "' among the " << tensors.size() << " tensors (" << names << ")";
  return tensors.front().second;
}

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  const std::string header = header_json(tensors, metadata);
  FileDescriptor fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (fd.get() < 0) {
    const int err = errno;
    LOCKSTEP_FAIL() << "cannot create safetensors file '" << path << "': " << std::strerror(err);
  }
  try {
    const uint64_t length = header.size();
    write_all(fd.get(), &length, 8, path);
    write_all(fd.get(), header.data(), header.size(), path);
    for (const auto& [name, tensor] : tensors) {
      const Tensor host = host_contiguous(tensor);
      write_all(fd.get(), host.nbytes() ? host.raw_data() : nullptr, host.nbytes(), path);
    }
    if (fd.release_and_close() != 0) {
      const int err = errno;
      LOCKSTEP_FAIL() << "cannot write safetensors file '" << path << "': " << std::strerror(err);
    }
  } catch (...) {
    ::unlink(path.c_str());  // a half-written file would only fail later, less clearly
    throw;
  }
}

namespace {

// A safetensors file's header, parsed: the tensors' bytes start at data_start.
struct Header {
  Json json;
  int64_t data_start = 0;
  int64_t file_bytes = 0;
};

int open_for_reading(const std::string& path) {
  // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer; such a file is
  // refused below. Regular files ignore the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    LOCKSTEP_FAIL() << "cannot open safetensors file '" << path << "': " << std::strerror(err);
  }
  return fd;
}

// The deepest nesting of objects and arrays in JSON text (strings skipped). A legitimate
// header nests three deep; a hostile one 100,000 deep would overflow the stack of the
// recursive parser and of the dumps that quote it in errors.
int nesting_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

Header read_header(const FileDescriptor& fd, const std::string& path) {
  Header file;
  struct stat info {};
  LOCKSTEP_CHECK(::fstat(fd.get(), &info) == 0 && S_ISREG(info.st_mode))
      << "safetensors file '" << path << "' is not a regular file";
  file.file_bytes = static_cast<int64_t>(info.st_size);
  LOCKSTEP_CHECK(file.file_bytes >= 8) << "safetensors file '" << path << "' holds " << file.file_bytes
                                       << " bytes, too few for the 8-byte header length";
  uint64_t header_bytes = 0;
  read_all(fd.get(), &header_bytes, 8, 0, path);
  LOCKSTEP_CHECK(header_bytes <= static_cast<uint64_t>(file.file_bytes - 8))
      << "safetensors file '" << path << "' declares a header of " << header_bytes << " bytes but the file holds only "
      << file.file_bytes << " bytes: it is truncated or not a safetensors file";
  std::string text(header_bytes, '\0');
  read_all(fd.get(), text.data(), text.size(), 8, path);
  LOCKSTEP_CHECK(!text.empty() && text[0] == '{')
      << "safetensors file '" << path << "': the header does not start with '{': not a safetensors file";
  constexpr int kMaxDepth = 16;
  const int depth = nesting_depth(text);
  LOCKSTEP_CHECK(depth <= kMaxDepth) << "safetensors file '" << path << "': the header nests " << depth
                                     << " levels deep (a safetensors header nests 3): not a safetensors file";
  try {
    file.json = Json::parse(text);
  } catch (const Json::exception& e) {
    LOCKSTEP_FAIL() << "safetensors file '" << path << "': the header is not valid JSON: " << shortened(e.what());
  }
  LOCKSTEP_CHECK(file.json.is_object()) << "safetensors file '" << path << "': the header is not a JSON object";
  file.data_start = 8 + static_cast<int64_t>(header_bytes);
  return file;
}

Metadata parse_metadata(const Json& value, const std::string& path) {
  LOCKSTEP_CHECK(value.is_object()) << "safetensors file '" << path << "': __metadata__ must be an object, got "
                                    << excerpt(value);
  Metadata metadata;
  for (const auto& [meta_key, meta_value] : value.items()) {
    LOCKSTEP_CHECK(meta_value.is_string()) << "safetensors file '" << path << "': metadata '" << meta_key
                                           << "' must be a string, got " << excerpt(meta_value);
    metadata[meta_key] = meta_value.get<std::string>();
  }
  return metadata;
}

}  // namespace

Metadata load_safetensors_metadata(const std::string& path) {
  const FileDescriptor fd(open_for_reading(path));
  const Header file = read_header(fd, path);
  const auto it = file.json.find(kMetadataKey);
  return it == file.json.end() ? Metadata{} : parse_metadata(*it, path);
}

TensorFile load_safetensors(const std::string& path) {
  const FileDescriptor fd(open_for_reading(path));
  const Header file = read_header(fd, path);
  const Json& header = file.json;
  const int64_t data_start = file.data_start;
  const int64_t buffer_bytes = file.file_bytes - data_start;
  TensorFile result;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      result.metadata = parse_metadata(value, path);
      continue;
    }
    entries.push_back(parse_entry(key, value, buffer_bytes, path));
  }
  check_layout(entries, buffer_bytes, path);

  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin)
      read_all(fd.get(), t.raw_data(), static_cast<size_t>(e.end - e.begin), data_start + e.begin, path);
    result.tensors.emplace_back(e.name, std::move(t));
  }
  return result;
}

}  // namespace lockstep
