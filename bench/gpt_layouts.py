#!/usr/bin/python3
"""A GPT (--preset tiny) trained on this host's cores in each layout, beside one device in
the same run: samples/s, the ratio to one device, peak memory per device, the communication
and pipeline-bubble shares of device time (measured, and the bubble's theory
(P-1)/(M+P-1)), and the most micro-batches of activations a device held. Each figure is the
median over --reps interleaved repetitions of `lockstep train`'s summary.json.

  one device            every thread on one device (the reference)
  --dp 2                two replicas, a thread each
  --tp 2                every block and the vocabulary cut in two
  --pp 2 (1f1b, gpipe)  two stages of consecutive blocks

    /usr/bin/python3 bench/gpt_layouts.py [--steps 60] [--reps 3] [--batch 32] [--micro-batch 4]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LOCKSTEP = os.path.join(ROOT, "build", "bin", "lockstep")

LAYOUTS = [
    ("one device", ["--devices", "1"]),
    ("--dp 2", ["--dp", "2"]),
    ("--tp 2", ["--tp", "2"]),
    ("--pp 2, 1f1b", ["--pp", "2", "--schedule", "1f1b"]),
    ("--pp 2, gpipe", ["--pp", "2", "--schedule", "gpipe"]),
]


def run(layout, args, out):
    subprocess.run([LOCKSTEP, "train", "--quiet", "--model", "gpt", "--preset", "tiny", "--sample", "0",
                    "--batch-size", str(args.batch), "--micro-batch", str(args.micro_batch), "--steps",
                    str(args.steps), "--out", out] + layout, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=4)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="lockstep-gpt-layouts-")
    results = {name: [] for name, _ in LAYOUTS}
    try:
        for rep in range(args.reps):
            for name, layout in LAYOUTS:
                results[name].append(run(layout, args, os.path.join(work, f"{rep}-{len(results[name])}-{name[:4]}")))
    finally:
        shutil.rmtree(work)

    def median(name, get):
        return statistics.median(get(s) for s in results[name])

    reference = median("one device", lambda s: s["samples_per_second"])
    print(f"GPT tiny, batch {args.batch}, micro-batch {args.micro_batch}, {args.steps} steps, median of {args.reps}")
    print(f"{'layout':<16}{'samples/s':>10}{'vs one':>8}{'peak MiB per device':>22}{'comm':>7}"
          f"{'bubble':>8}{'theory':>8}{'held':>6}")
    for name, _ in LAYOUTS:
        rate = median(name, lambda s: s["samples_per_second"])
        last = results[name][-1]
        peaks = "/".join(f"{d['peak_memory_bytes'] / 2**20:.1f}" for d in last["devices"])
        comm = median(name, lambda s: max(d["communicate_share"] for d in s["devices"]))
        mesh = last.get("mesh")
        bubble = f"{100 * median(name, lambda s: s['mesh']['bubble_measured']):.1f}%" if mesh and mesh["pp"] > 1 else "-"
        theory = f"{100 * mesh['bubble_theory']:.1f}%" if mesh and mesh["pp"] > 1 else "-"
        held = str(mesh["most_in_flight"]) if mesh and mesh["pp"] > 1 else "-"
        print(f"{name:<16}{rate:>10.0f}{rate / reference:>7.2f}x{peaks:>22}{100 * comm:>6.1f}%{bubble:>8}{theory:>8}"
              f"{held:>6}")
    print("peak MiB: the allocator's peak on each device over training (device 0's includes the loaded text);"
          " comm: the largest device's share of its time communicating (tensor parallelism's all-reduces"
          " inside the blocks included; a pipeline's: the tied weight and the loss)")


if __name__ == "__main__":
    main()
