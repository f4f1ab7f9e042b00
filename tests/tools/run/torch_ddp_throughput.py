#!/usr/bin/python3
"""A PyTorch DDP training loop (gloo, CPU) that reports its throughput as such scripts do:
rank 0 prints "samples/s=X" every 10 steps, X the global batch over the mean step time
since the last report. The global batch (256) is split across the ranks, so more ranks
should mean more samples/s. STEPS=n ends it after n steps (default: runs until stopped).
Prints "SKIP ..." and exits 0 when torch is missing."""

import os
import sys
import time

try:
    import torch
    import torch.distributed as dist
except ImportError as e:
    print(f"SKIP cannot import torch: {e}")
    sys.exit(0)

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(784, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
batch = 256
x = torch.randn(batch // world, 784)
y = torch.randint(0, 10, (batch // world,))
steps = int(os.environ.get("STEPS", "0"))
step, since = 0, time.perf_counter()
while steps == 0 or step < steps:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    step += 1
    if step % 10 == 0:
        now = time.perf_counter()
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f} samples/s={10 * batch / (now - since):.1f}", flush=True)
        since = now
dist.destroy_process_group()
