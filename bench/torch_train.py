#!/usr/bin/python3
"""PyTorch's half of bench/train_throughput.cpp: trains the same model (src/lockstep/nn/models.h)
on the same Fashion-MNIST files with the same batch, optimizer and thread count, and prints one
"RESULT key=value ..." line the C++ program reads (or "SKIP reason" when torch is missing).

    /usr/bin/python3 bench/torch_train.py --model cnn --threads 1 --steps 20
    /usr/bin/python3 bench/torch_train.py --probe      # torch version and the BLAS it loaded
"""

import argparse
import gzip
import os
import sys
import time


def blas_libraries():
    """The BLAS/LAPACK libraries mapped into this process, resolved through Debian's
    alternatives symlinks: which implementation torch really calls."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            name = os.path.basename(path).lower()
            if ("blas" in name or "mkl" in name) and path not in found:
                found.append(path)
    real = []
    for path in found:
        target = os.path.realpath(path)
        label = os.path.basename(os.path.dirname(target)) + "/" + os.path.basename(target)
        if label not in real:
            real.append(label)
    return ",".join(real) or "unknown"


def read_idx(path, header_bytes):
    import numpy as np

    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=header_bytes)


def load_images(data_dir, prefix):
    """Fashion-MNIST's `prefix` ("train" or "t10k") images as float32 [n, 1, 28, 28] in [0, 1]
    and int64 labels."""
    import numpy as np
    import torch

    pixels = read_idx(os.path.join(data_dir, f"{prefix}-images-idx3-ubyte.gz"), 16)
    labels = read_idx(os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte.gz"), 8)
    images = torch.from_numpy(pixels.reshape(-1, 1, 28, 28).astype(np.float32) / 255.0)
    return images, torch.from_numpy(labels.astype(np.int64))


def load_training_set(data_dir):
    return load_images(data_dir, "train")


def load_test_set(data_dir):
    return load_images(data_dir, "t10k")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp", "resnet"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed repetition")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--device", default="cpu", help="cpu, cpu:0 or cuda:0 (batches copied there each step)")
    parser.add_argument("--precision", default="f32", choices=["f32", "bf16", "f16"], help="autocast's type on GPUs")
    parser.add_argument("--probe", action="store_true", help="print torch's version and BLAS, then exit")
    args = parser.parse_args()

    try:
        import numpy as np  # noqa: F401 (checked here, used by load_training_set)
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"SKIP cannot import torch or numpy: {e}")
        sys.exit(3)

    if args.probe:
        onednn = "yes" if torch.backends.mkldnn.is_available() else "no"
        print(f"RESULT torch={torch.__version__} blas={blas_libraries()} onednn={onednn}")
        return

    # The models' one definition, shared with the cross-check fixtures.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
    from torch_models import CNN, MLP, ResNet

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    images, targets = load_training_set(args.data)
    n = images.shape[0]

    device = torch.device(args.device)
    model = {"cnn": CNN, "mlp": MLP, "resnet": ResNet}[args.model]().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    state = {"order": torch.randperm(n, generator=generator), "at": 0}
    phases = {"data": 0.0, "fwd": 0.0, "bwd": 0.0, "opt": 0.0}

    def step(timed):
        t0 = time.perf_counter()
        if state["at"] + args.batch > n:  # drop the last partial batch, reshuffle
            state["order"], state["at"] = torch.randperm(n, generator=generator), 0
        index = state["order"][state["at"] : state["at"] + args.batch]
        state["at"] += args.batch
        x, y = images.index_select(0, index).to(device), targets.index_select(0, index).to(device)
        t1 = time.perf_counter()
        if args.precision == "f32":
            loss = F.cross_entropy(model(x), y)
        else:
            dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
            with torch.autocast(device_type=device.type, dtype=dtype):
                loss = F.cross_entropy(model(x), y)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t4 = time.perf_counter()
        if timed:
            phases["data"] += t1 - t0
            phases["fwd"] += t2 - t1
            phases["bwd"] += t3 - t2
            phases["opt"] += t4 - t3
        return float(loss)

    for _ in range(args.warmup):
        step(False)
    rates, total = [], 0.0
    loss = float("nan")
    for _ in range(args.reps):
        start = time.perf_counter()
        for _ in range(args.steps):
            loss = step(True)
        elapsed = time.perf_counter() - start
        rates.append(args.steps * args.batch / elapsed)
        total += elapsed
    timed = args.steps * args.reps
    fields = {
        "samples_per_s": max(rates),  # best repetition, as the C++ side
        "data_ms": 1e3 * phases["data"] / timed,
        "fwd_ms": 1e3 * phases["fwd"] / timed,
        "bwd_ms": 1e3 * phases["bwd"] / timed,
        "opt_ms": 1e3 * phases["opt"] / timed,
        "step_ms": 1e3 * total / timed,
        "loss": loss,
    }
    print("RESULT " + " ".join(f"{k}={v:.6g}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
