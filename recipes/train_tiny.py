"""Recipe that trains the shipped tiny models (and the transformer baseline they are compared with).

    python recipes/train_tiny.py --arch ttt-linear --out /tmp/s1 --hidden 256 --layers 5 --dropout 0.1 \
        --store bfloat16 --steps 2349 --minutes 600 --lr 3e-3 --eval-every 500
    python recipes/train_tiny.py --arch ttt-linear --out /tmp/s2 --init /tmp/s1 ...     # the next schedule
    python recipes/train_tiny.py --arch lact --out /tmp/lact-tiny --minutes 4 --eval-every 500

(`recipes/train_all.sh` runs every schedule of every shipped model and the distillations, as they were made;
`DRY=1 bash recipes/train_all.sh` prints the commands.)

Data (byte level, no download): `python-stdlib` plus `python-docs:train` for training, bits per
byte reported on `python-docs:test` (and `:val`). `--data-dir` reads the parts from files written by
`--write-data` instead, so that a GPU machine with another Python version trains on exactly the
same text. One schedule for every arch: AdamW, linear warm-up, cosine decay over a wall-clock
budget, batch 256 x 512 bytes (the TTT step is launch-bound: a larger batch costs little time per
step), fp32 with TF32 matmuls. The docs' train part is small (373 KB) and over-fits within minutes
(recipes/results/README.md): the validation bits per byte are measured every `--eval-every` steps
and the best weights are kept (early stopping on val; the test part stays unseen).

`--pause-after SECONDS` stops a schedule at a step and writes `OUT.resume/` (weights, AdamW's moments, the data
stream's position, the best weights so far, the log: safetensors and JSON, each file under 16 MB at the shipped
sizes); the same command with `--resume` goes on from there, so a schedule longer than one machine lease trains
in pieces with the same steps, data and learning rates (the dropout masks after the pause are drawn afresh).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import shutil
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from edgettt.checkpoint import save_model
from edgettt.outputs import Output
from edgettt.families.ttt.config import ModelConfig
from edgettt.cuda_graph import graphed
from edgettt.data import builtin_text
from edgettt.families.ttt.random_init import random_model

ARCHS = {
    # ~1.9M parameters each: at most 8 MB on disk in fp32
    "ttt-linear": dict(ttt_layer_type="linear", hidden_size=192, intermediate_size=512, num_attention_heads=4),
    "ttt-mlp": dict(ttt_layer_type="mlp", hidden_size=192, intermediate_size=384, num_attention_heads=4,
                    share_qk=True, pre_conv=True, use_gate=True),
    "transformer": dict(hidden_size=192, intermediate_size=512, num_attention_heads=4),
}
# LaCT at the same size (~1.9M parameters): window attention and fast weights in each of 4 layers; the
# public 760M's chunk and window of 2048 over 32k-token texts scaled to 64 over the 512-byte windows
# (8 chunks a window, as 16 in 32k); lact-w1 is the paper's variant: only W1 learns, no weight norm.
# ttt_nope: no rotary on the fast weights' q, k (the public code's option): with it, the models hold at
# 2048 and 8192 bytes (rotated by absolute positions they never saw, they fell to 4.2-4.3 bits per byte
# at 8192) and score better at 512 too (recipes/results/README.md)
LACT = dict(hidden_size=192, num_attn_heads=4, num_lact_heads=2, intermediate_size=448, lact_chunk_size=64,
            window_size=64, tie_word_embeddings=True, vocab_size=256, ttt_nope=True)
LACT_ARCHS = {"lact": LACT, "lact-w1": dict(LACT, lact_update_w0_w2=False, lact_weight_norm=False)}
# Gated DeltaNet trained as ttt-linear-tiny (train_all.sh: the same sizes, schedules and dropout): at hidden 256, 2
# heads of 64 with fla's expand_v 2 hold the same state as TTT-Linear's 4 heads of 64 (16,384 numbers a layer) and,
# with the same MLP, 3,361,172 parameters to ttt-linear-tiny's 3,438,692 (-2.3%)
DELTANET_ARCHS = {"gated-deltanet": dict(hidden_size=192, num_heads=2, head_dim=64, expand_v=2, intermediate_size=512,
                                         vocab_size=256, tie_word_embeddings=True)}
PARTS = {"train": None, "docs_train": "python-docs:train", "val": "python-docs:val", "test": "python-docs:test"}


def load_parts(data_dir: Path | None) -> dict[str, bytes]:
    if data_dir is not None:
        return {part: (data_dir / f"{part}.bin").read_bytes() for part in PARTS}
    parts = {part: builtin_text(name) for part, name in PARTS.items() if name}
    parts["train"] = builtin_text("python-stdlib") + b"\n" + builtin_text("python-docs:train")
    return parts


class Transformer(nn.Module):
    """Baseline: pre-RMSNorm causal transformer, rotary positions, SwiGLU, tied embeddings."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.c = c
        C = c.hidden_size
        self.embed = nn.Embedding(c.vocab_size, C)
        self.blocks = nn.ModuleList()
        for _ in range(c.num_hidden_layers):
            block = nn.Module()
            block.norm1, block.norm2 = nn.RMSNorm(C, eps=1e-6), nn.RMSNorm(C, eps=1e-6)
            block.qkv, block.o = nn.Linear(C, 3 * C, bias=False), nn.Linear(C, C, bias=False)
            block.gate = nn.Linear(C, c.intermediate_size, bias=False)
            block.up = nn.Linear(C, c.intermediate_size, bias=False)
            block.down = nn.Linear(c.intermediate_size, C, bias=False)
            self.blocks.append(block)
        self.norm = nn.RMSNorm(C, eps=1e-6)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02 if "embed" in name else 1 / math.sqrt(p.shape[1]))

    def forward(self, ids):
        from edgettt.ops import rotary

        B, T = ids.shape
        H = self.c.num_attention_heads
        h = self.embed(ids)
        pos = torch.arange(T, device=ids.device)
        for blk in self.blocks:
            q, k, v = blk.qkv(blk.norm1(h)).view(B, T, 3, H, -1).permute(2, 0, 3, 1, 4)
            q, k = rotary(q, pos, 10000.0), rotary(k, pos, 10000.0)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + blk.o(att.transpose(1, 2).reshape(B, T, -1))
            x = blk.norm2(h)
            h = h + blk.down(F.silu(blk.gate(x)) * blk.up(x))
        return self.norm(h) @ self.embed.weight.T


def build(arch: str, layers: int, seed: int, sizes: dict | None = None):
    """The model of an arch, its sizes optionally replaced (`sizes`: hidden_size, intermediate_size)."""
    sizes = sizes or {}
    if arch in LACT_ARCHS:
        from edgettt.families.lact.config import LaCTConfig
        from edgettt.families.lact.model import LaCTForCausalLM, initialise

        config = LaCTConfig(num_hidden_layers=layers, **{**LACT_ARCHS[arch], **sizes})
        from edgettt.tokenizer import ByteTokenizer

        model = initialise(LaCTForCausalLM(config), seed)
        model.tokenizer = ByteTokenizer()
        return model, config
    if arch in DELTANET_ARCHS:
        from edgettt.families.deltanet.random_init import new_config, random_model as random_deltanet

        config = new_config(arch, {**DELTANET_ARCHS[arch], "num_hidden_layers": layers, **sizes})
        return random_deltanet(config, seed), config
    config = ModelConfig(vocab_size=256, num_hidden_layers=layers, **{**ARCHS[arch], **sizes})
    if arch == "transformer":
        torch.manual_seed(seed)
        return Transformer(config), config
    return random_model(config, seed), config


def load_init(directory: Path, arch: str, model: nn.Module, config) -> nn.Module:
    """The weights a run continues from (--init): a saved TTT or LaCT model, or the baseline transformer's
    weights file (its sizes must be this run's: load_state_dict refuses others), in float32 whatever they
    were stored in."""
    if arch == "transformer":
        from safetensors.torch import load_file

        weights = load_file(directory / "transformer.safetensors")
        model.load_state_dict({k: v.float() for k, v in weights.items()})
        return model
    from edgettt.checkpoint import load_model

    model = load_model(directory)
    assert model.config.to_dict() == config.to_dict(), f"{directory} is not a {arch} model of these sizes"
    return model


# the modules whose outputs are added to the residual stream (and the embedding that starts it): edgettt's
# TTT blocks, fla's blocks (Gated DeltaNet: embeddings, attn, mlp) and the baseline transformer's; --dropout drops
# their outputs while training
RESIDUAL_WRITERS = {"embed_tokens", "conv", "seq_modeling_block", "mlp", "embed", "o", "down", "embeddings", "attn"}


def add_dropout(model: nn.Module, p: float) -> int:
    """Dropout with rate p on every residual writer's output in training mode (nanoGPT's places: the
    embedding and each branch's output), as forward hooks, so that the saved model has no trace of it.
    Returns the number of modules hooked."""
    def is_writer(name: str) -> bool:  # a writer's own submodules (PreConv's conv) are not
        parts = name.split(".")
        return parts[-1] in RESIDUAL_WRITERS and (len(parts) < 2 or parts[-2] not in RESIDUAL_WRITERS)

    writers = [m for name, m in model.named_modules() if is_writer(name)]
    for module in writers:
        module.register_forward_hook(lambda mod, args, out: F.dropout(out, p, mod.training))
    return len(writers)


def batches(sources: list[tuple[torch.Tensor, float]], batch: int, ctx: int, gen: torch.Generator):
    """Random windows of ctx+1 bytes; each window's source is drawn with the given weights."""
    weights = torch.tensor([w for _, w in sources])
    while True:
        picks = torch.multinomial(weights, batch, replacement=True, generator=gen).tolist()
        rows = []
        for i in picks:
            data = sources[i][0]
            s = torch.randint(0, data.numel() - ctx - 1, (1,), generator=gen).item()
            rows.append(data[s:s + ctx + 1])
        yield torch.stack(rows)


EVAL_CTX = 512


class BestWeights:
    """Early stopping on val: remembers the weights of the best score offered, and puts them back
    at the end when they beat the last ones (the test part is never looked at)."""

    def __init__(self):
        self.val, self.step, self.weights = math.inf, 0, None

    def offer(self, model: nn.Module, val: float, step: int) -> None:
        if val < self.val:
            self.val, self.step = val, step
            self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}

    def restore(self, model: nn.Module, last_val: float, last_step: int) -> tuple[float, int]:
        """Load the best weights if they beat the last ones; returns the kept (val, step)."""
        if self.val < last_val:
            model.load_state_dict(self.weights)  # copies into the same tensors (a captured graph stays valid)
            return self.val, self.step
        return last_val, last_step


@torch.no_grad()
def bits_per_byte(model, data: bytes, ctx: int, device, batch: int = 16) -> float:
    """Non-overlapping windows of ctx+1 bytes; every byte after a window's first is predicted."""
    ids = torch.tensor(list(data), dtype=torch.int64)
    n = (ids.numel() - 1) // ctx
    windows = torch.stack([ids[i * ctx:i * ctx + ctx + 1] for i in range(n)])
    total, count = 0.0, 0
    model.eval()
    for i in range(0, n, batch):
        w = windows[i:i + batch].to(device)
        logits = model(w[:, :-1]).float()
        total += F.cross_entropy(logits.reshape(-1, 256), w[:, 1:].reshape(-1), reduction="sum").item()
        count += w[:, 1:].numel()
    model.train()
    return total / count / math.log(2)


def resume_folder(out: Path) -> Path:
    """Where a paused schedule waits: beside OUT (OUT itself is written whole at the end)."""
    return out.with_name(out.name + ".resume")


PAUSED = 75  # the exit status of a paused schedule (EX_TEMPFAIL)


def save_resume(out: Path, model, opt, gen: torch.Generator, best: BestWeights, progress: dict) -> None:
    """Writes OUT.resume/ whole or not at all, over an older pause (`outputs.Output`: staged, then renamed)."""
    with Output.plan(resume_folder(out), "resume", force=True).write() as folder:
        write_resume(folder, model, opt, gen, best, progress)


def write_resume(folder: Path, model, opt, gen: torch.Generator, best: BestWeights, progress: dict) -> None:
    """A paused schedule's state: the weights, AdamW's moments and step count, the data stream's generator,
    the best weights so far (unless they are the current ones) and the step, time and log in JSON."""
    from safetensors.torch import save_file

    cpu = lambda t: t.detach().float().cpu().clone()  # noqa: E731  (a clone: tied weights are saved apart)
    params = list(model.parameters())
    save_file({k: cpu(v) for k, v in model.state_dict().items()}, folder / "model.safetensors")
    for moment in ("exp_avg", "exp_avg_sq"):
        save_file({str(i): cpu(opt.state[p][moment]) for i, p in enumerate(params)}, folder / f"{moment}.safetensors")
    save_file({"generator": gen.get_state(), "adam_step": cpu(opt.state[params[0]]["step"]).reshape(1)},
              folder / "position.safetensors")
    if best.weights is not None and best.step != progress["step"]:
        save_file({k: cpu(v) for k, v in best.weights.items()}, folder / "best.safetensors")
    progress = {**progress, "best_val": best.val, "best_step": best.step}
    (folder / "progress.json").write_text(json.dumps(progress, indent=1) + "\n")


@torch.no_grad()
def load_resume(out: Path, model, opt, gen: torch.Generator, best: BestWeights) -> dict:
    """Puts a paused schedule's state back into the same tensors (a captured CUDA graph stays valid)."""
    from safetensors.torch import load_file

    folder = resume_folder(out)
    model.load_state_dict(load_file(folder / "model.safetensors"))
    params = list(model.parameters())
    position = load_file(folder / "position.safetensors")
    for p in params:  # AdamW makes its state at the first step: without a captured step it is not there yet
        if not opt.state[p]:
            step_device = p.device if opt.defaults["capturable"] else "cpu"
            opt.state[p].update(step=torch.zeros((), device=step_device), exp_avg=torch.zeros_like(p),
                                exp_avg_sq=torch.zeros_like(p))
    for moment in ("exp_avg", "exp_avg_sq"):
        for i, value in load_file(folder / f"{moment}.safetensors").items():
            opt.state[params[int(i)]][moment].copy_(value)
    for p in params:
        opt.state[p]["step"].copy_(position["adam_step"].reshape(()))
    gen.set_state(position["generator"])
    progress = json.loads((folder / "progress.json").read_text())
    best.val, best.step = progress["best_val"], progress["best_step"]
    if (folder / "best.safetensors").exists():
        best.weights = {k: v.to(model.state_dict()[k]) for k, v in load_file(folder / "best.safetensors").items()}
    elif best.step:
        best.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return progress


def make_step(model, opt, example: torch.Tensor, graph: bool):
    """One training step as a function of the batch. On CUDA the whole step (forward, backward,
    clipping, AdamW) is captured once as a CUDA graph: the TTT layers' per-mini-batch loop is
    thousands of small kernels, and replaying them as a graph removes the launch overhead."""

    def eager(batch):
        logits = model(batch[:, :-1]).float()
        loss = F.cross_entropy(logits.reshape(-1, 256), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=False)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        return loss.detach()

    if not graph:
        return eager
    try:  # (its warm-up calls are training steps too, on the example batch)
        replay = graphed(eager, example)
    except Exception as exc:  # any capture problem: train eagerly, slower but the same
        print(f"CUDA graph capture failed ({exc!r}); training eagerly", flush=True)
        return eager
    print("training step captured as a CUDA graph", flush=True)
    return replay


def main(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=[*ARCHS, *LACT_ARCHS, *DELTANET_ARCHS], required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--minutes", type=float, default=6.0)
    ap.add_argument("--steps", type=int, default=None,
                    help="Also end after this many steps; the schedule follows whichever of steps and time is "
                         "further along (tests give a step budget: no run may depend on the machine's speed).")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=None, help="Hidden size in place of the arch's (192).")
    ap.add_argument("--intermediate", type=int, default=None, help="MLP size in place of the arch's.")
    ap.add_argument("--store", choices=["float32", "bfloat16"], default="float32",
                    help="Precision of the saved matrices (bfloat16: half the file; vectors stay float32; edgettt "
                         "loads it as float32, exactly).")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="Dropout on the embedding and each residual branch's output while training (TTT, Gated "
                         "DeltaNet and transformer archs): the docs over-fit, more so at larger sizes.")
    ap.add_argument("--docs-weight", type=float, default=0.0,
                    help="Share of windows drawn from python-docs:train alone (0: uniform over all text).")
    ap.add_argument("--init", type=Path, default=None,
                    help="Continue from this run's output (same arch and sizes) instead of a random model: a "
                         "second, shorter schedule (warm-up and cosine again) at --lr.")
    ap.add_argument("--eager", action="store_true", help="Do not capture the step as a CUDA graph.")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the TTT mini-batch steps or the delta rule's chunked form (TTT-MLP: 1.5x a step on a CPU, benchmarks/results/"
                         "train_step_cpu.md; 1.8x on an H200 inside the CUDA graph, 232 ms instead of 420, "
                         "recipes/results/README.md).")
    ap.add_argument("--eval-every", type=int, default=500,
                    help="Measure the validation bits per byte every this many steps (its time is not counted) and keep the weights that scored best: the docs are small and over-fit.")
    ap.add_argument("--pause-after", type=float, default=None,
                    help="Stop after this many seconds of the process and write OUT.resume/ to go on from.")
    ap.add_argument("--resume", action="store_true", help="Go on from OUT.resume/ (written by --pause-after).")
    ap.add_argument("--data-dir", type=Path, default=None)
    ap.add_argument("--write-data", type=Path, default=None, help="Write the three parts as files and exit.")
    args = ap.parse_args(argv)
    started = time.time()
    if args.resume and not (resume_folder(args.out) / "progress.json").exists():
        ap.error(f"--resume: {resume_folder(args.out)} holds no paused schedule; run without --resume")
    if args.resume and (paused := json.loads((resume_folder(args.out) / "progress.json").read_text()))["arch"] != args.arch:
        ap.error(f"--resume: {resume_folder(args.out)} paused a {paused['arch']} schedule, not {args.arch}; "
                 "resume with its own command")
    if args.dropout and args.arch in LACT_ARCHS:
        ap.error(f"--dropout: TTT, Gated DeltaNet and transformer archs only, not {args.arch}")

    parts = load_parts(args.data_dir)
    if args.write_data:
        args.write_data.mkdir(parents=True, exist_ok=True)
        for part, data in parts.items():
            (args.write_data / f"{part}.bin").write_bytes(data)
        return
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    if args.compile and args.arch in DELTANET_ARCHS:
        from edgettt.families.deltanet.kernels import compile_training_chunk

        compile_training_chunk()
    elif args.compile:
        from edgettt.families.ttt.kernels import compile_ttt_steps

        compile_ttt_steps()
    sizes = {k: v for k, v in (("hidden_size", args.hidden), ("intermediate_size", args.intermediate)) if v}
    model, config = build(args.arch, args.layers, args.seed, sizes)
    previous = None  # the schedule this one continues (its train_log.json)
    if args.init is not None and not args.resume:
        model = load_init(args.init, args.arch, model, config)
        previous = json.loads((args.init / "train_log.json").read_text())
    model.to(device).train()
    if device == "cuda":  # TTT-Linear trains through its exact-form kernel (it has a backward); Gated DeltaNet's
        # chunked form through plain torch (`ops.delta_rule.fla_kernels` says why not fla's)
        from edgettt.fast_paths import use_kernels

        use_kernels(model)
    if args.dropout:
        print(f"dropout {args.dropout} on {add_dropout(model, args.dropout)} modules", flush=True)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=torch.tensor(args.lr, device=device), betas=(0.9, 0.95),
                            weight_decay=0.1, capturable=device == "cuda")
    as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
    sources = [(as_tensor(parts["train"]), 1 - args.docs_weight)]
    if args.docs_weight > 0:  # the held-out parts are docs: let the docs' own train part weigh more
        sources.append((as_tensor(parts["docs_train"]), args.docs_weight))
    gen = torch.Generator().manual_seed(args.seed)
    stream = batches(sources, args.batch, args.ctx, gen)
    step_fn = make_step(model, opt, next(stream).to(device).long(), graph=device == "cuda" and not args.eager)
    budget, warmup, step, t0, log = args.minutes * 60, 0.03, 0, time.time(), []
    best = BestWeights()
    if args.resume:
        progress = load_resume(args.out, model, opt, gen, best)
        step, t0, log, previous = progress["step"], t0 - progress["elapsed"], progress["log"], progress["previous"]
        print(f"resumed at step {step}", flush=True)
    while (elapsed := time.time() - t0) < budget and (args.steps is None or step < args.steps):
        frac = max(elapsed / budget, step / args.steps if args.steps else 0.0)
        lr = args.lr * (frac / warmup if frac < warmup else 0.5 * (1 + math.cos(math.pi * (frac - warmup) / (1 - warmup))))
        opt.param_groups[0]["lr"].fill_(lr)
        loss = step_fn(next(stream).to(device, non_blocking=True).long())
        step += 1
        evaluate = args.eval_every and step % args.eval_every == 0
        if step % 100 == 0 or evaluate:
            log.append({"step": step, "seconds": round(elapsed, 1), "loss": loss.item(), "lr": lr})
            if evaluate:
                paused = time.time()
                val = log[-1]["val_bits_per_byte"] = bits_per_byte(model, parts["val"], EVAL_CTX, device)
                best.offer(model, val, step)
                t0 += time.time() - paused
            print(f"{args.arch} step {step} {elapsed:.0f}s loss {loss.item():.4f}"
                  + (f" val {log[-1]['val_bits_per_byte']:.4f}" if "val_bits_per_byte" in log[-1] else ""), flush=True)
        if args.pause_after is not None and time.time() - started > args.pause_after and step < (args.steps or 0):
            progress = {"step": step, "elapsed": time.time() - t0, "log": log, "arch": args.arch, "previous": previous}
            save_resume(args.out, model, opt, gen, best, progress)
            print(f"paused at step {step}: go on with the same command and --resume", flush=True)
            raise SystemExit(PAUSED)
    wall = time.time() - t0
    last_val = bits_per_byte(model, parts["val"], EVAL_CTX, device)
    kept_val, kept_step = best.restore(model, last_val, step)
    result = {
        "arch": args.arch, "parameters": n_params, "steps": step, "wall_seconds": round(wall, 1),
        "tokens_seen": step * args.batch * args.ctx, "batch": args.batch, "ctx": args.ctx, "lr": args.lr,
        "docs_weight": args.docs_weight, "dropout": args.dropout, "compiled": args.compile,
        "continued_from": None if previous is None else {k: v for k, v in previous.items() if k != "log"},
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor(),
        "torch": torch.__version__, "data_bytes": {k: len(v) for k, v in parts.items()},
        "eval_ctx": EVAL_CTX,  # the model cards' convention, whatever the training window
        "last_step_val_bits_per_byte": last_val,
        "kept_step": kept_step,
        "val_bits_per_byte": kept_val,
        "test_bits_per_byte": bits_per_byte(model, parts["test"], EVAL_CTX, device),
        "log": log,
    }
    print(json.dumps({k: v for k, v in result.items() if k != "log"}), flush=True)
    if args.arch == "transformer":  # not an edgettt model: its weights alone, to measure it again later
        from safetensors.torch import save_file

        from edgettt.checkpoint import stored_matrices

        args.out.mkdir(parents=True, exist_ok=True)
        store = getattr(torch, args.store)
        save_file({k: stored_matrices(v.contiguous().cpu(), store) for k, v in model.state_dict().items()},
                  args.out / "transformer.safetensors")
    else:
        save_model(model.cpu().eval(), args.out, force=True, store=getattr(torch, args.store))
    (args.out / "train_log.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.resume:
        shutil.rmtree(resume_folder(args.out))


if __name__ == "__main__":
    main()
