"""Work over several processes on torch.distributed, as `torchrun --nproc-per-node N -m edgettt ...` starts them:
`convert --distill` (data parallel, or FSDP2 with `shard=1`) and `calibrate` (each rank its share of the windows).

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; `start` joins the process group (NCCL on GPUs, gloo on the CPU)
with a timeout on every collective, so that a rank that died ends the others with a line instead of a hang.
Outside torchrun everything here is the single process (`SINGLE`): no process group, no collective.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import secrets
from datetime import timedelta

import torch
import torch.distributed as dist

from edgettt.errors import EdgetttError

BACKENDS = ("gloo", "nccl")
TIMEOUT_S = 600  # the longest wait on another rank: a step, a checkpoint, the teacher's pool


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This process's place among the job's: rank `rank` of `world`, `local` on its host (its GPU)."""

    rank: int = 0
    world: int = 1
    local: int = 0

    @property
    def main(self) -> bool:
        """The rank that writes outputs and prints."""
        return self.rank == 0

    def share(self, count: int, what: str) -> slice:
        """This rank's part of `count` items (windows of a step, calibration samples): equal parts."""
        if count % self.world:
            raise EdgetttError(f"{what}: {count} does not divide among {self.world} processes; make it a multiple "
                               f"of {self.world} or change --nproc-per-node")
        part = count // self.world
        return slice(self.rank * part, (self.rank + 1) * part)

    def device(self) -> str:
        """The device this rank computes on: its own GPU where there are GPUs, else the CPU."""
        return f"cuda:{self.local}" if torch.cuda.is_available() else "cpu"


SINGLE = Ranks()


def launched_world() -> int:
    """The processes torchrun started for this job (1 outside torchrun)."""
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        raise EdgetttError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number; start the job with "
                           "torchrun, which sets it") from None


def check_backend(backend: str | None) -> None:
    """Before any work: a backend torch.distributed has, and GPUs for NCCL."""
    if backend not in (None, *BACKENDS):
        raise EdgetttError(f"EDGETTT_BACKEND={backend}: use gloo or nccl (or leave it unset: NCCL on GPUs, gloo on "
                           "the CPU)")
    if backend == "nccl" and not torch.cuda.is_available():
        raise EdgetttError("EDGETTT_BACKEND=nccl: this machine has no CUDA GPU, and NCCL runs only between GPUs; use "
                           "gloo (or leave EDGETTT_BACKEND unset: gloo on the CPU, NCCL on GPUs)")


def start(backend: str | None = None, timeout_s: float = TIMEOUT_S) -> Ranks:
    """Join the job's process group (torchrun's environment) and return this rank; `SINGLE` outside torchrun."""
    check_backend(backend)
    world = launched_world()
    if world == 1:
        return SINGLE
    if dist.is_initialized():
        return current()
    missing = [name for name in ("RANK", "MASTER_ADDR", "MASTER_PORT") if name not in os.environ]
    if missing:
        raise EdgetttError(f"WORLD_SIZE={world} without {', '.join(missing)}: start the job with torchrun "
                           "(`torchrun --nproc-per-node N -m edgettt ...`), which sets them")
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return current()


def stop() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def current() -> Ranks:
    """This rank of the process group `start` joined, or `SINGLE`."""
    if not dist.is_initialized():
        return SINGLE
    return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def _sendable(tensor: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """`tensor` where the backend takes it (NCCL: on this rank's GPU; gloo: anywhere), as a fresh copy."""
    return tensor.detach().to(ranks.device() if dist.get_backend() == "nccl" else tensor.device, copy=True)


def mean(value: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """The mean of a scalar over the ranks (every rank gets it, on `value`'s device)."""
    if ranks.world == 1:
        return value
    total_ = _sendable(value.reshape(1), ranks)
    dist.all_reduce(total_)
    return (total_[0] / ranks.world).to(value.device)


def total(tensor: torch.Tensor, ranks: Ranks) -> torch.Tensor:
    """`tensor` summed over the ranks (every rank gets it, on `tensor`'s device)."""
    if ranks.world == 1:
        return tensor
    summed = _sendable(tensor, ranks)
    dist.all_reduce(summed)
    return summed.to(tensor.device)


def gather(tensor: torch.Tensor, ranks: Ranks, dim: int = -1) -> torch.Tensor:
    """Every rank's `tensor` (the same shape on each), concatenated along `dim` in rank order."""
    if ranks.world == 1:
        return tensor
    sent = _sendable(tensor.contiguous(), ranks)
    parts = [torch.empty_like(sent) for _ in range(ranks.world)]
    dist.all_gather(parts, sent)
    return torch.cat(parts, dim=dim).to(tensor.device)


def barrier(ranks: Ranks) -> None:
    if ranks.world > 1:
        dist.barrier()


def random_suffix(ranks: Ranks) -> str:
    """A random name part, the same on every rank (rank 0's): the staging folder they write into together."""
    draw = torch.tensor([secrets.randbits(62)])
    if ranks.world > 1:
        draw = _sendable(draw, ranks)
        dist.broadcast(draw, src=0)
    return format(int(draw.item()), "x")


@contextlib.contextmanager
def collectives(ranks: Ranks):
    """A collective that fails (a rank died or hung past the timeout) as one line naming this rank."""
    if ranks.world == 1:
        yield
        return
    try:
        yield
    except (dist.DistError, RuntimeError) as exc:
        if isinstance(exc, RuntimeError) and not _is_communication_error(exc):
            raise
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)[:160]
        raise EdgetttError(f"rank {ranks.rank} of {ranks.world}: lost contact with the other processes ({first}); "
                           "another rank stopped or hung: see its own error above, then start the job again (with "
                           "resume=1 where it saved a checkpoint)") from None


def _is_communication_error(exc: RuntimeError) -> bool:
    text = str(exc).lower()
    return any(word in text for word in ("gloo", "nccl", "connection", "timed out", "timeout", "peer", "socket"))


# ---- models over the ranks: data parallel (DDP) or sharded (FSDP2)

def shard(model: torch.nn.Module, ranks: Ranks, device, checkpointing: bool) -> torch.nn.Module:
    """`model` as FSDP2 shards it over the ranks (`fully_shard`), in place: its weights, gradients and optimizer
    moments kept in 1/N parts, gathered whole for each forward and backward; on a GPU its matmuls in bfloat16
    over float32 weights, gradients reduced in float32. With `checkpointing`, each block's activations are
    recomputed in the backward pass instead of kept (`recompute_blocks`). One unit, the whole model: every
    family makes a block's decode state from the block's weights before the blocks run (`init_state`), which
    a unit a block would hand over still in parts."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kind = torch.device(device).type
    if not dist.is_initialized():  # one process (sharding still buys its mixed precision and checkpointing)
        dist.init_process_group("nccl" if kind == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh(kind, (ranks.world,))
    precision = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if kind == "cuda" \
        else MixedPrecisionPolicy()
    if checkpointing:
        recompute_blocks(model)
    fully_shard(model, mesh=mesh, mp_policy=precision)
    return model


def recompute_blocks(model: torch.nn.Module) -> None:
    """Each block's forward under activation checkpointing (torch.utils.checkpoint, non-reentrant), in place. A
    block updates its decode state (a dict) as it runs; the recomputation starts again from the state as it
    entered, not as the first run left it."""
    from torch.utils.checkpoint import checkpoint

    for block in model.model.layers:
        def forward(h, layer_state, *rest, _forward=block.forward):
            entering = dict(layer_state)

            def compute(h):
                state = dict(entering)
                return _forward(h, state, *rest), state

            out, left = checkpoint(compute, h, use_reentrant=False)
            layer_state.clear()
            layer_state.update(left)
            return out
        block.forward = forward


ADAMW_BYTES = 16  # a trained float32 weight: itself, its gradient and AdamW's two moments
HEADROOM = 0.5  # of the GPU's memory: the rest for activations, logits and the allocator's slack


def fits(teacher: torch.nn.Module, student: torch.nn.Module, device) -> bool:
    """Whether data parallel fits: each rank holds the whole teacher and the student with its gradients and AdamW
    moments, within HEADROOM of its GPU's memory (the CPU: always)."""
    if torch.device(device).type != "cuda":
        return True
    needed = sum(p.numel() * p.element_size() for p in teacher.parameters()) + \
        sum(p.numel() for p in student.parameters()) * ADAMW_BYTES
    return needed <= HEADROOM * torch.cuda.get_device_properties(torch.device(device)).total_memory


def trainee(student: torch.nn.Module, device, ranks: Ranks, sharded: bool) -> torch.nn.Module:
    """What the optimizer trains: the student itself (one process), wrapped for data parallel (its gradients
    averaged over the ranks after each backward), or a sharded copy (`write_back` brings its weights home)."""
    if sharded:
        return shard(copy.deepcopy(student).train(), ranks, device, checkpointing=True)
    student.to(device).train()
    if ranks.world == 1:
        return student
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(student, device_ids=[ranks.local] if torch.device(device).type == "cuda" else None)


def write_back(trainee: torch.nn.Module, student: torch.nn.Module, ranks: Ranks) -> None:
    """A sharded trainee's weights gathered whole into `student` on rank 0 (the rank that writes the model)."""
    if not hasattr(trainee, "reshard"):  # (not an FSDP module: the student itself was trained)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    whole = get_model_state_dict(trainee, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if ranks.main:  # (the other ranks get nothing: cpu_offload gathers on rank 0)
        student.load_state_dict(whole)
