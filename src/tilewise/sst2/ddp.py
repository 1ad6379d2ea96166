"""Data-parallel training over the GPUs of one host under torchrun (DistributedDataParallel: NCCL
on GPUs, gloo on the CPU). Each process takes every world-th batch of one shuffled order, the
gradients are averaged in the backward, and rank 0 alone prints, evaluates and writes."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .. import settings
from .config import TrainConfig


@dataclass
class Dist:
    """Data-parallel run under torchrun: this process's rank among world_size."""

    rank: int
    world_size: int


def world_size() -> int:
    """How many processes torchrun started (1 outside torchrun)."""
    return settings.distributed()[0]


def init_distributed(cfg: TrainConfig) -> tuple[TrainConfig, Dist | None, list[str]]:
    """Under torchrun (WORLD_SIZE > 1 in the environment): join the process group (NCCL on GPUs,
    gloo on the CPU), pin this process to its GPU (LOCAL_RANK), and return the config adjusted for
    a data-parallel run: rank 0 alone prints, plots, evaluates and writes; CUDA graphs are off (a
    step's gradient all-reduce is not captured). Outside torchrun: (cfg, None, [])."""
    world = world_size()
    if world <= 1:
        return cfg, None, []
    import torch.distributed as dist

    _, rank, local = settings.distributed()
    on_gpu = cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())
    notes = [f"data-parallel: rank {rank} of {world} ({'NCCL' if on_gpu else 'gloo'}), batch {cfg.batch_size} "
             f"per process, {cfg.batch_size * world} a step in all"]
    if on_gpu:
        if not torch.cuda.is_available():
            raise ValueError(f"--device {cfg.device} under torchrun: no CUDA GPU is visible to PyTorch")
        torch.cuda.set_device(local)
        cfg = replace(cfg, device=f"cuda:{local}")
    if not dist.is_initialized():
        dist.init_process_group("nccl" if on_gpu else "gloo")
    if cfg.graph:
        notes.append("--graph is off under torchrun (the gradient all-reduce is not captured)")
    cfg = replace(cfg, graph=False)
    if rank != 0:
        cfg = replace(cfg, progress=False, plot=False)
    return cfg, Dist(rank, world), notes


def shutdown(ddp: Dist | None) -> None:
    """Leave the process group ``init_distributed`` joined (nothing outside torchrun)."""
    if ddp is None:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def wrap(model: torch.nn.Module, ddp: Dist | None, device: torch.device):
    """What runs the forward: the model, or under torchrun its DistributedDataParallel wrapper
    (whose backward averages the gradients over the processes)."""
    if ddp is None:
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
