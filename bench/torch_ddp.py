#!/usr/bin/python3
"""PyTorch's half of bench/data_parallel.py: the same model (tests/fixtures/torch_models.py),
Fashion-MNIST files, global batch and SGD as `lockstep train`, trained with
DistributedDataParallel over gloo, one process per rank with one thread each. Each rank takes
its contiguous share of every global batch, as Lockstep's ddp does. Rank 0 prints one
"RESULT samples_per_s=..." line (or "SKIP reason" when torch is missing).

    /usr/bin/python3 bench/torch_ddp.py --model cnn --world 2 --batch 64 --steps 100
"""

import argparse
import os
import socket
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, args, port, results):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "fixtures"))
    sys.path.insert(0, here)
    from torch_models import CNN, MLP
    from torch_train import load_training_set

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.world)
    torch.manual_seed(0)
    images, targets = load_training_set(args.data)
    n = images.shape[0]

    model = DDP(CNN() if args.model == "cnn" else MLP())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    order, at = torch.randperm(n, generator=generator), 0
    share = args.batch // args.world

    def step():
        nonlocal order, at
        if at + args.batch > n:
            order, at = torch.randperm(n, generator=generator), 0
        index = order[at + rank * share : at + (rank + 1) * share]
        at += args.batch
        loss = F.cross_entropy(model(images.index_select(0, index)), targets.index_select(0, index))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        results.put(args.steps * args.batch / elapsed)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1, help="threads per rank")
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    try:
        import torch
        import torch.distributed  # noqa: F401
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"SKIP cannot import torch: {e}")
        sys.exit(3)
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        print("SKIP this torch has no gloo backend")
        sys.exit(3)
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    port = free_port()
    processes = [context.Process(target=rank_main, args=(r, args, port, results)) for r in range(args.world)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    if any(p.exitcode != 0 for p in processes) or results.empty():
        print("SKIP a torch rank failed: exit codes " + ", ".join(str(p.exitcode) for p in processes))
        sys.exit(3)
    print(f"RESULT samples_per_s={results.get():.6g}")


if __name__ == "__main__":
    main()
