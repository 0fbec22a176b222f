"""A distillation's checkpoints, for `convert --distill ...,resume=1`: every `save_every` steps the student, the
optimizer, the step and the window generator, written with torch.distributed.checkpoint (every rank its own
shards; read back on any number of ranks, resharded).

    OUT.distill/step-000200/   DCP's files and checkpoint.json (what run it belongs to, at which step)

A checkpoint is staged under a random name and renamed when complete; the previous one is removed after. DCP's
index file (`.metadata`) is a pickle: it is read here with an unpickler that builds DCP's own metadata classes
and nothing else, and the tensors with `torch.load(weights_only=True)`, so a resumed folder runs no code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from edgettt.distributed import Ranks, barrier, random_suffix
from edgettt.errors import EdgetttError

CHECKPOINT_FORMAT = 1
MANIFEST = "checkpoint.json"


def checkpoint_folder(out: Path) -> Path:
    """Where a distillation into the model directory `out` keeps its checkpoints: OUT.distill/, beside it."""
    return out.with_name(out.name + ".distill")


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's metadata classes, torch's sizes and dtypes; anything else is refused."""

    ALLOWED_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem")
    ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
               ("pathlib", "WindowsPath"), ("collections", "OrderedDict")}

    def find_class(self, module, name):
        dtype = module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                                torch.memory_format))
        if module in self.ALLOWED_MODULES or (module, name) in self.ALLOWED or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not a checkpoint's metadata")


class SafeReader(dcp.FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        path = Path(self.path) / ".metadata"
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError) as exc:
            raise EdgetttError(f"{path}: not a checkpoint's index ({exc}); resume from a checkpoint edgettt wrote, "
                               "or start without resume=1") from None
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's loading, with the checkpoint's non-tensor values (the optimizer's rates and betas) read by
    `torch.load(weights_only=True)`: numbers, strings and containers, never code."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


@dataclasses.dataclass
class Checkpoints:
    """Where a distillation saves (`directory`, every `every` steps) and what a checkpoint must have been made by
    to be resumed (`identity`: the models, the text and the settings that fix the steps; not the world size)."""

    directory: Path
    every: int
    identity: dict
    ranks: Ranks

    def due(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def latest(self) -> Path | None:
        done = sorted(self.directory.glob("step-*")) if self.directory.is_dir() else []
        return done[-1] if done else None

    def check(self) -> tuple[Path, dict]:
        """Before any work: the newest checkpoint, made by this distillation (or a one-line refusal), and its
        checkpoint.json."""
        found = self.latest()
        if found is None:
            raise EdgetttError(f"{self.directory}: no checkpoint to resume from; start without resume=1 (with "
                               "save_every=K in --distill to write them)")
        try:
            meta = json.loads((found / MANIFEST).read_text())
        except (OSError, ValueError):
            raise EdgetttError(f"{found}: no readable {MANIFEST}; not a checkpoint edgettt wrote, start without "
                               "resume=1") from None
        if meta.get("format") != CHECKPOINT_FORMAT:
            raise EdgetttError(f"{found}: checkpoint format {meta.get('format')!r}, this edgettt reads "
                               f"{CHECKPOINT_FORMAT}; start without resume=1")
        differ = sorted(k for k in {*self.identity, *meta.get("identity", {})}
                        if meta.get("identity", {}).get(k) != self.identity.get(k))
        if differ:
            raise EdgetttError(f"{found}: a checkpoint of another distillation ({', '.join(differ)} differ); resume "
                               "with the model, text and --distill settings it was made with, or start without "
                               "resume=1")
        return found, meta

    def save(self, step: int, model, optimizer, generator: torch.Generator, losses: list[float]) -> None:
        """Every rank writes its shards into one staging folder; rank 0 names it and removes the older one."""
        staging = self.directory / f".step-{step:06d}.partial-{random_suffix(self.ranks)}"
        model_state, optim_state = get_state_dict(model, optimizer)
        with one_process_quiet():
            dcp.save({"model": model_state, "optim": optim_state, "run": _run_state(step, generator, losses)},
                     storage_writer=dcp.FileSystemWriter(staging), no_dist=not dist.is_initialized())
        barrier(self.ranks)
        if self.ranks.main:
            (staging / MANIFEST).write_text(json.dumps({"format": CHECKPOINT_FORMAT, "step": step,
                                                         "world": self.ranks.world, "identity": self.identity},
                                                        indent=1) + "\n")
            older = list(self.directory.glob("step-*"))
            target = self.directory / f"step-{step:06d}"
            if target.exists():  # (an earlier run's, replaced with --force)
                older[older.index(target)] = target.rename(staging.with_name(staging.name + ".replaced"))
            staging.rename(target)
            for path in older:
                shutil.rmtree(path, ignore_errors=True)
        barrier(self.ranks)

    def load(self, model, optimizer, generator: torch.Generator) -> tuple[int, list[float]]:
        """The newest checkpoint into `model`, `optimizer` and `generator`; returns (its step, the losses so far)."""
        found, meta = self.check()
        model_state, optim_state = get_state_dict(model, optimizer)
        run = _run_state(0, generator, [0.0] * meta["step"])
        state = {"model": model_state, "optim": optim_state, "run": run}
        with one_process_quiet():
            dcp.load(state, storage_reader=SafeReader(found), planner=SafeLoadPlanner(),
                     no_dist=not dist.is_initialized())
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        generator.set_state(state["run"]["generator"])
        return int(state["run"]["step"].item()), state["run"]["losses"].tolist()


def _run_state(step: int, generator: torch.Generator, losses: list[float]) -> dict:
    return {"step": torch.tensor(step), "generator": generator.get_state(),
            "losses": torch.tensor(losses, dtype=torch.float64)}


@contextlib.contextmanager
def one_process_quiet():
    """DCP's warning that it runs in one process (as asked) kept off the user's terminal."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield
