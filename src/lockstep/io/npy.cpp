#include "lockstep/io/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

namespace lockstep {
namespace {

// The header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// The value of `key`: a quoted string (quotes kept), a parenthesized tuple, or a bare word.
std::string header_value(const std::string& header, const std::string& key, const std::string& path) {
  size_t at = std::string::npos;
  for (const char quote : {'\'', '"'}) {
    const size_t found = header.find(quote + key + quote);
    if (found != std::string::npos) at = found + key.size() + 2;
  }
  if (at != std::string::npos) at = header.find(':', at);
  LOCKSTEP_CHECK(at != std::string::npos)
      << path << ": the .npy header has no '" << key << "' (header: " << header << ")";
  at = header.find_first_not_of(" ", at + 1);
  LOCKSTEP_CHECK(at != std::string::npos) << path << ": the .npy header's '" << key << "' has no value";
  const char open = header[at];
  size_t end = std::string::npos;
  if (open == '\'' || open == '"') {
    end = header.find(open, at + 1);
  } else if (open == '(') {
    end = header.find(')', at);
  } else {
    end = header.find_first_of(",}", at);
    if (end != std::string::npos) --end;
  }
  LOCKSTEP_CHECK(end != std::string::npos) << path << ": the .npy header's '" << key << "' does not end";
  return header.substr(at, end - at + 1);
}

DType dtype_of(const std::string& descr, const std::string& path) {
  const std::string code = descr.substr(1, descr.size() - 2);  // without the quotes
  if (code == "<f4") return DType::f32;
  if (code == "<f8") return DType::f64;
  if (code == "<f2") return DType::f16;
  if (code == "<i4") return DType::i32;
  if (code == "<i8") return DType::i64;
  if (code == "|u1" || code == "<u1") return DType::u8;
  throw Error(path + " holds " + code +
              " elements; load_npy reads little-endian float32, float64, float16, int32, int64 and uint8: "
              "save it as one of those (e.g. np.save(path, array.astype(np.float32)))");
}

}  // namespace

Tensor load_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  LOCKSTEP_CHECK(in) << "cannot open " << path << ": " << std::strerror(errno);
  char magic[8] = {};
  in.read(magic, sizeof(magic));
  LOCKSTEP_CHECK(in && std::memcmp(magic, "\x93NUMPY", 6) == 0)
      << path << " is not a .npy file (it does not start with \\x93NUMPY)";
  const int major = static_cast<unsigned char>(magic[6]);
  LOCKSTEP_CHECK(major >= 1 && major <= 3) << path << ": .npy format version " << major << " is not 1, 2 or 3";
  uint32_t header_length = 0;
  if (major == 1) {
    unsigned char length[2] = {};
    in.read(reinterpret_cast<char*>(length), 2);
    header_length = length[0] | (static_cast<uint32_t>(length[1]) << 8);
  } else {
    unsigned char length[4] = {};
    in.read(reinterpret_cast<char*>(length), 4);
    for (int i = 3; i >= 0; --i) header_length = (header_length << 8) | length[i];
  }
  std::string header(header_length, '\0');
  in.read(header.data(), header_length);
  LOCKSTEP_CHECK(in) << path << ": the .npy header is cut short";

  const DType dtype = dtype_of(header_value(header, "descr", path), path);
  LOCKSTEP_CHECK(header_value(header, "fortran_order", path) == "False")
      << path << " holds a Fortran-order array: save np.ascontiguousarray(array) instead";
  Shape shape;
  const std::string dims = header_value(header, "shape", path);
  std::stringstream numbers(dims.substr(1, dims.size() - 2));
  for (std::string item; std::getline(numbers, item, ',');) {
    if (item.find_first_not_of(" ") == std::string::npos) continue;
    shape.push_back(std::stoll(item));
  }
  Tensor tensor = Tensor::empty(shape, dtype);
  in.read(static_cast<char*>(tensor.raw_data()), static_cast<std::streamsize>(tensor.nbytes()));
  LOCKSTEP_CHECK(in) << path << ": the data is cut short (" << shape_str(shape) << " " << dtype_name(dtype) << " needs "
                     << tensor.nbytes() << " bytes after the header)";
  return tensor;
}

}  // namespace lockstep
