#!/usr/bin/python3
"""What a checkpoint costs a training run: `lockstep train` saves in the background, so a
step is held only while the state is copied to host memory at the step boundary; a
synchronous save (PyTorch's torch.save in the loop, Lockstep before background saving) holds
it for the whole write. Trains a GPT with a checkpoint every few steps and prints, per
checkpoint, the time training was held beside the time the write took — the synchronous
save's hold — and their ratio; then the whole run's training time beside the same run without
checkpoints while training (the writer's thread shares the cores with the steps).

    /usr/bin/python3 bench/checkpoint_cost.py                     # ~25M parameters, ~300 MB checkpoints
    /usr/bin/python3 bench/checkpoint_cost.py --width 256 --layers 4

The checkpoints are spaced so that a write ends before the next one starts (--every); a
write still in flight at the next checkpoint is waited for, and counts as held.
"""
import argparse
import json
import os
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lockstep", default=os.path.join(ROOT, "build", "bin", "lockstep"))
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--every", type=int, default=4)
    args = parser.parse_args()
    def train(every):
        with tempfile.TemporaryDirectory(prefix="lockstep-checkpoint-cost-") as out:
            subprocess.run([args.lockstep, "train", "--quiet", "--model", "gpt", "--preset", "small", "--width",
                            str(args.width), "--layers", str(args.layers), "--heads", "8", "--context", "32",
                            "--batch-size", "8", "--steps", str(args.steps), "--checkpoint-every", str(every),
                            "--sample", "0", "--out", out], check=True, stdout=subprocess.DEVNULL)
            with open(os.path.join(out, "summary.json")) as f:
                return json.load(f), os.path.getsize(os.path.join(out, "checkpoint.safetensors"))

    summary, size = train(args.every)
    plain, _ = train(0)
    count = summary["checkpoints"]
    # The last checkpoint's write is waited for after the last step and holds no step.
    held = summary["checkpoint_hold_seconds"] / count
    write = summary["checkpoint_write_seconds"] / count
    step = summary["train_seconds"] / summary["steps"]
    print(f"GPT of {summary['gpt']['parameters'] / 1e6:.1f}M parameters, {size / 2**20:.0f} MiB per checkpoint, "
          f"{count} checkpoints, a step takes {step:.3f} s")
    print(f"{'':28}{'held per checkpoint':>22}")
    print(f"{'lockstep (background write)':28}{held:>20.3f} s")
    print(f"{'synchronous save':28}{write:>20.3f} s")
    print(f"held / write: {100 * held / write:.1f}%")
    during = count - 1  # the end's checkpoint is written after training in both runs
    extra = (summary["train_seconds"] - plain["train_seconds"]) / max(1, during)
    print(f"training time: {summary['train_seconds']:.2f} s with {during} checkpoints while training, "
          f"{plain['train_seconds']:.2f} s without: {extra:.3f} s per checkpoint")


if __name__ == "__main__":
    main()
