"""Distributed set-up for ``torchrun``: DDP (gloo on CPU, NCCL on GPU) or FSDP2 for large models."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..cpu import device_problem
from ..errors import RecipeError


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device: torch.device) -> DistInfo:
    """Join the process group that ``torchrun`` describes in the environment (no-op otherwise)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank)


def resolve_device(name: str, info_local_rank: int | None = None) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        local = info_local_rank if info_local_rank is not None else int(os.environ.get("LOCAL_RANK", "0"))
        name = f"cuda:{local}"
    problem = device_problem(name)
    if problem is not None:  # mps, xpu...: torch's own failure would come deep inside it
        raise RecipeError(f"train.device: {problem}")
    device = torch.device(name)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def wrap_model(model: nn.Module, info: DistInfo, device: torch.device, fsdp: bool) -> nn.Module:
    """DDP for the usual case; FSDP2 (``fully_shard`` per block, then the root) when asked."""
    if not info.enabled:
        return model
    if fsdp:
        from torch.distributed.fsdp import fully_shard

        for block in getattr(model, "blocks", []):
            fully_shard(block)
        fully_shard(model)
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def broadcast_weights(model: nn.Module, info: DistInfo) -> None:
    """Every process takes rank 0's parameters and buffers (what DDP does when it wraps a model),
    for a model that is not wrapped."""
    if info.enabled:
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, src=0)


def average_gradients(model: nn.Module, info: DistInfo) -> None:
    """The mean over processes of ``model``'s gradients, in their own dtype, in one all-reduce
    (for a model that is not wrapped in DDP). Every process has gradients for the same parameters."""
    if not info.enabled:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= info.world_size
    start = 0
    for g in grads:
        g.copy_(flat[start : start + g.numel()].view_as(g))
        start += g.numel()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
