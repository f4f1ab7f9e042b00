// The TcpStore's wire format, shared by its client (tcp_store.cpp) and server
// (tcp_store_server.cpp). Every message is a frame: a 4-byte little-endian body length, then
// the body. A request body is an Op byte and its fields; a reply body is a Status byte and
// its payload. Strings are a 4-byte length and the bytes; integers are 8 bytes,
// little-endian, so hosts of any byte order agree.
//
//   request                          reply (Status::ok)
//   set   key value                  -
//   get   key timeout_ms             value          (Status::timeout when the key never came)
//   add   key delta                  new value
//   check key                        1 byte: 0 or 1
//
// Any request may be answered Status::error with a message (e.g. add on a non-integer).
//
// Before any request, both sides prove they hold the job's secret (job_secret.h), so no
// other process can read, write or wait on the job's keys, and no other server can pose as
// rank 0's:
//
//   server -> client   version (1 byte), server nonce (32 random bytes)
//   client -> server   client nonce, HMAC-SHA256(secret, "client" + server nonce)
//   server -> client   HMAC-SHA256(secret, "server" + client nonce)
//
// A wrong proof, or none within kHandshakeSeconds, and the server closes the connection.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace lockstep::comm::tcp {

enum class Op : uint8_t { set = 1, get = 2, add = 3, check = 4 };
enum class Status : uint8_t { ok = 0, timeout = 1, error = 2 };

// Larger frames are refused: nothing the ranks exchange at rendezvous comes close, and a
// stray client (a port scanner, an HTTP probe) must not make the server allocate gigabytes.
constexpr uint32_t kMaxFrame = 64u << 20;
constexpr size_t kLengthBytes = 4;

constexpr uint8_t kHandshakeVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr int kHandshakeSeconds = 10;
// The most a client that has not proved itself may send: one handshake frame.
constexpr size_t kMaxHandshakeBytes = 256;
inline constexpr const char* kClientProof = "client";
inline constexpr const char* kServerProof = "server";

uint32_t decode_u32(const char* bytes);

// Builds one frame.
class FrameWriter {
 public:
  FrameWriter() : bytes_(kLengthBytes, '\0') {}
  FrameWriter& u8(uint8_t value);
  FrameWriter& u32(uint32_t value);
  FrameWriter& i64(int64_t value);
  FrameWriter& str(std::string_view value);
  // The frame, length included; the writer is spent afterwards.
  std::string finish();

 private:
  std::string bytes_;
};

// Reads the fields of one frame's body. Reading past the end yields zeros and clears ok(),
// so a caller reads every field and then checks once.
class FrameReader {
 public:
  explicit FrameReader(std::string_view body) : body_(body) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  std::string str();
  // Every read was in bounds and the whole body was consumed.
  bool ok() const { return ok_ && body_.empty(); }

 private:
  bool take(size_t n, std::string_view& out);
  std::string_view body_;
  bool ok_ = true;
};

}  // namespace lockstep::comm::tcp
