"""Multi-worker trials: the process group, DDP wrapping or FSDP2 sharding, and who writes (rank 0).

A trial with W workers runs `study.train.train` in W processes. Every rank draws the same
global batch from the same data generator and trains on its own contiguous slice of it; the
gradients are averaged over the ranks, so each optimiser step is the one-worker step on the
whole batch and the global batch is the spec's whatever W is. The probe, evals, sink rows and
checkpoints happen on rank 0 only.

Two ways to split the work (`resources.sharding`):
- ddp (`wrap`): every rank holds whole parameters and optimiser state; DDP all-reduces the
  gradients. Every optimiser works.
- fsdp (`shard`): FSDP2's `fully_shard` on each block, then the root: each rank holds 1/W of
  every parameter, gradient and optimiser moment (DTensors, dim 0), for models whose training
  state does not fit one device. Only optimisers whose update of a coordinate reads that
  coordinate alone (study.optim.registry's `shardable`: adam, sgd, lion, signsgd) train a
  shard; rotated_adam, soap, muon and adafactor need whole matrices and are refused up front
  (gathering each matrix every step would cost an all-gather of the whole model per step and
  give back the memory sharding saves). Rank 0 evaluates an unsharded copy into which
  `full_model_state` gathers the weights; checkpoints hold the full model and optimiser state
  (`full_optimizer_state`) in the one-worker format, so a checkpoint resumes under one worker,
  ddp or fsdp alike (`load_full_state`).

Whoever sets the process group up (Ray Train in sweep/trainable.py, torchrun, a test) does so
before `train`; `init_from_env` does it from torchrun's environment variables.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["World", "world", "init_from_env", "local_rows", "wrap", "shard", "whole", "full_model_state",
           "full_optimizer_state", "load_full_state", "mean_across", "rank0_decides", "device_for"]


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


def shard(model: nn.Module, w: World) -> nn.Module:
    """FSDP2 in place: `fully_shard` each transformer block (its parameters gathered for its own
    forward and backward only), then the root (embeddings, final norm, unembedding). Parameters
    become DTensors sharded on dim 0; build the optimiser after this. The model itself for one
    worker."""
    if w.size == 1:
        return model
    from torch.distributed.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def whole(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor: a DTensor's full value (a collective: every rank calls it), else itself."""
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A sharded model's whole state dict, on rank 0's CPU (empty on the other ranks). A
    collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_full_options())


def _param_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """The optimiser's parameters by name, in the order `optimizer.state_dict()` numbers them."""
    names = {p: n for n, p in model.named_parameters()}
    return [names[p] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """A sharded optimiser's whole state in `optimizer.state_dict()`'s own format (states keyed by
    parameter number), on rank 0's CPU: what one worker would have saved. A collective."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    by_name = get_optimizer_state_dict(model, optimizer, options=_full_options())
    state = by_name.get("state", {})
    numbered = {i: state[n] for i, n in enumerate(_param_names(model, optimizer)) if n in state}
    return {"state": numbered, "param_groups": optimizer.state_dict()["param_groups"]}


def load_full_state(model: nn.Module, optimizer: torch.optim.Optimizer, model_state: dict, optimizer_state: dict) -> None:
    """Load a whole (one-worker format) model and optimiser state into a sharded model and its
    optimiser: each rank keeps its own shard. Every rank calls it with the whole state."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, model_state, options=options)
    names = _param_names(model, optimizer)
    groups, start = [], 0
    for group in optimizer_state["param_groups"]:
        groups.append({**group, "params": names[start : start + len(group["params"])]})
        start += len(group["params"])
    state = {names[i]: s for i, s in optimizer_state["state"].items()}
    set_optimizer_state_dict(model, optimizer, {"state": state, "param_groups": groups}, options=options)


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
