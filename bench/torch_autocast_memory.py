#!/usr/bin/python3
"""PyTorch's half of bench/autocast_memory.cpp: the same GPT (tests/fixtures/torch_models.py,
Lockstep's names and layout) on the CPU, one forward in f32 and one under
torch.autocast("cpu", torch.bfloat16), and the bytes of the tensors autograd saves for backward
(saved_tensors_hooks, each storage counted once; the parameters themselves left out, their
bf16 casts counted). Prints one "RESULT key=value ..." line.

    /usr/bin/python3 bench/torch_autocast_memory.py --layers 2 --heads 2 --width 64 --context 64 --batch 8
"""

import argparse
import os
import sys


def saved_bytes(model, tokens, targets, autocast):
    import torch
    import torch.nn.functional as F

    seen = {}

    def pack(t):
        if not isinstance(t, torch.nn.Parameter):
            storage = t.storage()  # torch 1.13's TypedStorage
            seen[storage.data_ptr()] = storage.size() * storage.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(tokens)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
    loss.backward()
    return sum(seen.values())


def main():
    parser = argparse.ArgumentParser()
    for name in ("layers", "heads", "width", "context", "batch"):
        parser.add_argument("--" + name, type=int, required=True)
    args = parser.parse_args()
    try:
        import torch
    except ImportError as error:
        print("SKIP torch is not installed:", error)
        return
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures"))
    from torch_models import GPT

    torch.manual_seed(0)
    model = GPT(256, args.context, args.layers, args.heads, args.width)
    tokens = torch.randint(0, 256, (args.batch, args.context))
    targets = torch.randint(0, 256, (args.batch, args.context))
    f32 = saved_bytes(model, tokens, targets, False)
    bf16 = saved_bytes(model, tokens, targets, True)
    print(f"RESULT torch={torch.__version__} f32_bytes={f32} bf16_bytes={bf16}")


if __name__ == "__main__":
    main()
