#!/usr/bin/python3
"""PyTorch's half of bench/train_throughput.cpp: trains the same model (src/lockstep/nn/models.h,
or the GPT of src/lockstep/nn/gpt.h) on the same data (the Fashion-MNIST files, or the GPT's
training text) with the same batch, optimizer and thread count, and prints one
"RESULT key=value ..." line the C++ program reads (or "SKIP reason" when torch is missing).

    /usr/bin/python3 bench/torch_train.py --model cnn --threads 1 --steps 20
    /usr/bin/python3 bench/torch_train.py --model gpt --train-text FILE --batch 32 \
        --context 64 --layers 2 --heads 2 --width 64
    /usr/bin/python3 bench/torch_train.py --probe      # torch version and the BLAS it loaded

The GPT under bf16 autocast: Lockstep rounds only the operands of its matrix products to bf16
and keeps every activation in f32 (src/lockstep/core/autocast.h). torch.autocast also writes
the products' outputs in bf16, so what runs between them in the input's type does so in bf16
(GELU, the attention's scaling and mask; their backward too), while the residual adds promote
back to f32 and softmax, layer norm and the cross-entropy run in f32 as in Lockstep. PyTorch
thus moves fewer activation bytes than Lockstep under the same flag; the products, the bulk of
the work, read the same bf16 operands on both sides.
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


def load_text_windows(path, context):
    """The windows src/lockstep/data/text_dataset.h's text_windows cuts from the bytes of `path`
    (train_throughput writes the training split there): sample i reads bytes [i*T, i*T + T + 1),
    its tokens the first T and its targets the last T, int64 [N, T] each."""
    import numpy as np
    import torch

    text = np.fromfile(path, dtype=np.uint8)
    n = (len(text) - 1) // context
    if n < 1:
        raise SystemExit(f"{path}: {len(text)} bytes is too short for one window of {context} + 1")
    tokens = torch.from_numpy(text[: n * context + 1].astype(np.int64))
    return tokens[:-1].view(n, context), tokens[1:].view(n, context)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp", "resnet", "gpt"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed repetition")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--device", default="cpu", help="cpu, cpu:0 or cuda:0 (batches copied there each step)")
    parser.add_argument("--precision", default="f32", choices=["f32", "bf16", "f16"], help="autocast's type on GPUs")
    parser.add_argument("--probe", action="store_true", help="print torch's version and BLAS, then exit")
    parser.add_argument("--train-text", help="gpt: the training text, read as bytes and cut into windows as is")
    parser.add_argument("--context", type=int, default=64, help="gpt: bytes per window")
    parser.add_argument("--layers", type=int, default=2, help="gpt: transformer blocks")
    parser.add_argument("--heads", type=int, default=2, help="gpt: attention heads")
    parser.add_argument("--width", type=int, default=64, help="gpt: embedding width")
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
    from torch_models import CNN, GPT, MLP, ResNet

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    if args.model == "gpt":
        if not args.train_text:
            parser.error("--model gpt needs --train-text FILE")
        inputs, targets = load_text_windows(args.train_text, args.context)
        # Initialized by PyTorch's defaults, not GPT-2's as Lockstep's: the losses differ, the
        # work does not.
        model = GPT(256, args.context, args.layers, args.heads, args.width).to(device)
        # `lockstep train --model gpt`'s optimizer: AdamW, lr 1e-3, no weight decay (PyTorch's
        # default decay is 0.01).
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)

        def loss_of(output, target):  # nn::gpt_loss: the mean over every position
            return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    else:
        inputs, targets = load_training_set(args.data)
        model = {"cnn": CNN, "mlp": MLP, "resnet": ResNet}[args.model]().to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        loss_of = F.cross_entropy
    n = inputs.shape[0]
    generator = torch.Generator().manual_seed(0)
    state = {"order": torch.randperm(n, generator=generator, device="cpu"), "at": 0}
    phases = {"data": 0.0, "fwd": 0.0, "bwd": 0.0, "opt": 0.0}

    def step(timed):
        t0 = time.perf_counter()
        if state["at"] + args.batch > n:  # drop the last partial batch, reshuffle
            state["order"], state["at"] = torch.randperm(n, generator=generator, device="cpu"), 0
        index = state["order"][state["at"] : state["at"] + args.batch]
        state["at"] += args.batch
        x, y = inputs.index_select(0, index).to(device), targets.index_select(0, index).to(device)
        t1 = time.perf_counter()
        if args.precision == "f32":
            loss = loss_of(model(x), y)
        else:
            dtype = torch.bfloat16 if args.precision == "bf16" else torch.float16
            with torch.autocast(device_type=device.type, dtype=dtype):
                loss = loss_of(model(x), y)
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
    if args.model == "gpt":
        fields["tokens_per_s"] = fields["samples_per_s"] * args.context
    print("RESULT " + " ".join(f"{k}={v:.6g}" for k, v in fields.items()))


if __name__ == "__main__":
    main()
