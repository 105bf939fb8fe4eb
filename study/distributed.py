"""Data-parallel trials: the process group, DDP wrapping, and who writes (rank 0).

A trial with W workers runs `study.train.train` in W processes. Every rank draws the same
global batch from the same data generator and trains on its own contiguous slice of it; DDP
averages the gradients, so each optimiser step is the one-worker step on the whole batch and
the global batch is the spec's whatever W is. Every rank holds whole parameters (DDP, not
sharding), so the optimisers that need whole matrices (rotated_adam, soap, muon) work as they
are. The probe, evals, sink rows and checkpoints happen on rank 0 only.

FSDP (sharded parameters and optimiser state) is not offered (the spec refuses
`resources.sharding: fsdp` with one line): a 1.3B model's fp32 weights, grads and Adam state are
~21 GB, well inside one 80-141 GB device, and sharding would split the whole matrices that
rotated_adam, soap and muon need. Whoever sets the process group up (Ray Train in sweep/trainable.py, torchrun, a test)
does so before `train`; `init_from_env` does it from torchrun's environment variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["World", "world", "init_from_env", "local_rows", "wrap", "mean_across",
           "rank0_decides", "device_for"]


@dataclass(frozen=True)
class World:
    """This process's place among the trial's workers."""

    rank: int = 0
    size: int = 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that probes, evaluates, writes rows and checkpoints."""
        return self.rank == 0


def world() -> World:
    """The current process group's rank and size; one worker when none is set up."""
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return World()


def init_from_env(backend: str | None = None) -> World:
    """Join the group torchrun-style environment variables describe (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT); nothing to do for one worker or a group already set up."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group(backend or ("nccl" if torch.cuda.is_available() else "gloo"))
    return world()


def local_rows(batch_size: int, w: World) -> slice:
    """This rank's contiguous share of the global batch's rows."""
    if batch_size % w.size:
        raise ValueError(f"train.batch_size: {batch_size} sequences do not split evenly over {w.size} workers")
    n = batch_size // w.size
    return slice(w.rank * n, (w.rank + 1) * n)


def device_for(device: torch.device, w: World) -> torch.device:
    """Each rank on its own GPU: `cuda` (no index) becomes cuda:LOCAL_RANK among the visible ones."""
    if w.size > 1 and device.type == "cuda" and device.index is None:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return device


def wrap(model: nn.Module, device: torch.device, w: World) -> nn.Module:
    """DDP over the group (gradients averaged across ranks in backward); the model itself for one
    worker. Buffers (the fixed rotations) are identical by construction: no per-step broadcast."""
    if w.size == 1:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   broadcast_buffers=False)


def mean_across(value: torch.Tensor, w: World) -> torch.Tensor:
    """The mean of a tensor over the ranks (the loss of the global batch from each slice's)."""
    if w.size == 1:
        return value
    total = value.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total / w.size


def rank0_decides(flag: bool, device: torch.device, w: World) -> bool:
    """Rank 0's flag on every rank (rank 0 alone evaluates, so it alone sees divergence)."""
    if w.size == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())
