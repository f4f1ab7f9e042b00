#!/usr/bin/python3
"""PyTorch on `lockstep train`'s default recipe: one epoch of the CNN or the MLP on Fashion-MNIST
(pixels in [0, 1]), batch 32, AdamW at lr 0.004 without weight decay, linear warm-up over 100
steps, then cosine decay to 0; prints the test accuracy. The reference for the accuracy the
defaults reach (PyTorch's own initialization and shuffle, so not Lockstep's bits).

    /usr/bin/python3 bench/torch_accuracy.py --model cnn --threads 2
"""

import argparse
import math
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    parser.add_argument("--lr", type=float, default=None, help="default: adamw 0.004, sgd 0.05 (momentum 0.9)")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()

    import numpy as np
    import torch
    import torch.nn.functional as F

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "fixtures"))
    sys.path.insert(0, here)
    from torch_models import CNN, MLP
    from torch_train import read_idx

    def load(prefix):
        pixels = read_idx(os.path.join(args.data, f"{prefix}-images-idx3-ubyte.gz"), 16)
        labels = read_idx(os.path.join(args.data, f"{prefix}-labels-idx1-ubyte.gz"), 8)
        images = torch.from_numpy(pixels.reshape(-1, 1, 28, 28).astype(np.float32) / 255.0)
        return images, torch.from_numpy(labels.astype(np.int64))

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_x, train_y = load("train")
    test_x, test_y = load("t10k")
    model = CNN() if args.model == "cnn" else MLP()
    if args.optimizer == "adamw":
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr or 0.004, weight_decay=0.0)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr or 0.05, momentum=0.9)
    base_lr = optimizer.param_groups[0]["lr"]
    steps = train_x.shape[0] // args.batch  # the last partial batch is dropped, as Lockstep does
    warmup = min(args.warmup, steps // 10)

    def lr_at(step):  # Lockstep's cosine:warmup=N (src/lockstep/optim/schedule.cpp)
        if step < warmup:
            return base_lr * (step + 1) / warmup
        return base_lr * 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / (steps - warmup)))

    order = torch.randperm(train_x.shape[0], generator=torch.Generator().manual_seed(args.seed))
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        index = order[step * args.batch : (step + 1) * args.batch]
        loss = F.cross_entropy(model(train_x[index]), train_y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    model.eval()
    with torch.no_grad():
        accuracy = (model(test_x).argmax(1) == test_y).double().mean().item()
    print(f"torch {torch.__version__} {args.model} {args.optimizer}: test accuracy {accuracy:.4f} after one epoch")


if __name__ == "__main__":
    main()
