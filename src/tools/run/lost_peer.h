// Whether a worker's error says it failed because a peer went away rather than of its own
// accord: when one rank raises, the ranks talking to it fail in their collectives a moment
// later, and one of them may exit first. The launcher names the rank that started it.
#pragma once

#include <string>

namespace lockstep::tools {

// True for the errors the communication libraries raise when the other end of a connection
// closed or died: gloo's "Connection closed by peer" / "Connection reset by peer", NCCL's
// "remote process exited", the store's broken connections.
bool reports_a_lost_peer(const std::string& error);

}  // namespace lockstep::tools
