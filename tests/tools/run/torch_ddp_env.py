#!/usr/bin/python3
"""A PyTorch DDP program as users write them for torchrun: the process group from the
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), gloo, a few steps on this rank's
share of a fixed batch. Each rank prints its final weights' checksum; `lockstep run`'s tests
check that the ranks agree, on one node and two. FAIL_RANK=r makes rank r raise, through
torchrun's @record, for the failure summary. Prints "SKIP ..." and exits 0 when torch is missing."""

import os
import sys

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print(f"SKIP cannot import torch: {e}")
    sys.exit(0)

from torch.distributed.elastic.multiprocessing.errors import record


@record  # a failure goes to TORCHELASTIC_ERROR_FILE, for the launcher's summary
def main():
    dist.init_process_group("gloo")  # env:// from lockstep run's variables
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == int(os.environ["WORLD_SIZE"]) and rank == int(os.environ["RANK"])
    print(f"elastic {dist.is_torchelastic_launched()} group {os.environ['GROUP_RANK']} of {os.environ['GROUP_WORLD_SIZE']}")
    if os.environ.get("FAIL_RANK") == str(rank):
        raise ValueError(f"rank {rank} gives up")
    train(rank, world)


def train(rank, world):
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 8, generator=generator), torch.randn(16, 4, generator=generator)
    share = 16 // world
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(x[rank * share : (rank + 1) * share]), y[rank * share : (rank + 1) * share])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    checksum = sum(float(p.double().sum()) for p in model.parameters())
    print(f"weights {checksum:.12f}")
    dist.destroy_process_group()


main()
