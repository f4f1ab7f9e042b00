#!/usr/bin/env python3
"""`lockstep plan`'s predictions beside measured `lockstep train` runs on this host's CPU devices.

For each layout the two cores allow, the plan's predicted peak memory of every device (each
pipeline stage's) and its step time are set beside what `lockstep train` measures with the
flags the plan prints: the peak allocated bytes of each device (metrics.jsonl) and the
median time of the steps after the first two. Each layout is planned and run --repeats
times in turn and the medians of its predictions and of its measured times compared: this
host's speed moves by tens of percent from one second to the next, and the plan times the
host when it is asked, so one pair alone compares two moments more than two figures. The
text is a small generated corpus, so the dataset (8 bytes per byte of text, on cpu:0 of
each process) is a few hundred KiB of each device's peak; a mesh's cpu:0 also holds the
full model it is built from, so only the other devices of a mesh are compared.

  bench/plan_validation.py [--lockstep build/bin/lockstep] [--preset small] [--batch-size 16]
                           [--micro-batch 4] [--steps 8] [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

LAYOUTS = [
    # (name as the plan gives it, extra train flags)
    "dp 2", "dp 2 zero1", "dp 2 zero2", "dp 2 zero3", "tp 2", "pp 2 1f1b", "pp 2 gpipe",
]


def write_text(path):
    words = ["lock", "step", "tree", "sum", "bits", "device", "batch", "the", "same", "on", "every", "host"]
    with open(path, "w") as out:
        for record in range(400):
            out.write(" ".join(words[(record * 7 + w * 3) % len(words)] for w in range(14)) + ".\n%\n")


def plan(args, shape, checkpointed):
    command = [args.lockstep, "plan", "--machine", "this-host", "--devices", "2", "--batch-size", str(args.batch_size),
               "--micro-batch", str(args.micro_batch), "--json"] + shape
    rows = [json.loads(line) for line in subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()]
    return [r for r in rows if r["checkpoint_activations"] == checkpointed]


def train(args, row, shape, data, out):
    flags = row["train_flags"].split()
    command = [args.lockstep, "train", "--model", "gpt", "--quiet", "--sample", "0", "--data", data,
               "--batch-size", str(args.batch_size), "--steps", str(args.steps), "--log-every", "1",
               "--checkpoint-every", "0", "--out", out] + shape + flags
    if row["dp"] > 1 and row["tp"] == 1 and row["pp"] == 1:
        command = [args.lockstep, "run", "-n", str(row["dp"]), "--log-dir", out + "-logs", "--"] + command
    else:
        command += ["--devices", "2"]
    subprocess.run(command, check=True, capture_output=True, text=True)
    steps = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    peaks = {}
    for step in steps:
        for device, memory in step["memory"].items():
            peaks[device] = max(peaks.get(device, 0), memory["peak_allocated_bytes"])
    # samples_per_second is the run's so far: the steps' own times are its differences.
    elapsed = [s["step"] * args.batch_size / s["samples_per_second"] for s in steps]
    times = [b - a for a, b in zip(elapsed, elapsed[1:])][2:]
    return peaks, statistics.median(times) if times else float("nan")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lockstep", default="build/bin/lockstep")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shape = ["--preset", args.preset]
    mib = 1024.0 * 1024.0
    print(f"lockstep plan against lockstep train, GPT preset {args.preset}, batch {args.batch_size}, "
          f"micro-batch {args.micro_batch}, 2 CPU devices, step times the medians of {args.repeats} plans and runs\n")
    print(f"{'layout':34} {'device':7} {'predicted MiB':>13} {'measured MiB':>12} {'ratio':>6} "
          f"{'predicted s':>11} {'measured s':>10} {'ratio':>6}")
    worst_memory = worst_time = 1.0
    with tempfile.TemporaryDirectory() as root:
        data = os.path.join(root, "text.txt")
        write_text(data)
        for checkpointed in (False, True):
            for name in LAYOUTS:
                predictions, measured = [], []
                for repeat in range(args.repeats):
                    rows = plan(args, shape, checkpointed)
                    row = next((r for r in rows if r["layout"].split(",")[0] == name), None)
                    if row is None:
                        break
                    out = os.path.join(root, f"{name.replace(' ', '-')}-{int(checkpointed)}-{repeat}")
                    peaks, seconds = train(args, row, shape, data, out)
                    predictions.append(row["step_seconds"])
                    measured.append(seconds)
                if not predictions:
                    continue
                predicted_seconds, seconds = statistics.median(predictions), statistics.median(measured)
                mesh = row["tp"] > 1 or row["pp"] > 1 or False
                for index, device in enumerate(sorted(peaks)):
                    if mesh and device == "cpu:0" and len(peaks) > 1:
                        continue  # holds the full model the mesh is built from
                    stage = index * row["pp"] // len(peaks) if mesh else 0
                    predicted = row["stage_memory_bytes"][stage]
                    ratio = predicted / peaks[device]
                    time_ratio = predicted_seconds / seconds
                    worst_memory = max(worst_memory, ratio, 1 / ratio)
                    worst_time = max(worst_time, time_ratio, 1 / time_ratio)
                    print(f"{row['layout']:34} {device:7} {predicted / mib:13.2f} {peaks[device] / mib:12.2f} "
                          f"{ratio:6.3f} {predicted_seconds:11.3f} {seconds:10.3f} {time_ratio:6.3f}")
    print(f"\nworst memory ratio {worst_memory:.3f}, worst step-time ratio {worst_time:.3f} (either way)")


if __name__ == "__main__":
    sys.exit(main())
