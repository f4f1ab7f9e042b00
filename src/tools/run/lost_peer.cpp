#include "tools/run/lost_peer.h"

#include <algorithm>
#include <cctype>

namespace lockstep::tools {

bool reports_a_lost_peer(const std::string& error) {
  std::string text = error;
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  // gloo's tcp pair, NCCL's ncclRemoteError, and sockets of a TCPStore or gloo alike.
  for (const char* phrase : {"closed by peer", "reset by peer", "remote process exited", "broken pipe",
                             "connection refused", "ncclremoteerror"}) {
    if (text.find(phrase) != std::string::npos) return true;
  }
  return false;
}

}  // namespace lockstep::tools
