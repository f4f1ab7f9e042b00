#include "lockstep/comm/collective.h"

#include <sstream>

#include "lockstep/core/error.h"

namespace lockstep::comm {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::broadcast:
      return "broadcast";
    case CollectiveKind::barrier:
      return "barrier";
    case CollectiveKind::split:
      return "split";
  }
  return "?";
}

namespace {

std::string arguments(const CollectiveDesc& d) {
  std::ostringstream out;
  switch (d.kind) {
    case CollectiveKind::all_reduce:
    case CollectiveKind::reduce_scatter:
      out << d.count << " " << dtype_name(d.dtype) << ", " << reduce_op_name(d.op);
      break;
    case CollectiveKind::all_gather:
      out << d.count << " " << dtype_name(d.dtype);
      break;
    case CollectiveKind::broadcast:
      out << d.count << " " << dtype_name(d.dtype) << ", root " << d.root;
      break;
    case CollectiveKind::barrier:
    case CollectiveKind::split:
      break;
  }
  return out.str();
}

}  // namespace

std::string describe(const CollectiveDesc& d) {
  std::ostringstream out;
  out << collective_name(d.kind) << " #" << d.sequence;
  const std::string args = arguments(d);
  if (!args.empty()) out << " (" << args << ")";
  return out.str();
}

void check_same_on_all_ranks(const CollectiveDesc* descs, int n) {
  const CollectiveDesc& first = descs[0];
  for (int r = 1; r < n; ++r) {
    const CollectiveDesc& d = descs[r];
    const bool same = d.sequence == first.sequence && d.kind == first.kind && d.count == first.count &&
                      d.dtype == first.dtype && d.op == first.op && d.root == first.root;
    LOCKSTEP_CHECK(same) << "ranks disagree on the collective: rank 0 called " << describe(first) << ", rank " << r
                         << " called " << describe(d)
                         << "; every rank must make the same collective calls in the same order with the same "
                            "sizes, dtypes and ops";
  }
}

}  // namespace lockstep::comm
