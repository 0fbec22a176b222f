"""Distillation: tune a converted (parallel-form) model towards the original's next-token distributions.

The parallel form takes every value at the initial state, which changes the function. Training its
weights to minimise KL(original || converted) on sample text wins most of that back; `hard_weight`
mixes in the plain next-token loss on the text (soft and hard targets, as in Hinton et al. 2015).
Runs on the GPU when there is one, else on the CPU.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from edgettt import distributed
from edgettt.checkpoint import model_fingerprint
from edgettt.cuda_graph import graphed
from edgettt.distributed import SINGLE, Ranks
from edgettt.evaluation import encode
from edgettt.fast_paths import use_kernels
from edgettt.families.base import LanguageModel
from edgettt.progress import bar
from edgettt.resume import Checkpoints


@dataclasses.dataclass(frozen=True)
class DistillSettings:
    """How `distill` tunes, as `edgettt convert --distill SETTINGS` spells it: comma-separated KEY=VALUE,
    e.g. `steps=3000,lr=3e-4,ctx=512/2048,pool=24` (the keys left out keep these defaults)."""

    steps: int = 300  # optimiser steps
    lr: float = 1e-3  # peak learning rate (cosine decay to 0)
    batch: int = 32  # windows a step, of the longest ctx (shorter ones get as many tokens)
    ctx: tuple[int, ...] = ()  # window lengths trained at in turn, `/`-separated (none: the measured context)
    minutes: float | None = None  # also end after this many minutes (the schedule follows the clock)
    hard_weight: float = 0.0  # share of the plain next-token loss on the text (the rest: KL to the original)
    pool: int = 0  # the original's logits of this many batches a length computed first and reused (0: every step)
    shard: bool | None = None  # FSDP2 (with activation checkpointing), or data parallel; None: by size (`fits`)
    save_every: int = 0  # a checkpoint (OUT.distill/) every this many steps, for resume (0: none)
    resume: bool = False  # continue from OUT.distill/'s newest checkpoint

    def __post_init__(self):
        checks = {"steps": self.steps >= 1, "lr": math.isfinite(self.lr) and self.lr > 0, "batch": self.batch >= 1,
                  "ctx": all(n >= 1 for n in self.ctx), "minutes": self.minutes is None or
                  (math.isfinite(self.minutes) and self.minutes > 0), "hard_weight": 0 <= self.hard_weight <= 1,
                  "pool": self.pool >= 0, "save_every": self.save_every >= 0}
        for key, ok in checks.items():
            if not ok:
                value = getattr(self, key)
                value = "/".join(map(str, value)) if key == "ctx" else value
                raise ValueError(f"{key}={value} is out of range (steps, batch, ctx >= 1; lr, minutes "
                                 "> 0; hard_weight in [0, 1]; pool, save_every >= 0)")

    @classmethod
    def parse(cls, spec: str) -> "DistillSettings":
        """From `steps=300,lr=1e-3,ctx=512/2048`; a ValueError names the part it cannot read."""
        kinds = {"steps": int, "lr": float, "batch": int, "minutes": float, "hard_weight": float, "pool": int,
                 "shard": _switch, "save_every": int, "resume": _switch}
        values = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, eq, raw = part.partition("=")
            key = key.strip().replace("-", "_")
            if not eq or key not in (*kinds, "ctx"):
                raise ValueError(f"{part!r} is not KEY=VALUE with KEY one of {', '.join((*kinds, 'ctx'))}")
            try:
                values[key] = (tuple(int(n) for n in raw.split("/")) if key == "ctx" else kinds[key](raw))
            except ValueError:
                expected = "0 or 1" if kinds.get(key) is _switch else "a number"
                raise ValueError(f"{part!r}: {raw!r} is not {expected}") from None
        return cls(**values)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "ctx": list(self.ctx)}


def _switch(raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError(raw)
    return raw == "1"


def kl_loss(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(teacher || student)."""
    t = torch.log_softmax(teacher_logits.float(), dim=-1)
    s = torch.log_softmax(student_logits.float(), dim=-1)
    return (t.exp() * (t - s)).sum(-1).mean()


def next_token_loss(student_logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each position's logits against the window's next token (the last
    position has none)."""
    logits = student_logits[:, :-1].float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def window_plan(ctx: int | list[int], batch: int, available: int) -> list[tuple[int, int]]:
    """(window length, windows) of each step in turn: one length, or several drawn in turn (mixed
    lengths, so that one model fits every context it is trained at), each with as many tokens a step
    as `batch` windows of the longest (at least one window). Lengths are cut to the text."""
    lengths = sorted({min(n, available - 1) for n in (ctx if isinstance(ctx, (list, tuple)) else [ctx])})
    longest = lengths[-1]
    return [(n, max(1, batch * longest // n)) for n in lengths]


def draw_windows(data: torch.Tensor, length: int, windows: int, gen: torch.Generator, device,
                 part: slice = slice(None)) -> torch.Tensor:
    """`windows` random windows of `length` tokens of `data`, [windows, length] on `device`; of them only `part`
    (a rank's share: every rank draws the same starts, so the job's batch is one process's)."""
    starts = torch.randint(0, data.numel() - length, (windows,), generator=gen).tolist()[part]
    return torch.stack([data[s:s + length] for s in starts]).to(device)


def teacher_forward(teacher: LanguageModel, device, graphs: bool = True) -> Callable[[torch.Tensor], torch.Tensor]:
    """The teacher's logits of a batch of windows, without gradients. On a GPU (and `graphs`) each batch shape's
    forward is recorded once as a CUDA graph (`cuda_graph.graphed`) and replayed: the original TTT-MLP's mini-batch
    loop is thousands of small kernels, bound by their launches. The logits are overwritten by the next call of
    that shape (clone what you keep). A shape whose capture fails runs eagerly, with a line saying so."""
    def eager(ids: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return teacher(ids)

    if torch.device(device).type != "cuda" or not graphs:
        return eager
    by_shape = {}

    def forward(ids: torch.Tensor) -> torch.Tensor:
        if ids.shape not in by_shape:
            try:
                by_shape[ids.shape] = graphed(eager, ids)
            except Exception as exc:  # a teacher that cannot be captured: the same logits, slower
                print(f"teacher forward at {tuple(ids.shape)} not captured as a CUDA graph ({exc!r}); eager",
                      file=sys.stderr, flush=True)
                by_shape[ids.shape] = eager
        return by_shape[ids.shape](ids)
    return forward


def teacher_pool(forward, data: torch.Tensor, plan: list[tuple[int, int]], pool: int, gen: torch.Generator,
                 device, ranks: Ranks = SINGLE) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """For each (length, windows) of the plan, `pool` batches of windows (this rank's share) with the teacher's
    logits (`forward`; bfloat16, on the device): the teacher runs once a batch, and the students' steps reuse them
    in turn. A slow teacher (TTT-MLP's mini-batch loop in torch: 168 distillation steps in 6.3 minutes on the
    H200 where TTT-Linear's kernel made 5,327, benchmarks/results/mixed_distill_gpu.md) then costs `pool`
    forwards a length instead of one a step."""
    batches = [[] for _ in plan]
    progress = bar(total=pool * len(plan), desc="teacher", unit="batch")
    for _ in range(pool):
        for kept, (length, windows) in zip(batches, plan):
            ids = draw_windows(data, length, windows, gen, device, ranks.share(windows, "distill batch"))
            kept.append((ids, forward(ids).to(torch.bfloat16)))
            progress.update()
    progress.close()
    return batches


def distill(teacher: LanguageModel, student: LanguageModel, tokens: list[int], steps: int = 300, batch: int = 32,
            ctx: int | list[int] = 512, lr: float = 1e-3, seed: int = 0, device: str | None = None,
            hard_weight: float = 0.0, minutes: float | None = None, pool: int = 0, ranks: Ranks = SINGLE,
            shard: bool = False, checkpoints: Checkpoints | None = None, resume: bool = False) -> list[float]:
    """Tune `student` in place; returns the loss of every step, (1 - hard_weight) * KL + hard_weight *
    next-token loss. Batches are random windows of `tokens`, as long as the context the model is
    measured at: the parallel form drifts more with position, so training on shorter windows leaves
    the late positions untuned; a list of lengths trains at each in turn (`window_plan`). With
    `minutes`, the run also ends when that time is up: the cosine schedule follows whichever of steps
    and time is further along, so a cut run still ends cooled. With `pool`, the teacher's logits of
    `pool` batches a length are computed first (`teacher_pool`, not counted in `minutes`) and the
    steps take them in turn, each batch once every `pool` steps of its length.

    Over several processes (`ranks`, torchrun): each rank takes its share of every step's windows and computes
    the teacher's logits of them itself; the gradients are averaged (data parallel, or FSDP2 with `shard`:
    `distributed.trainee`), so the job trains as one process would on the whole batch. `checkpoints`: saved every
    K steps; `resume` continues from the newest. The student is written back whole on rank 0."""
    device = device or ranks.device()
    data = torch.tensor(tokens, dtype=torch.int64)
    plan = window_plan(ctx, batch, data.numel())
    parts = [ranks.share(windows, "distill batch") for _, windows in plan]  # (refused before any work)
    gen = torch.Generator().manual_seed(seed)
    # sharded: a copy (the caller's teacher stays whole: convert measures with it after)
    teacher = distributed.shard(copy.deepcopy(teacher), ranks, device, checkpointing=False) if shard else teacher
    teacher.to(device).eval()
    if torch.device(device).type == "cuda":  # the original TTT-Linear teacher through its exact-form kernel
        use_kernels(teacher)
    forward = teacher_forward(teacher, device, graphs=not shard)  # (a CUDA graph holds no collective)
    trainee = distributed.trainee(student, device, ranks, shard)
    opt = torch.optim.AdamW(trainee.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    first, losses = checkpoints.load(trainee, opt, gen) if resume else (0, [])
    # a pool is drawn from the seed, first: resumed, the same pool again
    pools = teacher_pool(forward, data, plan, pool, torch.Generator().manual_seed(seed) if resume else gen, device,
                         ranks) if pool else None
    clock = Clock(minutes, ranks)
    progress = bar(range(first, steps), desc="distill", unit="step")
    for step in progress:
        done = step / steps
        if minutes:
            done = max(done, clock.fraction())
            if done >= 1:
                break
        for group in opt.param_groups:  # cosine decay
            group["lr"] = lr * 0.5 * (1 + math.cos(math.pi * done))
        if pools:
            ids, target = pools[step % len(plan)][step // len(plan) % pool]
        else:
            (length, windows), part = plan[step % len(plan)], parts[step % len(plan)]
            ids = draw_windows(data, length, windows, gen, device, part)
            target = forward(ids)  # (overwritten by the next step's: used before it)
        logits = trainee(ids)
        loss = kl_loss(target, logits)
        if hard_weight:
            loss = (1 - hard_weight) * loss + hard_weight * next_token_loss(logits, ids)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainee.parameters(), 1.0)
        opt.step()
        losses.append(distributed.mean(loss.detach(), ranks).item())
        progress.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)
        if checkpoints is not None and checkpoints.due(step + 1):
            checkpoints.save(step + 1, trainee, opt, gen, losses)
    progress.close()
    distributed.write_back(trainee, student, ranks)
    student.eval()
    return losses


class Clock:
    """The share of `minutes` gone, the same on every rank (their mean): ranks that stopped at different steps
    would wait on each other's collectives."""

    def __init__(self, minutes: float | None, ranks: Ranks):
        self.minutes, self.ranks, self.t0 = minutes, ranks, time.monotonic()

    def fraction(self) -> float:
        gone = torch.tensor((time.monotonic() - self.t0) / (60 * self.minutes), dtype=torch.float64)
        return distributed.mean(gone, self.ranks).item()


def distill_towards(teacher: LanguageModel, student: LanguageModel, text, settings: DistillSettings,
                    ctx: int, source: str = "model", ranks: Ranks = SINGLE, checkpoints: Path | None = None) -> dict:
    """`convert --distill`: tune `student` towards `teacher` (read from `source`) on `text` (an `edgettt.data.Text`)
    with `settings`, at their window lengths (`ctx` where they give none). Records in the student's config the
    longest length it was tuned at (kept by quantize and export), and returns what convert_report.json keeps of
    the run. `checkpoints`: the folder its checkpoints go to (`settings.save_every`) and `settings.resume` reads."""
    lengths = list(settings.ctx) or [ctx]
    saving = None
    if checkpoints is not None and (settings.save_every or settings.resume):
        saving = Checkpoints(Path(checkpoints), settings.save_every,
                             run_identity(teacher, student, text, settings, ctx), ranks)
        if settings.resume:
            saving.check()  # (before any work)
    shard = settings.shard
    if shard is None:  # FSDP2 where data parallel would not fit the GPU
        shard = not distributed.fits(teacher, student, ranks.device())
    losses = distill(teacher, student, encode(teacher, text, source), steps=settings.steps, lr=settings.lr,
                     ctx=lengths, batch=settings.batch, hard_weight=settings.hard_weight, minutes=settings.minutes,
                     pool=settings.pool, ranks=ranks, shard=shard, checkpoints=saving,
                     resume=settings.resume)
    student.config.extra["distilled_ctx"] = max(lengths)
    return {"train_text": text.fingerprint(), "steps_asked": settings.steps, "minutes": settings.minutes,
            "steps": len(losses),  # fewer than asked when minutes ended it
            "lr": settings.lr, "ctx": lengths if len(lengths) > 1 else lengths[0], "batch": settings.batch,
            "hard_weight": settings.hard_weight, "pool": settings.pool, "processes": ranks.world,
            "shard": shard, "loss_first": losses[0], "loss_last": losses[-1], "losses": losses}


def run_identity(teacher: LanguageModel, student: LanguageModel, text, settings: DistillSettings, ctx: int) -> dict:
    """What a checkpoint must have been made by to be resumed: the teacher, the student's form and tensors, the
    text, the settings that fix the steps' batches and rates (not `save_every`, `minutes`, `shard`, `resume` or the
    world size: a run may change them)."""
    fixed = {k: v for k, v in settings.to_dict().items() if k not in ("save_every", "minutes", "shard", "resume")}
    shapes = json.dumps(sorted((k, list(t.shape)) for k, t in student.weights().items()))
    shapes_digest = hashlib.sha256(shapes.encode()).hexdigest()[:16]
    return {"teacher": model_fingerprint(teacher), "student": f"{student.form}:{shapes_digest}",
            "text": text.fingerprint()["sha256"], "ctx": ctx, "settings": fixed}
