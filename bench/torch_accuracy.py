#!/usr/bin/python3
"""PyTorch on `lockstep train`'s default recipe: one epoch of the CNN, the MLP or the ResNet on Fashion-MNIST
(pixels in [0, 1]), batch 32, AdamW at lr 0.004 without weight decay, linear warm-up over 100
steps, then cosine decay to 0; the ResNet at lr 0.006 with label smoothing 0.1 and
micro-batches of 16, as Lockstep's defaults for it; prints the test accuracy. The reference for the accuracy the
defaults reach (PyTorch's own initialization and shuffle, so not Lockstep's bits).

    /usr/bin/python3 bench/torch_accuracy.py --model cnn --threads 2
    /usr/bin/python3 bench/torch_accuracy.py --model resnet --micro-batch 32   # BatchNorm over the whole batch

With micro-batches the batch's gradients are accumulated over them (BatchNorm then normalizes
each micro-batch by its own statistics and updates its running statistics at every forward,
PyTorch's semantics).
"""

import argparse
import math
import os
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp", "resnet"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--optimizer", default="adamw", choices=["adamw", "sgd"])
    parser.add_argument("--lr", type=float, default=None,
                        help="default: adamw 0.004 (resnet 0.006), sgd 0.05 (momentum 0.9)")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=None, help="default: resnet 16, else the whole batch")
    parser.add_argument("--label-smoothing", type=float, default=None, help="default: resnet 0.1, else 0")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()

    import numpy as np
    import torch
    import torch.nn.functional as F

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "fixtures"))
    sys.path.insert(0, here)
    from torch_models import CNN, MLP, ResNet
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
    model = {"cnn": CNN, "mlp": MLP, "resnet": ResNet}[args.model]()
    resnet = args.model == "resnet"
    micro = args.micro_batch or (args.batch // 2 if resnet and args.batch % 2 == 0 else args.batch)
    smoothing = args.label_smoothing if args.label_smoothing is not None else (0.1 if resnet else 0.0)
    if args.optimizer == "adamw":
        lr = args.lr or (0.006 if resnet else 0.004)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
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
        optimizer.zero_grad()
        for first in range(0, args.batch, micro):
            part = index[first : first + micro]
            loss = F.cross_entropy(model(train_x[part]), train_y[part], reduction="sum",
                                   label_smoothing=smoothing) / args.batch
            loss.backward()
        optimizer.step()

    model.eval()
    with torch.no_grad():
        correct = sum((model(test_x[i : i + 1000]).argmax(1) == test_y[i : i + 1000]).sum().item()
                      for i in range(0, test_x.shape[0], 1000))
    accuracy = correct / test_x.shape[0]
    print(f"torch {torch.__version__} {args.model} {args.optimizer} micro-batch {micro} label smoothing {smoothing}: "
          f"test accuracy {accuracy:.4f} after one epoch")


if __name__ == "__main__":
    main()
