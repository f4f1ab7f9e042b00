#include "tools/bench/collective_timing.h"

#include <chrono>
#include <cstring>

#include "lockstep/core/error.h"
#if LOCKSTEP_HAVE_MPI
#include <mpi.h>

#include "lockstep/comm/mpi/mpi_process.h"
#endif

namespace lockstep::tools {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// rank r's element i for the check: small integers, exact in every dtype and op.
double check_value(int rank, int64_t i) { return static_cast<double>((rank + 1) * (i % 7 + 1)); }

// The checks write and read through the host, wherever the buffers live.
void fill_check(const Tensor& t, int rank, int64_t first_index) {
  std::vector<double> values(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = check_value(rank, first_index + static_cast<int64_t>(i));
  const Tensor host = t.device().is_cpu() ? t : Tensor::empty(t.shape(), t.dtype());
  convert_elements(values.data(), DType::f64, host.raw_data(), host.dtype(), host.numel());
  if (!t.device().is_cpu()) t.copy_from(host);
}

int64_t count_wrong(const Tensor& t, const std::function<double(int64_t)>& expected) {
  const Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::vector<double> got(static_cast<size_t>(t.numel()));
  convert_elements(host.raw_data(), host.dtype(), got.data(), DType::f64, host.numel());
  int64_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != expected(static_cast<int64_t>(i));
  return wrong;
}

double reduced(comm::ReduceOp op, int n, int64_t i) {
  const double unit = static_cast<double>(i % 7 + 1);
  switch (op) {
    case comm::ReduceOp::sum:
    case comm::ReduceOp::rounded_sum:  // its partial sums are integers below the total: exact where it is
      return unit * n * (n + 1) / 2;
    case comm::ReduceOp::avg:
      return unit * (n + 1) / 2;
    case comm::ReduceOp::max:
      return unit * n;
    case comm::ReduceOp::min:
      return unit;
  }
  return 0;
}

}  // namespace

const char* collective_label(Collective c) {
  switch (c) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::all_gather:
      return "all_gather";
    case Collective::broadcast:
      return "broadcast";
  }
  return "?";
}

Collective parse_collective(const std::string& name) {
  for (Collective c :
       {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather, Collective::broadcast}) {
    if (name == collective_label(c)) return c;
  }
  throw UsageError("unknown collective '" + name + "': use all_reduce, reduce_scatter, all_gather, broadcast or all");
}

double bus_factor(Collective what, int ranks) {
  const double n = ranks;
  switch (what) {
    case Collective::all_reduce:
      return 2 * (n - 1) / n;
    case Collective::reduce_scatter:
    case Collective::all_gather:
      return (n - 1) / n;
    case Collective::broadcast:
      return 1;
  }
  return 1;
}

Timing time_collective(comm::Communicator& comm, Collective what, int64_t bytes, const TimingSettings& settings,
                       Device device) {
  const int n = comm.size();
  const int64_t element = static_cast<int64_t>(dtype_size(settings.dtype));
  const int64_t count = bytes / element;  // nccl-tests' count: elements of the "size" buffer
  const bool split = what == Collective::reduce_scatter || what == Collective::all_gather;
  const int64_t per_rank = split ? count / n : count;
  // Buffers peers can reach directly (shared memory on shm): the in-place algorithm with
  // no staging copy, as NCCL's registered user buffers.
  Tensor a = comm.empty_shared({split ? per_rank * n : count}, settings.dtype, device);
  Tensor b = comm.empty_shared({per_rank}, settings.dtype, device);
  a.zero();
  b.zero();
  auto run = [&] {
    switch (what) {
      case Collective::all_reduce:
        return comm.all_reduce(a, settings.op);
      case Collective::reduce_scatter:
        return comm.reduce_scatter(a, b, settings.op);
      case Collective::all_gather:
        return comm.all_gather(b, a);
      case Collective::broadcast:
        return comm.broadcast(a, 0);
    }
  };
  for (int64_t i = 0; i < settings.warmup; ++i) run();
  comm.barrier();
  const auto start = Clock::now();
  for (int64_t i = 0; i < settings.iters; ++i) run();
  comm.barrier();
  Timing timing;
  timing.seconds = since(start) / static_cast<double>(std::max<int64_t>(1, settings.iters));

  if (!settings.check) {
    timing.wrong = -1;
    return timing;
  }
  const int r = comm.rank();
  int64_t wrong = 0;
  switch (what) {
    case Collective::all_reduce:
      fill_check(a, r, 0);
      comm.all_reduce(a, settings.op);
      wrong = count_wrong(a, [&](int64_t i) { return reduced(settings.op, n, i); });
      break;
    case Collective::reduce_scatter:
      fill_check(a, r, 0);
      comm.reduce_scatter(a, b, settings.op);
      wrong = count_wrong(b, [&](int64_t i) { return reduced(settings.op, n, r * per_rank + i); });
      break;
    case Collective::all_gather:
      fill_check(b, r, r * per_rank);
      comm.all_gather(b, a);
      wrong = count_wrong(
          a, [&](int64_t k) { return check_value(static_cast<int>(k / std::max<int64_t>(per_rank, 1)), k); });
      break;
    case Collective::broadcast:
      fill_check(a, r, 0);
      comm.broadcast(a, 0);
      wrong = count_wrong(a, [&](int64_t i) { return check_value(0, i); });
      break;
  }
  Tensor total = Tensor::scalar(static_cast<double>(wrong), DType::i64).reshape({1}).to(device);
  comm.all_reduce(total);
  timing.wrong = total.to(Device::cpu()).data<int64_t>()[0];
  return timing;
}

double update_bandwidth(comm::Communicator& comm, int64_t bytes, const TimingSettings& settings) {
  const int64_t count = bytes / 4;
  std::vector<float> buffer(static_cast<size_t>(count), 1.0f);
  float* x = buffer.data();
  auto update = [&] {
    for (int64_t i = 0; i < count; ++i) x[i] += 1.0f;
  };
  // The same statistic as the collectives: the mean over the timed passes, after warm-up.
  for (int64_t i = 0; i < settings.warmup; ++i) update();
  comm.barrier();
  const auto start = Clock::now();
  for (int64_t i = 0; i < settings.iters; ++i) update();
  comm.barrier();
  const double seconds = since(start) / static_cast<double>(std::max<int64_t>(1, settings.iters));
  // Keep the updates from being optimized away.
  if (buffer[static_cast<size_t>(count / 2)] < 0) std::printf("%f\n", buffer[0]);
  return static_cast<double>(bytes) * comm.size() / seconds;
}

#if LOCKSTEP_HAVE_MPI

bool mpi_compiled_in() { return true; }

double time_mpi_collective(Collective what, int64_t bytes, const TimingSettings& settings) {
  comm::MpiProcess::get();
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  LOCKSTEP_CHECK(settings.dtype == DType::f32 && settings.op == comm::ReduceOp::sum)
      << "the MPI comparison runs f32 sums only";
  const int count = static_cast<int>(bytes / 4);
  const bool split = what == Collective::reduce_scatter || what == Collective::all_gather;
  const int per_rank = split ? count / n : count;
  std::vector<float> a(static_cast<size_t>(split ? per_rank * n : count), 0.0f);
  std::vector<float> b(static_cast<size_t>(per_rank), 0.0f);
  auto run = [&] {
    switch (what) {
      case Collective::all_reduce:
        MPI_Allreduce(MPI_IN_PLACE, a.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case Collective::reduce_scatter:
        MPI_Reduce_scatter_block(a.data(), b.data(), per_rank, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
      case Collective::all_gather:
        MPI_Allgather(b.data(), per_rank, MPI_FLOAT, a.data(), per_rank, MPI_FLOAT, MPI_COMM_WORLD);
        break;
      case Collective::broadcast:
        MPI_Bcast(a.data(), count, MPI_FLOAT, 0, MPI_COMM_WORLD);
        break;
    }
  };
  for (int64_t i = 0; i < settings.warmup; ++i) run();
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = Clock::now();
  for (int64_t i = 0; i < settings.iters; ++i) run();
  MPI_Barrier(MPI_COMM_WORLD);
  return since(start) / static_cast<double>(std::max<int64_t>(1, settings.iters));
}

#else

bool mpi_compiled_in() { return false; }

double time_mpi_collective(Collective, int64_t, const TimingSettings&) {
  LOCKSTEP_FAIL() << "this build has no MPI (libopenmpi-dev was missing when it was configured)";
  return 0;
}

#endif

}  // namespace lockstep::tools
