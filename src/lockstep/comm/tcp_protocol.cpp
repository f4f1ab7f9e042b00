#include "lockstep/comm/tcp_protocol.h"

namespace lockstep::comm::tcp {

uint32_t decode_u32(const char* bytes) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = (value << 8) | static_cast<uint8_t>(bytes[i]);
  return value;
}

FrameWriter& FrameWriter::u8(uint8_t value) {
  bytes_.push_back(static_cast<char>(value));
  return *this;
}

FrameWriter& FrameWriter::u32(uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
  return *this;
}

FrameWriter& FrameWriter::i64(int64_t value) {
  const auto bits = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) bytes_.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
  return *this;
}

FrameWriter& FrameWriter::str(std::string_view value) {
  u32(static_cast<uint32_t>(value.size()));
  bytes_.append(value);
  return *this;
}

std::string FrameWriter::finish() {
  const auto length = static_cast<uint32_t>(bytes_.size() - kLengthBytes);
  for (size_t i = 0; i < kLengthBytes; ++i) bytes_[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  return std::move(bytes_);
}

bool FrameReader::take(size_t n, std::string_view& out) {
  if (!ok_ || body_.size() < n) {
    ok_ = false;
    return false;
  }
  out = body_.substr(0, n);
  body_.remove_prefix(n);
  return true;
}

uint8_t FrameReader::u8() {
  std::string_view bytes;
  return take(1, bytes) ? static_cast<uint8_t>(bytes[0]) : 0;
}

uint32_t FrameReader::u32() {
  std::string_view bytes;
  return take(4, bytes) ? decode_u32(bytes.data()) : 0;
}

int64_t FrameReader::i64() {
  std::string_view bytes;
  if (!take(8, bytes)) return 0;
  uint64_t bits = 0;
  for (int i = 7; i >= 0; --i) bits = (bits << 8) | static_cast<uint8_t>(bytes[i]);
  return static_cast<int64_t>(bits);
}

std::string FrameReader::str() {
  const uint32_t length = u32();
  std::string_view bytes;
  return take(length, bytes) ? std::string(bytes) : std::string();
}

}  // namespace lockstep::comm::tcp
