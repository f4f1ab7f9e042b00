#!/usr/bin/python3
"""PyTorch's half of bench/data_parallel.py and bench/slow_link.py: the same model
(tests/fixtures/torch_models.py), Fashion-MNIST files, global batch and SGD (lr 0.05, momentum
0.9, constant) as `lockstep train`, trained with DistributedDataParallel over gloo, one process
per rank with one thread each. Each rank takes its contiguous share of every global batch, as
Lockstep's ddp does. Rank 0 prints one "RESULT samples_per_s=..." line, with test_accuracy=...
on the 10000 test images after training under --test (or "SKIP reason" when torch is missing).

By default this process spawns the --world ranks on this host. With --from-env it is one rank,
the process group taken from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT),
so that one copy runs on each host.

--hook picks DDP's gradient communication: none (all-reduce in f32), fp16
(default_hooks.fp16_compress_hook), powersgd (powerSGD_hook, rank --powersgd-rank, compressing
from step --powersgd-start; PyTorch's other defaults) or localsgd (post_localSGD_hook without
gradient all-reduce, and PeriodicModelAverager averaging the parameters every
--localsgd-period steps from step --localsgd-start). --zero wraps SGD in ZeroRedundancyOptimizer.

    /usr/bin/python3 bench/torch_ddp.py --model cnn --world 2 --batch 64 --steps 100
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=10.0.0.1 MASTER_PORT=29500 GLOO_SOCKET_IFNAME=eth0 \\
        /usr/bin/python3 bench/torch_ddp.py --from-env --model mlp --batch 256 --hook powersgd --test
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


def attach_hook(model, args):
    """Registers --hook on the DDP model; returns what runs after each optimizer step (or None)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook
    from torch.distributed.algorithms.model_averaging import averagers

    if args.hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=args.powersgd_start)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif args.hook == "localsgd":
        # Without post_local_gradient_allreduce the ranks step on their own gradients after
        # the start (no subgroup all-reduce, which would need one group per node's GPUs).
        state = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=None,
                                                     start_localSGD_iter=args.localsgd_start,
                                                     post_local_gradient_allreduce=False)
        model.register_comm_hook(state, post_localSGD_hook.post_localSGD_hook)
        averager = averagers.PeriodicModelAverager(period=args.localsgd_period, warmup_steps=args.localsgd_start)
        return lambda: averager.average_parameters(model.parameters())
    return None


def test_accuracy(model, data_dir):
    import torch
    from torch_train import load_test_set

    images, targets = load_test_set(data_dir)
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(images[i : i + 1000]).argmax(1) == targets[i : i + 1000]).sum())
                      for i in range(0, images.shape[0], 1000))
    return correct / images.shape[0]


def rank_main(rank, world, init_method, args, results=None):
    """Trains rank `rank` of `world`; rank 0's RESULT line goes to `results` (a queue) or stdout."""
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
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    torch.manual_seed(0)
    images, targets = load_training_set(args.data)
    n = images.shape[0]

    if args.hook == "powersgd":
        # The hook issues its second all-reduce from the first's callback: with two buckets
        # the ranks can issue their collectives in different orders, which gloo (matching
        # them by order) fails on. One bucket keeps one chain per step.
        dist._DEFAULT_FIRST_BUCKET_BYTES = 25 * 1024 * 1024  # DDP's bucket_cap_mb default
    model = DDP(CNN() if args.model == "cnn" else MLP())
    after_step = attach_hook(model, args)
    if args.zero:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05,
                                            momentum=0.9)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(0)
    order, at = torch.randperm(n, generator=generator), 0
    share = args.batch // world

    def step():
        nonlocal order, at
        if at + args.batch > n:
            order, at = torch.randperm(n, generator=generator), 0
        index = order[at + rank * share : at + (rank + 1) * share]
        at += args.batch
        loss = F.cross_entropy(model(images.index_select(0, index)), targets.index_select(0, index))
        loss.backward()
        optimizer.step()
        if after_step:  # before zero_grad: the averager skips parameters without a gradient
            after_step()
        optimizer.zero_grad(set_to_none=True)

    dist.barrier()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        line = f"RESULT samples_per_s={args.steps * args.batch / elapsed:.6g}"
        if args.test:  # rank 0's model: under localsgd the ranks' differ after the last average
            line += f" test_accuracy={test_accuracy(model.module, args.data):.6g}"
        if results is None:
            print(line, flush=True)
        else:
            results.put(line)
    dist.destroy_process_group()


def spawn_ranks(args):
    """Every rank on this host, each in a process of its own; rank 0's RESULT line or None."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    init_method = f"tcp://127.0.0.1:{free_port()}"
    processes = [context.Process(target=rank_main, args=(r, args.world, init_method, args, results))
                 for r in range(args.world)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    if any(p.exitcode != 0 for p in processes) or results.empty():
        print("SKIP a torch rank failed: exit codes " + ", ".join(str(p.exitcode) for p in processes))
        sys.exit(3)
    print(results.get())


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="cnn", choices=["cnn", "mlp"])
    parser.add_argument("--world", type=int, default=2, help="ranks to spawn (not with --from-env)")
    parser.add_argument("--from-env", action="store_true", help="be one rank, the group from torchrun's variables")
    parser.add_argument("--threads", type=int, default=1, help="threads per rank")
    parser.add_argument("--batch", type=int, default=64, help="global batch")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--hook", default="none", choices=["none", "fp16", "powersgd", "localsgd"])
    parser.add_argument("--powersgd-rank", type=int, default=4)
    # Lockstep's default start (--powersgd-start 10): PyTorch's own (step 1000) would leave a
    # short run uncompressed.
    parser.add_argument("--powersgd-start", type=int, default=10)
    parser.add_argument("--localsgd-period", type=int, default=8)
    parser.add_argument("--localsgd-start", type=int, default=0)
    parser.add_argument("--test", action="store_true", help="rank 0 also reports the test accuracy")
    parser.add_argument("--zero", action="store_true",
                        help="shard the optimizer state (ZeroRedundancyOptimizer, PyTorch's ZeRO-1)")
    parser.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    args = parser.parse_args()
    try:
        import torch
        import torch.distributed  # noqa: F401
    except ImportError as e:
        print(f"SKIP cannot import torch: {e}")
        sys.exit(3)
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        print("SKIP this torch has no gloo backend")
        sys.exit(3)
    if args.from_env:
        rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "env://", args)
    else:
        spawn_ranks(args)


if __name__ == "__main__":
    main()
