#!/usr/bin/env bash
# The all-reduce across hosts: `lockstep bench collectives --backend mpi --compare mpi` on 2
# test hosts x 2 ranks (scripts/test-hosts), each link shaped to each rate, once by host
# (shared memory within a host, MPI across: the default) and once flat
# (LOCKSTEP_MPI_HIERARCHY=0), both beside OpenMPI's own MPI_Allreduce in the same run. Four ranks
# share this machine's cores, so MPI is told to yield while it waits (mpi_yield_when_idle).
# Needs root; the hosts are removed on exit, also on failure or Ctrl-C.
#
#   bench/collectives_across_hosts.sh [RATE...]        default: 1gbit 10gbit
#   BENCH_FLAGS="-b 1M -e 64M -f 4 -n 5 -w 2" bench/collectives_across_hosts.sh 1gbit
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
lockstep="$root/build/bin/lockstep"
export LOCKSTEP_TEST_HOSTS_PREFIX=lbc LOCKSTEP_TEST_HOSTS_NET=202
subnet="10.231.$LOCKSTEP_TEST_HOSTS_NET.0/24"
flags="${BENCH_FLAGS:--b 1M -e 64M -f 4 -n 5 -w 2}"
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(1gbit 10gbit)

[ "$(id -u)" -eq 0 ] || { echo "SKIP needs root (network namespaces)"; exit 0; }
[ -x "$lockstep" ] || { echo "build first: $lockstep is missing" >&2; exit 1; }
trap '"$root/scripts/test-hosts" down >/dev/null 2>&1 || true' EXIT INT TERM

run_bench() {  # $1: LOCKSTEP_MPI_HIERARCHY
  env CUDA_VISIBLE_DEVICES= LOCKSTEP_MPI_HIERARCHY="$1" OMPI_MCA_btl_vader_single_copy_mechanism=none \
    timeout 600 mpirun --allow-run-as-root --bind-to none \
    --host "10.231.$LOCKSTEP_TEST_HOSTS_NET.11:2,10.231.$LOCKSTEP_TEST_HOSTS_NET.12:2" -n 4 \
    --mca plm_rsh_agent "$root/scripts/test-hosts rsh" --mca oob_tcp_if_include "$subnet" \
    --mca btl_tcp_if_include "$subnet" --mca btl self,vader,tcp --mca mpi_yield_when_idle 1 \
    -x LOCKSTEP_TEST_HOSTS_PREFIX -x LOCKSTEP_TEST_HOSTS_NET -x LOCKSTEP_MPI_HIERARCHY \
    "$lockstep" bench collectives --backend mpi --compare mpi --collective all_reduce $flags
}

echo "# $(date -u +%Y-%m-%d) $(uname -n): 2 test hosts x 2 ranks, links shaped by tc (tbf)"
for rate in "${rates[@]}"; do
  "$root/scripts/test-hosts" down >/dev/null 2>&1 || true
  "$root/scripts/test-hosts" up 2 --rate "$rate" >/dev/null
  echo "## $rate, all-reduce by host"
  run_bench 1
  echo "## $rate, flat"
  run_bench 0
done
