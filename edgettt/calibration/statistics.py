"""Calibration: statistics on sample text that quantization needs (DESIGN section 5).

- the inputs of every bias-free linear layer, as `H = X^T X / n` (GPTQ's Hessian);
- the accumulated state: per layer, level, head and state row, |S| (the boundary state), |S - S0|
  (its distance from the learned initial state) and |A| (the running sum inside a mini-batch) at
  every position up to the sequence length; kept as row maxima per position bucket (`BUCKETS`), and
  as int8 scales per bucket: `HEADROOM x` the bucket's row maximum of |S - S0| (running maximum over
  the buckets), at most `percentile(|S - S0| row max)`, over 127 (`STATE_CLIP`). The int8 state
  stores S - S0, not S: S0 is a model constant, and the part that moves is several times smaller than S, so the
  rounding step is too. S - S0 grows along the text (about as the square root of the position in
  the exact form of the shipped models, far faster in a parallel form) and the rounding errors of
  all commits add up: per-bucket scales make the early steps finer. LaCT: per layer and fast weight
  that learns (a level), |W - W_init| of the weights kept between chunks, recorded once a token.

The calibration file (safetensors) records the model's and the text's fingerprints; `quantize`
refuses a calibration made for another model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from edgettt import distributed
from edgettt.checkpoint import model_fingerprint
from edgettt.data import Text, token_windows
from edgettt.errors import EdgetttError
from edgettt.evaluation import encode
from edgettt.calibration.gptq import gptq
from edgettt.families.base import LanguageModel
from edgettt.outputs import as_output
from edgettt.progress import bar
from edgettt.weights_io import save_safetensors
from edgettt.formats.state_formats import STATE_CLIP

# position buckets of the int8 state's scales: the count measured best on the shipped models
# (benchmarks/results/state_buckets.md)
BUCKETS = 16
HEADROOM = 1.25  # over the calibration's maxima: a few windows do not see every text's largest state
TENSOR_GROUPS = ("hessian/", "state_scale/", "state_rowmax/")


def _read_metadata(meta: dict, path) -> dict:
    """The calibration file's metadata, each field of its type and range, or a one-line error."""
    def number(key, kind, low):
        try:
            value = kind(meta[key])
        except KeyError:
            raise EdgetttError(f"{path}: metadata has no {key}; not a complete calibration file, make it again "
                               "with `edgettt calibrate`") from None
        except ValueError:
            raise EdgetttError(f"{path}: metadata {key} is {meta[key]!r}, not a number; make the file again with "
                               "`edgettt calibrate`") from None
        if not (value >= low) or value != value or value in (float("inf"),):
            raise EdgetttError(f"{path}: metadata {key} is {value}, out of range; make the file again with "
                               "`edgettt calibrate`")
        return value

    fingerprint = meta.get("model_fingerprint")
    if not isinstance(fingerprint, str) or not fingerprint:
        raise EdgetttError(f"{path}: metadata has no model_fingerprint; the file cannot be tied to a model, make it "
                           "again with `edgettt calibrate`")
    try:
        text = json.loads(meta["text"])
    except (KeyError, ValueError):
        text = None
    if not isinstance(text, dict) or not {"name", "bytes", "sha256"} <= set(text):
        raise EdgetttError(f"{path}: metadata text is missing or malformed; make the file again with "
                           "`edgettt calibrate`")
    return {"model_fingerprint": fingerprint, "text": text, "seq_len": number("seq_len", int, 1),
            "samples": number("samples", int, 1), "seed": number("seed", int, 0),
            "percentile": number("percentile", float, 0)}


@dataclass
class Calibration:
    model_fingerprint: str
    text: dict
    seq_len: int
    samples: int
    seed: int
    percentile: float
    hessians: dict[str, torch.Tensor] = field(default_factory=dict)
    state_scales: dict[str, torch.Tensor] = field(default_factory=dict)  # "layer.level" -> [H, Dk]
    state_rowmax: dict[str, torch.Tensor] = field(default_factory=dict)  # "layer.level.S|dS|A" -> [H, Dk, buckets]

    def save(self, path, force: bool = False) -> None:
        """Write the calibration file atomically; `path` is a path or a planned `outputs.Output`."""
        tensors = {f"hessian/{k}": v for k, v in self.hessians.items()}
        tensors.update({f"state_scale/{k}": v for k, v in self.state_scales.items()})
        tensors.update({f"state_rowmax/{k}": v for k, v in self.state_rowmax.items()})
        meta = {"edgettt_calibration": "1", "model_fingerprint": self.model_fingerprint, "text": json.dumps(self.text),
                "seq_len": str(self.seq_len), "samples": str(self.samples), "seed": str(self.seed),
                "percentile": str(self.percentile)}
        with as_output(path, "calibration", force).write() as tmp:
            save_safetensors(tensors, tmp, metadata=meta)

    @classmethod
    def load(cls, path) -> "Calibration":
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except FileNotFoundError:
            raise EdgetttError(f"{path}: no such file; make one with `edgettt calibrate`") from None
        except (SafetensorError, OSError) as exc:
            raise EdgetttError(f"{path}: not a calibration file ({exc}); make one with `edgettt calibrate`") from None
        if meta.get("edgettt_calibration") != "1":
            raise EdgetttError(f"{path}: not an edgettt calibration file; make one with `edgettt calibrate`")
        fields = _read_metadata(meta, path)
        unknown = sorted(k for k in tensors if not k.startswith(TENSOR_GROUPS))
        if unknown:
            raise EdgetttError(f"{path}: unexpected tensors {', '.join(unknown[:4])}; not a file `edgettt calibrate` wrote")
        part = lambda prefix: {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}  # noqa: E731
        cal = cls(**fields, hessians=part("hessian/"), state_scales=part("state_scale/"),
                  state_rowmax=part("state_rowmax/"))
        cal._check_tables(path)
        return cal

    def _check_tables(self, path) -> None:
        """Every table finite, of the rank it must have; scales positive."""
        def bad(key: str, what: str) -> EdgetttError:
            return EdgetttError(f"{path}: {key} {what}; make the file again with `edgettt calibrate`")

        for group, table, ranks in (("hessian", self.hessians, (2,)), ("state_scale", self.state_scales, (2, 3)),
                                    ("state_rowmax", self.state_rowmax, (3,))):
            for key, t in table.items():
                if t.dim() not in ranks or not t.is_floating_point():
                    raise bad(f"{group}/{key}", f"is {t.dtype} {tuple(t.shape)}, expected a float table of rank "
                                                f"{' or '.join(map(str, ranks))}")
                if t.numel() and not torch.isfinite(t).all():
                    raise bad(f"{group}/{key}", "holds NaN or inf")
                if group == "state_scale" and t.numel() and not (t > 0).all():
                    raise bad(f"{group}/{key}", "holds scales that are not positive")

    def feedback(self, layer: str):
        """GPTQ's error feedback for the linear layer `layer` (`quantize(w, group, feedback)` of its weight format),
        None where there are no statistics of its inputs."""
        hessian = self.hessians.get(layer)
        return None if hessian is None else lambda w, round_column: gptq(w, hessian, round_column)

    def check_model(self, model: LanguageModel, source: str) -> None:
        fingerprint = model_fingerprint(model)  # hashes every weight: once
        if fingerprint != self.model_fingerprint:
            raise EdgetttError(f"{source}: this calibration was made for another model (fingerprint "
                               f"{self.model_fingerprint}, this model {fingerprint}); run "
                               "`edgettt calibrate` on this model")

    def check_shapes(self, model: LanguageModel, source: str) -> None:
        """The tables fit `model`: a Hessian [K, K] per linear layer it has one for, and per layer and
        level a scale table [buckets, H, Dk] (or [H, Dk]) matching the initial state. Before any work."""
        linears = {name: m.in_features for name, m in model.named_modules() if isinstance(m, nn.Linear)}
        for name, h in self.hessians.items():
            if name not in linears or tuple(h.shape) != (linears[name],) * 2:
                want = f"[{linears[name]}, {linears[name]}]" if name in linears else "no such layer in the model"
                raise EdgetttError(f"{source}: hessian/{name} is {tuple(h.shape)} ({want}); the file does not fit "
                                   "this model; run `edgettt calibrate` on it")
        expected = {f"{i}.{level}": tuple(s0.shape[:2])
                    for i, (_, layer) in enumerate(model.state_layers())
                    for level, s0 in enumerate(layer.initial_states(), start=1)}
        for key, table in self.state_scales.items():
            if key not in expected:
                raise EdgetttError(f"{source}: state_scale/{key}: the model has no such layer level; the file does "
                                   "not fit this model, run `edgettt calibrate` on it")
            if tuple(table.shape[-2:]) != expected[key]:
                raise EdgetttError(f"{source}: state_scale/{key} is {tuple(table.shape)}, expected [buckets, "
                                   f"{expected[key][0]}, {expected[key][1]}]; the file does not fit this model, "
                                   "run `edgettt calibrate` on it")
        missing = sorted(set(expected) - set(self.state_scales))
        if self.state_scales and missing:
            raise EdgetttError(f"{source}: no state scales for layer levels {', '.join(missing)}; run "
                               "`edgettt calibrate` on this model")
        if len({t.shape[0] for t in self.state_scales.values() if t.dim() == 3}) > 1 or (
                self.bucket_tokens == 0 and any(t.dim() == 3 and t.shape[0] > 1 for t in self.state_scales.values())):
            raise EdgetttError(f"{source}: the state scale tables disagree on their position buckets; run "
                               "`edgettt calibrate` again")

    def layer_scales(self, layer: int) -> list[torch.Tensor]:
        """Per level: int8 state scales [buckets, H, Dk] (a file from before buckets: [H, Dk])."""
        return [self.state_scales[k] for k in sorted(self.state_scales) if k.split(".")[0] == str(layer)]

    @property
    def bucket_tokens(self) -> int:
        """Positions a scale bucket spans, from the tables (a file keeps the bucket count it was made
        with); 0 for a file from before buckets."""
        table = next(iter(self.state_scales.values()), None)
        return self.seq_len // table.shape[0] if table is not None and table.dim() == 3 else 0


@torch.no_grad()
def calibrate(model: LanguageModel, text: Text, ctx: int = 2048, samples: int = 8, seed: int = 0,
              percentile: float = 99.99) -> Calibration:
    """Run `samples` windows of `ctx` tokens (drawn with `seed`) and collect the statistics."""
    if model.form == "ttt":
        raise EdgetttError("calibration needs a converted model (the linear-attention state); "
                           "run `edgettt convert` first")
    ids = encode(model, text)
    windows = token_windows(ids, ctx)
    pick = torch.randperm(windows.shape[0], generator=torch.Generator().manual_seed(seed))[:samples]
    windows = windows[pick, :-1]
    ranks = distributed.current()  # under torchrun: each rank its share of the windows, the sums added up after
    mine = windows[ranks.share(windows.shape[0], "calibrate --samples")]
    hessians, counts, hooks = {}, {}, []
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.bias is None and name != "lm_head":
            hooks.append(module.register_forward_pre_hook(_hessian_hook(name, hessians, counts)))
    rowmax: dict[str, list[torch.Tensor]] = {}
    mixers = [layer for _, layer in model.state_layers()]
    for i, mixer in enumerate(mixers):
        mixer.observer = mixer.calibration_observer(i, rowmax)
    try:
        for w in bar(mine, desc="calibrate", unit="window"):
            model(w[None])
    finally:
        for h in hooks:
            h.remove()
        for mixer in mixers:
            mixer.observer = None
    hessians = {k: distributed.total(hessians[k], ranks) / distributed.total(torch.tensor(float(counts[k])),
                                                                                  ranks) for k in sorted(hessians)}
    rowmax = {k: [distributed.gather(torch.cat(rowmax[k], dim=-1), ranks)] for k in sorted(rowmax)}  # rank order:
    return _summarise(model, text, ctx, windows.shape[0], seed, percentile, hessians, rowmax)  # whole samples


def _hessian_hook(name, hessians, counts):
    def hook(module, args):
        x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
        hessians[name] = hessians.get(name, 0) + x.T @ x
        counts[name] = counts.get(name, 0) + x.shape[0]
    return hook


def _summarise(model, text, seq_len, samples, seed, percentile, hessians, rowmax) -> Calibration:
    cal = Calibration(model_fingerprint(model), text.fingerprint(), seq_len, samples, seed, percentile, hessians)
    for key, parts in rowmax.items():
        # calls come in time order, sample after sample (exact form: one call per mini-batch)
        series = torch.cat(parts, dim=-1)  # [H, Dk, samples * T]
        T = series.shape[-1] // samples
        per_sample = series.reshape(*series.shape[:2], samples, T)
        bucket = torch.arange(T) * BUCKETS // T
        cal.state_rowmax[key] = torch.stack([per_sample[..., bucket == b].amax((-1, -2))
                                             for b in range(BUCKETS)], dim=-1)
        if key.endswith(".dS"):
            k = max(1, min(series.shape[-1], round(percentile / 100 * series.shape[-1])))
            clip = series.float().kthvalue(k, dim=-1).values  # the percentile of each row's max: [H, Dk]
            by_bucket = cal.state_rowmax[key].float().cummax(dim=-1).values * HEADROOM  # [H, Dk, buckets]
            table = torch.minimum(by_bucket, clip[..., None]).permute(2, 0, 1)  # [buckets, H, Dk]
            cal.state_scales[key[:-3]] = (table.clamp_min(1e-8) / STATE_CLIP).float().contiguous()
    return cal
