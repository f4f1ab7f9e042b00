#!/usr/bin/python3
"""Data-parallel training throughput on this host's cores, Lockstep beside PyTorch DDP (gloo)
in the same run. One global batch B for every row; each figure is the median over --reps
interleaved repetitions of samples/s over the training loop (`lockstep train`'s
summary.json samples_per_second; bench/torch_ddp.py's timer, same loop).

  1 device, micro-batch B          the best single-device step (no accumulation), every thread
  1 device, micro-batch B/2        the tree the 2-device rows compute, on one device
  dp, 2 devices                    one process, a worker per device, a thread each
  ddp, 2 processes                 torchrun's variables, shm collectives, a thread each
  zero1, 2 processes               ddp with the optimizer state sharded
  zero2, 2 processes               ... and the gradients, reduce-scattered bucket by bucket
  PyTorch DDP + ZeRO, 2 processes  the same with ZeroRedundancyOptimizer (PyTorch's ZeRO-1)
  PyTorch DDP, 2 processes         gloo, a thread each

It also prints each Lockstep row's communication share (all-reduce time / device time) and,
for the deterministic tree order's cost, `lockstep bench collectives` at the model's gradient
size: Lockstep's tree-ordered all-reduce (shm, and over MPI) beside MPI_Allreduce.

    /usr/bin/python3 bench/data_parallel.py [--models cnn,mlp] [--batch 256] [--steps 150] [--reps 3]
"""

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LOCKSTEP = os.path.join(ROOT, "build", "bin", "lockstep")
GRADIENT_BYTES = {"cnn": 4 * 225034, "mlp": 4 * 669706}  # parameters x 4 bytes


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lockstep_rate(model, args, out, devices, micro, threads, strategy="dp"):
    """samples/s and the communication share of one `lockstep train` run."""
    flags = [LOCKSTEP, "train", "--quiet", "--model", model, "--batch-size", str(args.batch),
             "--micro-batch", str(micro), "--steps", str(args.steps), "--data", args.data, "--out", out,
             "--strategy", strategy, "--threads", str(threads), "--optimizer", "sgd", "--lr", "0.05"]
    if strategy == "dp":
        subprocess.run(flags + ["--devices", str(devices)], check=True, stdout=subprocess.DEVNULL)
    else:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(devices),
                   LOCAL_WORLD_SIZE=str(devices), OMP_NUM_THREADS=str(threads))
        ranks = [subprocess.Popen(flags, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)), stdout=subprocess.DEVNULL)
                 for r in range(devices)]
        if any(p.wait() != 0 for p in ranks):
            raise RuntimeError(f"lockstep {strategy} failed")
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    shares = [d["communicate_share"] for d in summary["devices"]]
    return summary["samples_per_second"], max(shares)


def torch_rate(model, args, world, threads, zero=False):
    run = subprocess.run([args.python, os.path.join(ROOT, "bench", "torch_ddp.py"), "--model", model, "--world",
                          str(world), "--threads", str(threads), "--batch", str(args.batch), "--steps",
                          str(args.steps), "--data", args.data] + (["--zero"] if zero else []),
                         capture_output=True, text=True)
    for line in run.stdout.splitlines():
        if line.startswith("RESULT"):
            return float(line.split("=")[1]), None
        if line.startswith("SKIP"):
            return None, line
    return None, run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "no output"


def collective_row(model, backend):
    """Our tree-ordered all-reduce of the model's gradients on 2 ranks beside MPI_Allreduce."""
    size = str(GRADIENT_BYTES[model])
    run = subprocess.run([LOCKSTEP, "bench", "collectives", "-b", size, "-e", size, "-g", "2", "--backend", backend,
                          "--compare", "mpi", "--collective", "all_reduce", "--json"],
                         capture_output=True, text=True)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    if run.returncode != 0 or not rows:
        return f"not measured ({run.stderr.strip().splitlines()[-1] if run.stderr.strip() else 'no output'})"
    row = rows[-1]
    return (f"tree order {row['time_us']:.0f} us, MPI_Allreduce {row['mpi_time_us']:.0f} us: "
            f"the tree takes {row['time_us'] / row['mpi_time_us']:.2f}x MPI's time")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="cnn,mlp")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--python", default="/usr/bin/python3")
    args = parser.parse_args()
    if not os.access(LOCKSTEP, os.X_OK):
        sys.exit(f"{LOCKSTEP} is not built: run `make` first")
    cores = os.cpu_count() or 1
    half = args.batch // 2
    scratch = tempfile.mkdtemp(prefix="lockstep-dp-bench-")
    try:
        for model in args.models.split(","):
            rows = [
                ("1 device, micro-batch %d" % args.batch, lambda o: lockstep_rate(model, args, o, 1, args.batch, cores)),
                ("1 device, micro-batch %d" % half, lambda o: lockstep_rate(model, args, o, 1, half, cores)),
                ("dp, 2 devices", lambda o: lockstep_rate(model, args, o, 2, half, cores)),
                ("ddp, 2 processes", lambda o: lockstep_rate(model, args, o, 2, half, max(1, cores // 2), "ddp")),
                ("zero1, 2 processes", lambda o: lockstep_rate(model, args, o, 2, half, max(1, cores // 2), "zero1")),
                ("zero2, 2 processes", lambda o: lockstep_rate(model, args, o, 2, half, max(1, cores // 2), "zero2")),
                ("PyTorch DDP + ZeroRedundancyOptimizer", lambda o: torch_rate(model, args, 2, max(1, cores // 2), True)),
                ("PyTorch DDP (gloo), 2 processes", lambda o: torch_rate(model, args, 2, max(1, cores // 2))),
            ]
            samples = {name: [] for name, _ in rows}
            shares = {name: [] for name, _ in rows}
            notes = {}
            for rep in range(args.reps):  # interleaved, so drift hits every row alike
                for i, (name, measure) in enumerate(rows):
                    rate, extra = measure(os.path.join(scratch, f"{model}-{i}-{rep}"))
                    if rate is None:
                        notes[name] = extra
                        continue
                    samples[name].append(rate)
                    if extra is not None:
                        shares[name].append(extra)
            print(f"\n{model}: global batch {args.batch}, {args.steps} steps, {cores} cores, median of {args.reps}")
            print(f"{'layout':36} {'samples/s':>10} {'vs best 1-device':>17} {'comm share':>11}")
            best = statistics.median(samples[rows[0][0]])
            medians = {}
            for name, _ in rows:
                if not samples[name]:
                    print(f"{name:36} {'-':>10}   {notes.get(name, '')}")
                    continue
                medians[name] = statistics.median(samples[name])
                share = f"{100 * statistics.median(shares[name]):.1f}%" if shares[name] else "-"
                print(f"{name:36} {medians[name]:10.0f} {medians[name] / best:16.2f}x {share:>11}")
            torch_name, torch_zero = rows[-1][0], rows[-2][0]
            if torch_name in medians:
                for name in ("dp, 2 devices", "ddp, 2 processes"):
                    print(f"{name} / PyTorch DDP: {medians[name] / medians[torch_name]:.2f}x")
            if torch_zero in medians:
                for name in ("zero1, 2 processes", "zero2, 2 processes"):
                    print(f"{name} / PyTorch DDP + ZeroRedundancyOptimizer: {medians[name] / medians[torch_zero]:.2f}x")
            print(f"the tree order's cost, all-reduce of {GRADIENT_BYTES[model]} bytes on 2 ranks "
                  "(Lockstep's deterministic tree beside MPI_Allreduce):")
            for backend in ("shm", "mpi"):
                print(f"  {backend}: {collective_row(model, backend)}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
