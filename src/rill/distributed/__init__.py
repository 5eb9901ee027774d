"""Tensor parallelism: one engine over several processes (torch.distributed: NCCL on GPUs, gloo on CPUs).

Rank 0 is the engine's process and runs everything that is not the model (scheduler, KV block
manager, sampler, detokenizer); ranks 1 .. N-1 are processes it spawns, each holding a slice of every
layer (models/parallel.py) and its share of the KV cache, repeating rank 0's model calls.

    group.py     the process group and the collectives the layers use
    wire.py      what rank 0 sends the other ranks each call
    worker.py    a spawned rank's process
    ranks.py     rank 0's handle on the spawned ranks: processes, pipes, death watch
    driver.py    rank 0's decoder: its shard plus the broadcast to the others
"""
