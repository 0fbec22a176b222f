"""Bad input, table-driven, through every command: one line, a non-zero exit, nothing lost.

Each case builds its bad input in a fresh copy of a small world of generated files (an original TTT
model, its parallel form, an int8-state quantized model, a calibration file, reference logits, an
export, a text), runs one command line through click's runner, and checks:
- the exit code: 1 for bad input or a refused operation, 2 for a malformed command line;
- no traceback (the command ended in SystemExit, not in another exception);
- exactly one `Error:` line, naming the file or option the case is about; for exit 1 it also says
  what to do (a clause after a semicolon);
- the file system after the run equals the one before it, byte for byte: inputs unchanged, nothing
  half-written, no leftovers (no staging directories either).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import msgpack
import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.numpy import load_file as load_numpy
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import load_file, save_file

from edgettt.cli import cli

HIDDEN, LAYERS, HEADS, MINI_BATCH = 32, 2, 4, 8


def invoke(*args, input=None):
    return CliRunner().invoke(cli, [str(a) for a in args], input=input)


def ok(*args):
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """The generated inputs every case starts from (made once; each case works on a copy)."""
    w = tmp_path_factory.mktemp("world")
    ok("create", w / "ttt", "--set", f"hidden_size={HIDDEN}", "--set", f"num_hidden_layers={LAYERS}", "--set", f"num_attention_heads={HEADS}", "--set", "intermediate_size=64",
       "--set", f"mini_batch_size={MINI_BATCH}")
    ok("convert", w / "ttt", w / "par", "--form", "parallel", "--no-report")
    (w / "text.txt").write_text("def f(x):\n    return x + 1\n" * 40)
    ok("calibrate", w / "par", "--data", w / "text.txt", "--ctx", 32, "--samples", 2, w / "calib.st")
    ok("quantize", w / "par", w / "q8", "--weights", "int8", "--state", "int8", "--calib", w / "calib.st")
    ok("eval", w / "par", "--data", w / "text.txt", "--ctx", 32, "--save-logits", w / "logits.st")
    ok("export", w / "par", w / "export", "--no-verify")
    ok("run", w / "export", "--prompt", "ab", "--max-new-tokens", 1, "--save-state", w / "s.st")
    ok("create", w / "v128", "--set", f"hidden_size={HIDDEN}", "--set", "num_hidden_layers=1", "--set",
       f"num_attention_heads={HEADS}", "--set", "intermediate_size=64", "--set", "vocab_size=128")
    (w / "notes.txt").write_text("my notes, not edgettt's\n")
    (w / "blob.bin").write_bytes(bytes(range(256)) * 4)
    shutil.copytree(Path(__file__).parent / "jax_fixtures" / "ttt-linear", w / "jax")
    (w / "mine").mkdir()
    (w / "mine" / "keep.txt").write_text("mine")
    return w


def snapshot(root: Path) -> dict:
    """Every path under root: its kind, and for files the mode and a hash of the bytes."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder) / name
            rel = str(path.relative_to(root))
            if path.is_symlink():
                seen[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                seen[rel] = ("dir",)
            else:
                seen[rel] = ("file", path.stat().st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
    return seen


# ---- ways to spoil the generated inputs ------------------------------------------------------------

def edit_json(path: Path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is DELETE:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


DELETE = object()


def edit_weights(model: Path, change: Callable[[dict], None]):
    file = model / "model.safetensors"
    tensors = load_file(file)
    change(tensors)
    save_file(tensors, file, metadata={"format": "pt"})


def edit_safetensors(file: Path, change_tensors=None, change_meta=None):
    with safe_open(str(file), "pt") as f:
        meta = dict(f.metadata() or {})
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if change_tensors:
        change_tensors(tensors)
    if change_meta:
        change_meta(meta)
    save_file(tensors, file, metadata=meta)


def to_bin(model: Path, weights) -> None:
    (model / "model.safetensors").unlink()
    torch.save(weights, model / "pytorch_model.bin")


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def manifest_edit(w: Path, change: Callable[[dict], None]):
    file = w / "export" / "manifest.json"
    data = json.loads(file.read_text())
    change(data)
    file.write_text(json.dumps(data))


def set_path(data: dict, dotted: str, value):
    *head, last = dotted.split(".")
    for key in head:
        data = data[int(key)] if isinstance(data, list) else data[key]
    if isinstance(data, list):
        data[int(last)] = value
    else:
        data[last] = value


def jax_records(w: Path) -> list:
    """The (key path, flax bytes) records of the world's ttt-lm-jax checkpoint."""
    with open(w / "jax" / "streaming_params", "rb") as f:
        return [tuple(item) for item in msgpack.Unpacker(f, raw=False)]


def write_jax(w: Path, records, name="streaming_params") -> None:
    (w / "jax" / name).write_bytes(b"".join(msgpack.packb(r) for r in records))


def flax_array(shape, dtype: str, raw: bytes) -> bytes:
    return msgpack.packb(msgpack.ExtType(1, msgpack.packb((list(shape), dtype, raw))))


def jax_edit(change: Callable[[list], list]):
    return lambda w: write_jax(w, change(jax_records(w)))


def state_meta(file: Path, **changes) -> None:
    """A saved state file with its metadata changed."""
    with safe_open(str(file), "np") as f:
        meta = {**(f.metadata() or {}), **changes}
    tensors = load_numpy(str(file))
    save_numpy(tensors, str(file), metadata=meta)


def cut_weights(w: Path) -> None:
    file = w / "export" / "weights.bin"
    os.truncate(file, file.stat().st_size // 2)


def flip_byte(file: Path, at: int = 0) -> None:
    data = bytearray(file.read_bytes())
    data[at] ^= 0xFF
    file.write_bytes(bytes(data))


def other_tokenizer(w: Path) -> None:
    """A copy of the parallel model whose tokenizer.json reads the text as other tokens (same vocabulary)."""
    from conftest import word_tokenizer

    shutil.copytree(w / "par", w / "wt")
    shutil.copyfile(word_tokenizer(w / "tok.json", 256), w / "wt" / "tokenizer.json")


class Unpickled:
    """What a pickle in disguise would run if it were unpickled: it would create `pwned` in the world."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def jax_pickle(w: Path) -> None:
    (w / "jax" / "streaming_params").write_bytes(pickle.dumps(Unpickled(w / "pwned")))


# ---- the cases ----------------------------------------------------------------------------------------

@dataclass
class Case:
    id: str
    args: Callable[[Path], list]  # w -> command line (after `edgettt`)
    code: int  # expected exit code
    says: str  # a substring of the error line: the file or option it is about
    prepare: Callable[[Path], None] | None = None  # spoil the world's copy first
    stdin: str | None = None


def c(id, args, code, says, prepare=None, stdin=None):
    return Case(id, args, code, says, prepare, stdin)


def cfg(model="ttt", **changes):
    return lambda w: edit_json(w / model / "config.json", **changes)


ONE = 1
USAGE = 2
CASES = [
    # ---- outputs that would touch inputs: refused, even with --force
    c("convert-out-is-src", lambda w: ["convert", w / "ttt", w / "ttt", "--force"], ONE, "is the input"),
    c("convert-out-is-src-slash", lambda w: ["convert", w / "ttt", f"{w / 'ttt'}/", "--force"], ONE, "is the input"),
    c("convert-out-contains-src", lambda w: ["convert", w / "ttt", w, "--force"], ONE, "contains the input"),
    c("convert-out-inside-src", lambda w: ["convert", w / "ttt", w / "ttt" / "sub"], ONE, "inside the input"),
    c("convert-out-is-data", lambda w: ["convert", w / "ttt", w / "text.txt", "--data", w / "text.txt", "--force"],
      ONE, "is the input"),
    c("convert-out-is-eval-data", lambda w: ["convert", w / "ttt", w / "notes.txt", "--distill", "--eval-data",
                                              w / "notes.txt", "--force"], ONE, "is the input"),
    c("quantize-out-is-model", lambda w: ["quantize", w / "par", w / "par", "--force"], ONE, "is the input"),
    c("quantize-out-is-model-slash", lambda w: ["quantize", w / "par", f"{w / 'par'}/", "--force"], ONE,
      "is the input"),
    c("quantize-out-is-calib", lambda w: ["quantize", w / "par", w / "calib.st", "--calib", w / "calib.st",
                                           "--force"], ONE, "is the input"),
    c("quantize-out-contains-model", lambda w: ["quantize", w / "par", w, "--force"], ONE, "contains the input"),
    c("calibrate-out-inside-model", lambda w: ["calibrate", w / "par", w / "par" / "model.safetensors",
                                                "--force"], ONE, "inside the input"),
    c("calibrate-out-is-data", lambda w: ["calibrate", w / "par", "--data", w / "text.txt", w / "text.txt",
                                           "--force"], ONE, "is the input"),
    c("eval-json-inside-model", lambda w: ["eval", w / "par", "--json", w / "par" / "config.json", "--force"], ONE,
      "inside the input"),
    c("eval-logits-is-ref-logits", lambda w: ["eval", w / "par", "--ref-logits", w / "logits.st", "--save-logits",
                                               w / "logits.st", "--force"], ONE, "is the input"),
    c("eval-json-is-data", lambda w: ["eval", w / "par", "--data", w / "text.txt", "--json", w / "text.txt",
                                       "--force"], ONE, "is the input"),
    c("eval-json-inside-ref", lambda w: ["eval", w / "par", "--ref", w / "ttt", "--json", w / "ttt" / "r.json"], ONE,
      "inside the input"),
    c("eval-two-outputs-same", lambda w: ["eval", w / "par", "--save-logits", w / "x.st", "--json", w / "x.st"], ONE,
      "give each output its own path"),
    c("export-out-inside-model", lambda w: ["export", w / "par", w / "par" / "onnx"], ONE, "inside the input"),
    c("export-out-is-verify-data", lambda w: ["export", w / "par", w / "text.txt", "--data", w / "text.txt",
                                               "--force"], ONE, "is the input"),
    c("run-json-is-manifest", lambda w: ["run", w / "export", "--prompt", "x", "--json",
                                          w / "export" / "manifest.json"], ONE, "inside the input"),
    c("run-json-is-manifest-forced", lambda w: ["run", w / "export", "--prompt", "x", "--json",
                                                 w / "export" / "manifest.json", "--force"], ONE, "inside the input"),
    c("compare-out-is-model", lambda w: ["compare", w / "par", w / "par", "--force"], ONE, "is the input"),
    c("compare-out-contains-model", lambda w: ["compare", w / "par", w, "--force"], ONE, "contains the input"),
    c("compare-quantized-model", lambda w: ["compare", w / "par", w / "q8", w / "c"], ONE, "already quantized"),
    c("compare-original-form", lambda w: ["compare", w / "ttt", w / "c"], ONE, "--form parallel"),
    c("compare-missing-model", lambda w: ["compare", w / "par", w / "nothing", w / "c"], ONE, "nothing"),
    c("compare-export-as-model", lambda w: ["compare", w / "export", w / "c"], ONE, "export"),
    c("compare-bench-file-not-json", lambda w: ["compare", w / "par", w / "notes.json", w / "c"], ONE, "notes.json",
      lambda w: (w / "notes.json").write_text("not json")),
    c("compare-out-exists", lambda w: ["compare", w / "par", w / "mine"], ONE, "mine"),
    c("compare-no-out", lambda w: ["compare"], USAGE, "OUT"),
    c("report-out-is-model", lambda w: ["report", w / "par", w / "par", "--force"], ONE, "is the input"),
    c("report-out-is-data", lambda w: ["report", w / "par", "--data", w / "text.txt", w / "text.txt",
                                        "--force"], ONE, "is the input"),
    c("report-out-contains-calib-data", lambda w: ["report", w / "par", "--calib-data", w / "mine" / "keep.txt",
                                                    w / "mine", "--force"], ONE, "contains the input"),
    # ---- --force replaces only what edgettt wrote
    c("create-force-over-foreign-dir", lambda w: ["create", w / "mine", "--force"], ONE, "refusing to replace"),
    c("convert-force-over-foreign-dir", lambda w: ["convert", w / "ttt", w / "mine", "--force"], ONE,
      "refusing to replace"),
    c("convert-force-over-text-file", lambda w: ["convert", w / "ttt", w / "notes.txt", "--force"], ONE,
      "refusing to replace"),
    c("convert-force-over-model-with-extra-file", lambda w: ["convert", w / "ttt", w / "par", "--force"], ONE,
      "refusing to replace", lambda w: (w / "par" / "keep.txt").write_text("mine")),
    c("convert-force-over-symlink", lambda w: ["convert", w / "ttt", w / "link", "--force"], ONE,
      "refusing to replace", lambda w: (w / "link").symlink_to(w / "q8")),
    c("quantize-force-over-export", lambda w: ["quantize", w / "par", w / "export", "--force"], ONE,
      "refusing to replace"),
    c("export-force-over-model", lambda w: ["export", w / "par", w / "q8", "--force"], ONE, "refusing to replace"),
    c("export-force-over-foreign-dir", lambda w: ["export", w / "par", w / "mine", "--force"], ONE,
      "refusing to replace"),
    c("calibrate-force-over-text", lambda w: ["calibrate", w / "par", w / "notes.txt", "--force"], ONE,
      "refusing to replace"),
    c("calibrate-force-over-logits", lambda w: ["calibrate", w / "par", w / "logits.st", "--force"], ONE,
      "refusing to replace"),
    c("eval-logits-force-over-text", lambda w: ["eval", w / "par", "--save-logits", w / "notes.txt", "--force"], ONE,
      "refusing to replace"),
    c("eval-json-force-over-binary", lambda w: ["eval", w / "par", "--json", w / "blob.bin", "--force"], ONE,
      "refusing to replace"),
    c("run-json-force-over-binary", lambda w: ["run", w / "export", "--prompt", "x", "--json", w / "blob.bin",
                                                "--force"], ONE, "refusing to replace"),
    c("report-force-over-foreign-dir", lambda w: ["report", w / "par", w / "mine", "--force"], ONE,
      "refusing to replace"),
    c("bench-markdown-force-over-binary", lambda w: ["bench", "--markdown", w / "blob.bin", "--force"], ONE,
      "refusing to replace"),
    c("bench-two-outputs-same", lambda w: ["bench", "--json", w / "b.txt", "--markdown", w / "b.txt"], ONE,
      "give each output its own path"),
    # ---- existing outputs without --force
    c("create-exists", lambda w: ["create", w / "ttt"], ONE, "already exists"),
    c("convert-exists", lambda w: ["convert", w / "ttt", w / "par"], ONE, "already exists"),
    c("quantize-exists", lambda w: ["quantize", w / "par", w / "q8"], ONE, "already exists"),
    c("calibrate-exists", lambda w: ["calibrate", w / "par", w / "calib.st"], ONE, "already exists"),
    c("export-exists", lambda w: ["export", w / "par", w / "export"], ONE, "already exists"),
    c("eval-json-exists", lambda w: ["eval", w / "par", "--json", w / "notes.txt"], ONE, "already exists"),
    c("run-json-exists", lambda w: ["run", w / "export", "--prompt", "x", "--json", w / "notes.txt"], ONE,
      "already exists"),
    # ---- output folders that cannot be written: found before the work
    c("create-parent-is-file", lambda w: ["create", w / "notes.txt" / "m"], ONE, "is a file"),
    c("convert-parent-is-file", lambda w: ["convert", w / "ttt", w / "notes.txt" / "m"], ONE, "is a file"),
    c("quantize-parent-is-file", lambda w: ["quantize", w / "par", w / "notes.txt" / "q"], ONE, "is a file"),
    c("calibrate-parent-is-file", lambda w: ["calibrate", w / "par", w / "notes.txt" / "c.st"], ONE,
      "is a file"),
    c("export-parent-is-file", lambda w: ["export", w / "par", w / "notes.txt" / "e"], ONE, "is a file"),
    c("eval-json-parent-is-file", lambda w: ["eval", w / "par", "--json", w / "notes.txt" / "r.json"], ONE,
      "is a file"),
    c("run-json-parent-is-file", lambda w: ["run", w / "export", "--prompt", "x", "--json",
                                             w / "notes.txt" / "r.json"], ONE, "is a file"),
    c("report-parent-is-file", lambda w: ["report", w / "par", w / "notes.txt" / "r"], ONE, "is a file"),
    c("bench-parent-is-file", lambda w: ["bench", "--json", w / "notes.txt" / "b.json"], ONE, "is a file"),
    # ---- configs: types, ranges, sizes against the weights (before anything is built)
    c("config-hidden-size-huge", lambda w: ["info", w / "ttt"], ONE, "hidden_size", cfg(hidden_size=10**9)),
    c("config-layers-huge", lambda w: ["info", w / "ttt"], ONE, "num_hidden_layers", cfg(num_hidden_layers=10**7)),
    c("config-eps-string", lambda w: ["info", w / "ttt"], ONE, "rms_norm_eps", cfg(rms_norm_eps="tiny")),
    c("config-eps-negative", lambda w: ["info", w / "ttt"], ONE, "rms_norm_eps", cfg(rms_norm_eps=-1e-6)),
    c("config-vocab-string", lambda w: ["info", w / "ttt"], ONE, "vocab_size", cfg(vocab_size="256")),
    c("config-vocab-bool", lambda w: ["info", w / "ttt"], ONE, "vocab_size", cfg(vocab_size=True)),
    c("config-hidden-zero", lambda w: ["info", w / "ttt"], ONE, "hidden_size", cfg(hidden_size=0)),
    c("config-heads-not-dividing", lambda w: ["info", w / "ttt"], ONE, "num_attention_heads",
      cfg(num_attention_heads=3)),
    c("config-tie-string", lambda w: ["info", w / "ttt"], ONE, "tie_word_embeddings", cfg(tie_word_embeddings="yes")),
    c("config-layer-type", lambda w: ["info", w / "ttt"], ONE, "ttt_layer_type", cfg(ttt_layer_type="rnn")),
    c("config-mini-batch-disagrees", lambda w: ["info", w / "ttt"], ONE, "mini_batch_size", cfg(mini_batch_size=9)),
    c("config-intermediate-disagrees", lambda w: ["info", w / "ttt"], ONE, "intermediate_size",
      cfg(intermediate_size=65)),
    c("config-vocab-disagrees", lambda w: ["info", w / "ttt"], ONE, "vocab_size", cfg(vocab_size=300)),
    c("config-layers-disagree", lambda w: ["info", w / "ttt"], ONE, "num_hidden_layers", cfg(num_hidden_layers=3)),
    c("config-heads-disagree", lambda w: ["info", w / "ttt"], ONE, "num_attention_heads",
      cfg(num_attention_heads=8)),
    c("config-not-json", lambda w: ["info", w / "ttt"], ONE, "config.json",
      lambda w: (w / "ttt" / "config.json").write_text("{not json")),
    c("config-array", lambda w: ["info", w / "ttt"], ONE, "config.json",
      lambda w: (w / "ttt" / "config.json").write_text("[1, 2]")),
    c("config-missing", lambda w: ["info", w / "ttt"], ONE, "config.json",
      lambda w: (w / "ttt" / "config.json").unlink()),
    c("config-model-type", lambda w: ["info", w / "ttt"], ONE, "model_type", cfg(model_type="llama")),
    c("config-format-version", lambda w: ["info", w / "par"], ONE, "edgettt_format", cfg("par", edgettt_format=2)),
    c("config-form", lambda w: ["info", w / "par"], ONE, "form", cfg("par", form="weird")),
    c("config-quantized-intermediate-disagrees", lambda w: ["info", w / "q8"], ONE, "intermediate_size",
      cfg("q8", intermediate_size=2**18)),
    c("config-quantization-string", lambda w: ["info", w / "q8"], ONE, "quantization", cfg("q8", quantization="int4")),
    c("config-quantization-group-string", lambda w: ["info", w / "q8"], ONE, "quantization",
      cfg("q8", quantization={"weights": "int8", "group_size": "64", "state": "int8"})),
    c("config-quantization-format", lambda w: ["info", w / "q8"], ONE, "quantization",
      cfg("q8", quantization={"weights": "int9", "state": "int8"})),
    c("config-distilled-ctx", lambda w: ["info", w / "par"], ONE, "distilled_ctx", cfg("par", distilled_ctx=-5)),
    c("config-state-decay-exact", lambda w: ["info", w / "ex"], ONE, "state_decay",
      lambda w: (ok("convert", w / "ttt", w / "ex", "--no-report"), cfg("ex", state_decay=True)(w))),
    c("config-state-decay-string", lambda w: ["info", w / "par"], ONE, "state_decay", cfg("par", state_decay="yes")),
    c("config-bos-negative", lambda w: ["info", w / "ttt"], ONE, "bos_token_id", cfg(bos_token_id=-1)),
    c("config-rope-string", lambda w: ["info", w / "ttt"], ONE, "rope_theta", cfg(rope_theta="x")),
    c("config-conv-kernel-zero", lambda w: ["info", w / "ttt"], ONE, "conv_kernel", cfg(conv_kernel=0)),
    # ---- weights files
    c("weights-int32", lambda w: ["info", w / "ttt"], ONE, "dtype",
      lambda w: edit_weights(w / "ttt", lambda t: t.update({"model.norm.weight": t["model.norm.weight"].int()}))),
    c("weights-int8-in-float-model", lambda w: ["info", w / "ttt"], ONE, "dtype",
      lambda w: edit_weights(w / "ttt", lambda t: t.update({"model.norm.weight": t["model.norm.weight"].to(torch.int8)}))),
    c("weights-quantized-as-float", lambda w: ["info", w / "q8"], ONE, "dtype",
      lambda w: edit_weights(w / "q8", lambda t: t.update(
          {k: v.float() for k, v in t.items() if k.endswith("qweight")}))),
    c("weights-bin-non-string-key", lambda w: ["info", w / "ttt"], ONE, "pytorch_model.bin",
      lambda w: to_bin(w / "ttt", {**load_file(w / "ttt" / "model.safetensors"), 7: torch.zeros(1)})),
    c("weights-bin-code", lambda w: ["info", w / "ttt"], ONE, "pytorch_model.bin",
      lambda w: ((w / "ttt" / "model.safetensors").unlink(),
                 (w / "ttt" / "pytorch_model.bin").write_bytes(pickle.dumps(Evil())))),
    c("weights-bin-list", lambda w: ["info", w / "ttt"], ONE, "pytorch_model.bin",
      lambda w: to_bin(w / "ttt", [torch.zeros(2)])),
    c("weights-truncated", lambda w: ["info", w / "ttt"], ONE, "model.safetensors",
      lambda w: (w / "ttt" / "model.safetensors").write_bytes((w / "ttt" / "model.safetensors").read_bytes()[:500])),
    c("weights-garbage", lambda w: ["info", w / "ttt"], ONE, "model.safetensors",
      lambda w: (w / "ttt" / "model.safetensors").write_bytes(b"\x00" * 64)),
    c("weights-missing", lambda w: ["info", w / "ttt"], ONE, "weights are missing",
      lambda w: (w / "ttt" / "model.safetensors").unlink()),
    c("weights-nan", lambda w: ["info", w / "ttt"], ONE, "non-finite",
      lambda w: edit_weights(w / "ttt", lambda t: t["model.norm.weight"].fill_(float("nan")))),
    c("weights-tensor-missing", lambda w: ["info", w / "ttt"], ONE, "missing tensors",
      lambda w: edit_weights(w / "ttt", lambda t: t.pop("model.norm.weight"))),
    c("weights-tensor-extra", lambda w: ["info", w / "ttt"], ONE, "unexpected tensors",
      lambda w: edit_weights(w / "ttt", lambda t: t.update({"model.extra": torch.zeros(2)}))),
    c("weights-tensor-misshaped", lambda w: ["info", w / "ttt"], ONE, "mis-shaped",
      lambda w: edit_weights(w / "ttt", lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(64, 31)}))),
    c("weights-no-embedding", lambda w: ["info", w / "ttt"], ONE, "embed_tokens",
      lambda w: edit_weights(w / "ttt", lambda t: t.pop("model.embed_tokens.weight"))),
    c("weights-state-scale-misshaped", lambda w: ["info", w / "q8"], ONE, "state_scale_1",
      lambda w: edit_weights(w / "q8", lambda t: t.update(
          {"model.layers.0.seq_modeling_block.state_scale_1": torch.ones(3, 5)}))),
    c("weights-state-scale-negative", lambda w: ["info", w / "q8"], ONE, "state_scale_1",
      lambda w: edit_weights(w / "q8", lambda t: t["model.layers.0.seq_modeling_block.state_scale_1"].fill_(-1.0))),
    c("model-missing", lambda w: ["info", w / "nope"], ONE, "no such directory"),
    c("model-is-file", lambda w: ["info", w / "notes.txt"], ONE, "not a directory"),
    # ---- calibration files
    c("calib-no-fingerprint", lambda w: ["quantize", w / "par", w / "q", "--state", "int8", "--calib", w / "calib.st"],
      ONE, "model_fingerprint", lambda w: edit_safetensors(w / "calib.st", change_meta=lambda m: m.pop("model_fingerprint"))),
    c("calib-seq-len-text", lambda w: ["quantize", w / "par", w / "q", "--state", "int8", "--calib", w / "calib.st"],
      ONE, "seq_len", lambda w: edit_safetensors(w / "calib.st", change_meta=lambda m: m.update(seq_len="abc"))),
    c("calib-zero-samples", lambda w: ["quantize", w / "par", w / "q", "--state", "int8", "--calib", w / "calib.st"],
      ONE, "samples", lambda w: edit_safetensors(w / "calib.st", change_meta=lambda m: m.update(samples="0"))),
    c("calib-misshaped-scales", lambda w: ["quantize", w / "par", w / "q", "--state", "int8", "--calib",
                                           w / "calib.st"], ONE, "state_scale/0.1",
      lambda w: edit_safetensors(w / "calib.st", lambda t: t.update({"state_scale/0.1": torch.ones(16, 4, 5)}))),
    c("calib-nan-scale", lambda w: ["quantize", w / "par", w / "q", "--state", "int8", "--calib", w / "calib.st"],
      ONE, "NaN", lambda w: edit_safetensors(w / "calib.st", lambda t: t["state_scale/0.1"].fill_(float("nan")))),
    c("calib-unknown-tensor", lambda w: ["quantize", w / "par", w / "q", "--calib", w / "calib.st"], ONE,
      "unexpected tensors", lambda w: edit_safetensors(w / "calib.st", lambda t: t.update({"x": torch.ones(1)}))),
    c("calib-no-state-scales", lambda w: ["quantize", w / "par", w / "q", "--state", "int8", "--calib",
                                          w / "calib.st"], ONE, "state scales",
      lambda w: edit_safetensors(w / "calib.st", lambda t: [t.pop(k) for k in list(t) if k.startswith("state_scale")])),
    c("calib-no-hessians-gptq", lambda w: ["quantize", w / "par", w / "q", "--weights", "int4-gptq-g32",
                                           "--calib", w / "calib.st"], ONE, "input statistics",
      lambda w: edit_safetensors(w / "calib.st", lambda t: [t.pop(k) for k in list(t) if k.startswith("hessian")])),
    c("calib-other-model", lambda w: ["quantize", w / "q8", w / "q", "--calib", w / "calib.st"], ONE,
      "already quantized"),
    c("calib-for-another-model", lambda w: ["quantize", w / "par", w / "q", "--calib", w / "calib.st"], ONE,
      "another model", lambda w: edit_safetensors(w / "calib.st", change_meta=lambda m: m.update(
          model_fingerprint="0123456789abcdef"))),
    c("calib-not-safetensors", lambda w: ["quantize", w / "par", w / "q", "--calib", w / "notes.txt"], ONE,
      "notes.txt"),
    c("calib-missing", lambda w: ["quantize", w / "par", w / "q", "--calib", w / "nope.st"], ONE, "nope.st"),
    c("calib-is-logits", lambda w: ["quantize", w / "par", w / "q", "--calib", w / "logits.st"], ONE,
      "not an edgettt calibration file"),
    c("calib-needed", lambda w: ["quantize", w / "par", w / "q", "--state", "int8"], ONE, "--calib"),
    # ---- reference logits
    c("logits-not-logits", lambda w: ["eval", w / "par", "--ref-logits", w / "calib.st"], ONE, "calib.st"),
    c("logits-other-text", lambda w: ["eval", w / "par", "--ref-logits", w / "logits.st", "--data", w / "notes.txt"],
      ONE, "logits.st"),
    c("logits-and-ref", lambda w: ["eval", w / "par", "--ref-logits", w / "logits.st", "--ref", w / "ttt"], ONE,
      "--ref-logits"),
    # ---- export manifests and graphs (the runner)
    c("manifest-missing", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "manifest.json",
      lambda w: (w / "export" / "manifest.json").unlink()),
    c("manifest-not-json", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "manifest.json",
      lambda w: (w / "export" / "manifest.json").write_text("{")),
    c("manifest-format", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "manifest.json",
      lambda w: manifest_edit(w, lambda m: m.update(edgettt_export=7))),
    c("manifest-no-graphs", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "graphs",
      lambda w: manifest_edit(w, lambda m: m.pop("graphs"))),
    c("manifest-graph-absolute", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "outside the export",
      lambda w: manifest_edit(w, lambda m: set_path(m, "graphs.prefill.file", str(w / "export" / "prefill.onnx")))),
    c("manifest-graph-parent", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "outside the export",
      lambda w: (shutil.copy(w / "export" / "decode.onnx", w / "decode.onnx"),
                 manifest_edit(w, lambda m: set_path(m, "graphs.decode.file", "../decode.onnx")))),
    c("manifest-graph-symlink-out", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "outside the export",
      lambda w: (shutil.copy(w / "export" / "decode.onnx", w / "d.onnx"), (w / "export" / "l.onnx").symlink_to(
          w / "d.onnx"), manifest_edit(w, lambda m: set_path(m, "graphs.decode.file", "l.onnx")))),
    c("manifest-graph-missing", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "missing",
      lambda w: (w / "export" / "decode.onnx").unlink()),
    c("manifest-graph-number", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "graphs.decode.file",
      lambda w: manifest_edit(w, lambda m: set_path(m, "graphs.decode.file", 3))),
    c("manifest-vocab-disagrees", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "vocab",
      lambda w: manifest_edit(w, lambda m: m.update(vocab_size=300))),
    c("manifest-vocab-string", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "vocab_size",
      lambda w: manifest_edit(w, lambda m: m.update(vocab_size="256"))),
    c("manifest-state-shape", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "shape",
      lambda w: manifest_edit(w, lambda m: set_path(m, "graphs.decode.inputs.2.shape", ["batch", 5, 9, 8]))),
    c("manifest-input-name", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "inputs",
      lambda w: manifest_edit(w, lambda m: set_path(m, "graphs.prefill.inputs.0.name", "tokens"))),
    c("manifest-dtype", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "float16",
      lambda w: manifest_edit(w, lambda m: set_path(m, "graphs.prefill.outputs.0.dtype", "float16"))),
    c("manifest-role", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "known role",
      lambda w: manifest_edit(w, lambda m: set_path(m, "graphs.prefill.inputs.0.role", "tokens"))),
    c("manifest-tokenizer", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "tokenizer",
      lambda w: manifest_edit(w, lambda m: m.update(tokenizer={"type": "sentencepiece"}))),
    c("manifest-tokenizer-outside", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "outside the export",
      lambda w: manifest_edit(w, lambda m: m.update(tokenizer={"type": "tokenizer.json", "file": "/etc/passwd"}))),
    c("manifest-mini-batch", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "mini_batch_size",
      lambda w: manifest_edit(w, lambda m: m.update(mini_batch_size=0))),
    c("manifest-session-config", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "session_config",
      lambda w: manifest_edit(w, lambda m: m.update(session_config={"a": 1}))),
    c("manifest-states-differ", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "states",
      lambda w: manifest_edit(w, lambda m: set_path(m, "graphs.prefill.outputs.1.state", "9.S1"))),
    c("graph-corrupt", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "decode.onnx",
      lambda w: (w / "export" / "decode.onnx").write_bytes(b"not onnx")),
    c("export-missing", lambda w: ["run", w / "nope", "--prompt", "x"], ONE, "nope"),
    c("run-empty-prompt", lambda w: ["run", w / "export", "--prompt", ""], ONE, "prompt"),
    # ---- texts
    c("text-missing", lambda w: ["eval", w / "par", "--data", w / "nope.txt"], ONE, "nope.txt"),
    c("text-distill-data-missing", lambda w: ["convert", w / "ttt", w / "o", "--form", "parallel", "--distill",
                                              "--data", w / "nope.txt"], ONE, "nope.txt"),
    c("text-calib-data-missing", lambda w: ["report", w / "par", "--calib-data", w / "nope.txt", w / "r"], ONE,
      "nope.txt"),
    c("text-verify-data-missing", lambda w: ["export", w / "par", w / "e", "--data", w / "nope.txt"], ONE,
      "nope.txt"),
    c("text-empty", lambda w: ["eval", w / "par", "--data", w / "empty.txt"], ONE, "empty.txt",
      lambda w: (w / "empty.txt").write_text("")),
    c("text-empty-stdin", lambda w: ["convert", w / "ttt", w / "out", "--data", "-"], ONE, "<stdin>", None, ""),
    c("text-dir-without-text", lambda w: ["calibrate", w / "par", "--data", w / "export", w / "c.st"], ONE,
      "no .txt"),
    # ---- other refused operations
    c("report-weights-unknown", lambda w: ["report", w / "par", "--weights", "int9", w / "r"], USAGE, "--weights"),
    c("report-state-unknown", lambda w: ["report", w / "par", "--state", "int3", w / "r"], USAGE, "--state"),
    c("quantize-original", lambda w: ["quantize", w / "ttt", w / "q"], ONE, "original TTT model"),
    c("export-exact-form", lambda w: ["export", w / "ex", w / "e"], ONE, "--form parallel",
      lambda w: ok("convert", w / "ttt", w / "ex", "--no-report")),
    c("calibrate-original", lambda w: ["calibrate", w / "ttt", w / "c.st"], ONE, "convert"),
    c("create-too-big", lambda w: ["create", w / "big", "--set", "hidden_size=65536", "--set", "num_hidden_layers=1024"], ONE, "GiB"),
    c("create-preset-with-sizes", lambda w: ["create", w / "m", "--preset", "125m", "--set", "num_hidden_layers=3"], ONE,
      "--preset 125m sets num_hidden_layers"),
    c("create-preset-unknown", lambda w: ["create", w / "m", "--preset", "7b"], USAGE, "--preset"),
    c("create-heads-not-dividing", lambda w: ["create", w / "m", "--set", "hidden_size=30", "--set", "num_attention_heads=4"], ONE,
      "num_attention_heads"),
    c("bench-not-a-model", lambda w: ["bench", w / "notes.txt"], ONE, "neither an export"),
    c("bench-json-inside-the-model", lambda w: ["bench", w / "ttt", "--json", w / "ttt" / "config.json", "--force"],
      ONE, "inside the input"),
    c("bench-nothing", lambda w: ["bench"], ONE, "no PATH given"),
    c("bench-negative-depth", lambda w: ["bench", w / "ttt", "--depth", -1], USAGE, "--depth"),
    c("bench-zero-prefill", lambda w: ["bench", w / "ttt", "--pp", 0], USAGE, "--pp"),
    c("bench-cuda-without-gpu", lambda w: ["bench", w / "ttt", "--device", "cuda", "--json", w / "b.json"], ONE,
      "no CUDA GPU"),
    # ---- malformed command lines: numeric options out of range, unknown options (exit 2)
    c("convert-ctx-zero", lambda w: ["convert", w / "ttt", w / "o", "--ctx", 0], USAGE, "--ctx"),
    c("convert-ctx-negative", lambda w: ["convert", w / "ttt", w / "o", "--ctx", -1], USAGE, "--ctx"),
    c("convert-max-tokens-negative", lambda w: ["convert", w / "ttt", w / "o", "--max-tokens", -5], USAGE,
      "--max-tokens"),
    c("convert-steps-zero", lambda w: ["convert", w / "ttt", w / "o", "--distill", "steps=0"], USAGE, "steps=0"),
    c("convert-lr-nan", lambda w: ["convert", w / "ttt", w / "o", "--distill", "lr=nan"], USAGE, "lr=nan"),
    c("convert-lr-zero", lambda w: ["convert", w / "ttt", w / "o", "--distill", "lr=0"], USAGE, "lr=0"),
    c("convert-minutes-zero", lambda w: ["convert", w / "ttt", w / "o", "--distill", "minutes=0"], USAGE, "minutes=0"),
    c("convert-batch-zero", lambda w: ["convert", w / "ttt", w / "o", "--distill", "batch=0"], USAGE, "batch=0"),
    c("convert-distill-unknown", lambda w: ["convert", w / "ttt", w / "o", "--distill", "epochs=3"], USAGE, "epochs=3"),
    c("convert-steps-unknown", lambda w: ["convert", w / "ttt", w / "o", "--steps", 3], USAGE, "No such option"),
    c("convert-decay-one", lambda w: ["convert", w / "ttt", w / "o", "--form", "parallel", "--decay", 1], USAGE, "--decay"),
    c("convert-decay-exact-form", lambda w: ["convert", w / "ttt", w / "o", "--decay", 0.9], ONE, "--form parallel"),
    c("convert-distill-ctx-zero", lambda w: ["convert", w / "ttt", w / "o", "--distill", "ctx=512/0"], USAGE,
      "ctx=512/0"),
    c("convert-form", lambda w: ["convert", w / "ttt", w / "o", "--form", "fast"], USAGE, "--form"),
    c("calibrate-ctx-zero", lambda w: ["calibrate", w / "par", w / "c.st", "--ctx", 0], USAGE, "--ctx"),
    c("calibrate-samples-zero", lambda w: ["calibrate", w / "par", w / "c.st", "--samples", 0], USAGE,
      "--samples"),
    c("calibrate-percentile-1000", lambda w: ["calibrate", w / "par", w / "c.st", "--percentile", 1000], USAGE,
      "--percentile"),
    c("calibrate-percentile-zero", lambda w: ["calibrate", w / "par", w / "c.st", "--percentile", 0], USAGE,
      "--percentile"),
    c("calibrate-seed-negative", lambda w: ["calibrate", w / "par", w / "c.st", "--seed", -1], USAGE, "--seed"),
    c("calibrate-no-output", lambda w: ["calibrate", w / "par"], USAGE, "Missing argument 'OUT'"),
    c("eval-ctx-zero", lambda w: ["eval", w / "par", "--ctx", 0], USAGE, "--ctx"),
    c("eval-max-tokens-negative", lambda w: ["eval", w / "par", "--max-tokens", -1], USAGE, "--max-tokens"),
    c("report-ctx-zero", lambda w: ["report", w / "par", "--ctx", 0, w / "r"], USAGE, "--ctx"),
    c("report-group-size", lambda w: ["report", w / "par", "--group-size", 48, w / "r"], USAGE, "--group-size"),
    c("report-weights-group", lambda w: ["report", w / "par", "--weights", "int4-rtn-g48", w / "r"], USAGE,
      "int4-rtn-g48"),
    c("quantize-group-size", lambda w: ["quantize", w / "par", w / "q", "--weights", "int4-gptq-g48"], USAGE,
      "int4-gptq-g48"),
    c("quantize-weights", lambda w: ["quantize", w / "par", w / "q", "--weights", "int3"], USAGE, "--weights"),
    c("quantize-group-size-option", lambda w: ["quantize", w / "par", w / "q", "--weights", "int4", "--group-size", "32"],
      USAGE, "No such option"),
    c("quantize-method-option", lambda w: ["quantize", w / "par", w / "q", "--weights", "int4", "--method", "gptq"],
      USAGE, "No such option"),
    c("export-opset-1", lambda w: ["export", w / "par", w / "e", "--opset", 1], USAGE, "--opset"),
    c("export-opset-99", lambda w: ["export", w / "par", w / "e", "--opset", 99], USAGE, "--opset"),
    c("run-max-new-tokens-negative", lambda w: ["run", w / "export", "--prompt", "x", "--max-new-tokens", -1], USAGE,
      "--max-new-tokens"),
    c("run-temperature-negative", lambda w: ["run", w / "export", "--prompt", "x", "--temperature", -1], USAGE,
      "--temperature"),
    c("run-temperature-nan", lambda w: ["run", w / "export", "--prompt", "x", "--temperature", "nan"], USAGE,
      "--temperature"),
    c("run-temperature-inf", lambda w: ["run", w / "export", "--prompt", "x", "--temperature", "inf"], USAGE,
      "--temperature"),
    c("run-threads-zero", lambda w: ["run", w / "export", "--prompt", "x", "--threads", 0], USAGE, "--threads"),
    c("run-threads-negative", lambda w: ["run", w / "export", "--prompt", "x", "--threads", -2], USAGE, "--threads"),
    c("run-seed-negative", lambda w: ["run", w / "export", "--prompt", "x", "--sampling", "seed=-3"], USAGE,
      "--sampling"),
    c("run-top-p-zero", lambda w: ["run", w / "export", "--prompt", "x", "--sampling", "top-p=0"], USAGE, "--sampling"),
    c("run-sampling-no-value", lambda w: ["run", w / "export", "--prompt", "x", "--sampling", "top-k"], USAGE,
      "--sampling"),
    c("run-state-missing", lambda w: ["run", w / "export", "--load-state", w / "nope.st"], ONE, "nope.st"),
    c("run-save-state-over-export", lambda w: ["run", w / "export", "--prompt", "x", "--save-state",
                                                w / "export" / "manifest.json"], ONE, "--save-state"),
    c("run-no-prompt", lambda w: ["run", w / "export"], USAGE, "--prompt"),
    c("create-hidden-zero", lambda w: ["create", w / "m", "--set", "hidden_size=0"], USAGE, "hidden_size"),
    c("create-layers-negative", lambda w: ["create", w / "m", "--set", "num_hidden_layers=-1"], USAGE, "num_hidden_layers"),
    c("create-family", lambda w: ["create", w / "m", "--family", "rnn"], USAGE, "--family"),
    c("bench-seq-lens-zero", lambda w: ["bench", "--seq-lens", "0"], USAGE, "--seq-lens"),
    c("bench-seq-lens-text", lambda w: ["bench", "--seq-lens", "a,b"], USAGE, "--seq-lens"),
    c("bench-gemv-zero", lambda w: ["bench", "--gemv", "0x4096"], USAGE, "--gemv"),
    c("bench-gemm-rows-zero", lambda w: ["bench", "--gemm-rows", "16,0"], USAGE, "--gemm-rows"),
    c("bench-batch-zero", lambda w: ["bench", "--batch", 0], USAGE, "--batch"),
    c("unknown-option", lambda w: ["info", w / "ttt", "--colour"], USAGE, "--colour"),
    # ---- ttt-lm-jax checkpoints: read as data, every record checked, nothing executed
    c("jax-truncated", lambda w: ["convert", w / "jax", w / "out"], ONE, "streaming_params",
      lambda w: (w / "jax" / "streaming_params").write_bytes((w / "jax" / "streaming_params").read_bytes()[:5000])),
    c("jax-empty", lambda w: ["convert", w / "jax", w / "out"], ONE, "not a ttt-lm-jax streaming checkpoint",
      lambda w: (w / "jax" / "streaming_params").write_bytes(b"")),
    c("jax-pickle-in-disguise", lambda w: ["convert", w / "jax", w / "out"], ONE, "not a ttt-lm-jax streaming checkpoint",
      jax_pickle),
    c("jax-pickle-given-as-file", lambda w: ["convert", w / "jax" / "streaming_params", w / "out"], ONE,
      "ttt-lm-jax checkpoint", jax_pickle),
    c("jax-record-not-a-pair", lambda w: ["convert", w / "jax", w / "out"], ONE, "not (key path, bytes)",
      jax_edit(lambda r: r[:3] + [{"weights": [1, 2, 3]}])),
    c("jax-foreign-msgpack", lambda w: ["convert", w / "jax", w / "out"], ONE, "not a ttt-lm-jax streaming",
      lambda w: (w / "jax" / "streaming_params").write_bytes(msgpack.packb({"weights": [1, 2, 3]}))),
    c("jax-object-dtype", lambda w: ["convert", w / "jax", w / "out"], ONE, "dtype 'object'",
      jax_edit(lambda r: [(r[0][0], flax_array([2], "object", b"\0" * 16))] + r[1:])),
    c("jax-bytes-short-of-shape", lambda w: ["convert", w / "jax", w / "out"], ONE, "needs 400 bytes",
      jax_edit(lambda r: [(r[0][0], flax_array([10, 10], "float32", b"\0" * 40))] + r[1:])),
    c("jax-unknown-extension", lambda w: ["convert", w / "jax", w / "out"], ONE, "is not an array",
      jax_edit(lambda r: [(r[0][0], msgpack.packb(msgpack.ExtType(42, b"x")))] + r[1:])),
    c("jax-stray-tensor", lambda w: ["convert", w / "jax", w / "out"], ONE, "wk/kernel is not a parameter",
      jax_edit(lambda r: r + [(["model", "h", "0", "seq_modeling_block", "wk", "kernel"],
                               flax_array([32, 32], "float32", b"\0" * 4096))])),
    c("jax-attention-block", lambda w: ["convert", w / "jax", w / "out"], ONE, "ttt_norm/scale missing",
      jax_edit(lambda r: [x for x in r if x[0][-1] != "ttt_norm/scale"])),
    c("jax-mis-shaped-layer", lambda w: ["convert", w / "jax", w / "out"], ONE, "mis-shaped",
      jax_edit(lambda r: [(k, flax_array([32, 16], "float32", b"\0" * 2048)) if k[-2:] == ["wo", "kernel"]
                          and k[2] == "1" else (k, v) for k, v in r])),
    c("jax-non-finite", lambda w: ["convert", w / "jax", w / "out"], ONE, "streaming_params",
      jax_edit(lambda r: [(k, flax_array([32], "float32", b"\0\0\xc0\x7f" * 32)) if k[-2:] == ["ln_f", "kernel"]
                          else (k, v) for k, v in r])),
    c("jax-two-checkpoints", lambda w: ["convert", w / "jax", w / "out"], ONE, "several ttt-lm-jax checkpoints",
      lambda w: write_jax(w, jax_records(w), "streaming_train_state")),
    c("jax-config-beside-disagrees", lambda w: ["convert", w / "jax", w / "out"], ONE,
      "num_attention_heads 4 disagrees",
      lambda w: (w / "jax" / "model_config.json").write_text(json.dumps(
          {"seq_modeling_block": "ttt_linear", "num_attention_heads": 4}))),
    c("jax-config-beside-other-block", lambda w: ["convert", w / "jax", w / "out"], ONE,
      "seq_modeling_block 'ttt_mlp' disagrees",
      lambda w: (w / "jax" / "model_config.json").write_text(json.dumps({"seq_modeling_block": "ttt_mlp"}))),
    c("jax-config-beside-bad-lr", lambda w: ["convert", w / "jax", w / "out"], ONE, "ttt_base_lr",
      lambda w: (w / "jax" / "model_config.json").write_text(json.dumps(
          {"seq_modeling_block": "ttt_linear", "ttt_base_lr": -1}))),
    c("jax-tokenizer-missing", lambda w: ["convert", w / "jax", w / "out", "--tokenizer", w / "nope.json"], ONE,
      "nope.json"),
    c("jax-tokenizer-not-json", lambda w: ["convert", w / "jax", w / "out", "--tokenizer", w / "blob.bin"], ONE,
      "blob.bin"),
    c("jax-out-is-tokenizer", lambda w: ["convert", w / "jax", w / "text.txt", "--tokenizer", w / "text.txt",
                                          "--force"], ONE, "is the input"),
    # ---- report --onnx needs the parallel form: said before any work
    c("report-onnx-form-exact", lambda w: ["report", w / "ttt", w / "r", "--onnx", "--form", "exact"], ONE,
      "--onnx exports the parallel form"),
    c("report-onnx-exact-model", lambda w: ["report", w / "ex", w / "r", "--onnx"], ONE, "this model is the exact form",
      lambda w: ok("convert", w / "ttt", w / "ex", "--no-report")),
    # ---- numbers read from files: bounded before they are used
    c("run-state-position-huge", lambda w: ["run", w / "export", "--load-state", w / "s.st", "--prompt", "x"], ONE,
      "out of range", lambda w: state_meta(w / "s.st", position=str(10**24))),
    c("run-state-position-past-2-40", lambda w: ["run", w / "export", "--load-state", w / "s.st", "--prompt", "x"],
      ONE, "out of range", lambda w: state_meta(w / "s.st", position=str(2**40 + 1))),
    c("info-export-state-shape-huge", lambda w: ["info", w / "export"], ONE, "state must list",
      lambda w: manifest_edit(w, lambda m: set_path(m, "state.0.shape", [2**20, 2**20, 2**20]))),
    c("info-export-state-dtype", lambda w: ["info", w / "export"], ONE, "state must list",
      lambda w: manifest_edit(w, lambda m: set_path(m, "state.0.dtype", "complex128"))),
    c("eval-ref-logits-token-out-of-range", lambda w: ["eval", w / "par", "--data", w / "text.txt", "--ctx", 32,
                                                       "--ref-logits", w / "logits.st"], ONE, "do not fit together",
      lambda w: edit_safetensors(w / "logits.st", lambda t: t["windows"].__setitem__((0, 5), 10**6))),
    c("eval-ref-logits-windows-float", lambda w: ["eval", w / "par", "--data", w / "text.txt", "--ctx", 32,
                                                  "--ref-logits", w / "logits.st"], ONE, "do not fit together",
      lambda w: edit_safetensors(w / "logits.st", lambda t: t.update(windows=t["windows"].float()))),
    # ---- a reference that is not comparable: refused before any logits are computed
    c("eval-ref-other-vocab", lambda w: ["eval", w / "par", "--ref", w / "v128", "--data", w / "text.txt", "--ctx",
                                         16], ONE, "a vocabulary of 128"),
    c("eval-export-ref-other-vocab", lambda w: ["eval", w / "export", "--ref", w / "v128", "--data", w / "text.txt",
                                                "--ctx", 16], ONE, "a vocabulary of 128"),
    c("eval-ref-other-tokenizer", lambda w: ["eval", w / "par", "--ref", w / "wt", "--data", w / "text.txt", "--ctx",
                                             16], ONE, "other tokens", other_tokenizer),
    # ---- a model a command cannot start from: said from config.json, before its weights are read
    c("report-quantized-model", lambda w: ["report", w / "q8", w / "r"], ONE, "already quantized"),
    c("calibrate-quantized-model", lambda w: ["calibrate", w / "q8", w / "c.st", "--data", w / "text.txt"], ONE,
      "already quantized"),
    c("quantize-quantized-model", lambda w: ["quantize", w / "q8", w / "q"], ONE, "already quantized"),
    c("convert-quantized-model", lambda w: ["convert", w / "q8", w / "o", "--no-report"], ONE, "a quantized model"),
    c("convert-to-its-own-form", lambda w: ["convert", w / "par", w / "o", "--form", "parallel", "--no-report"], ONE,
      "changes nothing"),
    # ---- a format whose idea does not apply to a family: refused, not written under its name
    c("quantize-lact-int12-kv8", lambda w: ["quantize", "lact-tiny", w / "q", "--state", "int12-kv8"], ONE,
      "use --state int12"),
    c("report-lact-int12-kv8", lambda w: ["report", "lact-tiny", w / "r", "--state", "int12-kv8"], ONE,
      "use --state int12"),
    # ---- an export's files against its manifest's record of them
    c("info-export-weights-cut", lambda w: ["info", w / "export"], ONE, "cut short", cut_weights),
    c("run-export-weights-cut", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "cut short", cut_weights),
    c("eval-export-weights-cut", lambda w: ["eval", w / "export", "--data", w / "text.txt"], ONE, "cut short",
      cut_weights),
    c("bench-export-weights-cut", lambda w: ["bench", w / "export", "--pp", 4, "--tg", 2, "-r", 1], ONE, "cut short",
      cut_weights),
    c("web-export-weights-cut", lambda w: ["export", w / "export", w / "web", "--web"], ONE, "cut short", cut_weights),
    c("run-export-weights-changed", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "not the ones the export",
      lambda w: flip_byte(w / "export" / "weights.bin")),
    c("run-export-graph-changed", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "not the ones the export",
      lambda w: flip_byte(w / "export" / "decode.onnx", at=-1)),
    c("run-old-export-weights-cut", lambda w: ["run", w / "export", "--prompt", "x"], ONE, "shorter than the graph",
      lambda w: (manifest_edit(w, lambda m: m.pop("files")), cut_weights(w))),
    # ---- a link out of a folder: never followed into what is published
    c("web-export-weights-link-outside", lambda w: ["export", w / "export", w / "web", "--web"], ONE, "a link to",
      lambda w: (shutil.move(w / "export" / "weights.bin", w / "w.bin"),
                 (w / "export" / "weights.bin").symlink_to(w / "w.bin"), manifest_edit(w, lambda m: m.pop("files")))),
    c("web-export-tokenizer-link-outside", lambda w: ["export", w / "export", w / "web", "--web"], ONE, "a link to",
      lambda w: ((w / "export" / "tokenizer_config.json").unlink(),
                 (w / "export" / "tokenizer_config.json").symlink_to(w / "notes.txt"))),
    # ---- a binary file given as text: refused before it is measured
    c("eval-data-binary", lambda w: ["eval", w / "par", "--data", w / "blob.bin"], ONE, "a binary file, not text"),
    c("calibrate-data-binary", lambda w: ["calibrate", w / "par", w / "c.st", "--data", w / "blob.bin"], ONE,
      "a binary file, not text"),
    c("convert-data-control-bytes", lambda w: ["convert", w / "ttt", w / "out", "--data", w / "noise.txt"], ONE,
      "control characters", lambda w: (w / "noise.txt").write_bytes(bytes(range(1, 256)) * 20)),
    c("unknown-command", lambda w: ["compress", w / "ttt"], USAGE, "compress"),
    c("missing-argument", lambda w: ["convert", w / "ttt"], USAGE, "OUT"),
]


def test_the_suite_covers_every_command_with_over_100_cases():
    assert len(CASES) >= 272 and len({case.id for case in CASES}) == len(CASES)  # docs/cli.md says 272
    commands = {case.args(Path("w"))[0] for case in CASES}
    assert {"create", "convert", "eval", "calibrate", "quantize", "report", "export", "run", "info",
            "bench"} <= commands


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input(case: Case, world: Path, tmp_path: Path):
    w = tmp_path / "w"
    shutil.copytree(world, w, symlinks=True)
    if case.prepare:
        case.prepare(w)
    before = snapshot(w)
    result = invoke(*case.args(w), input=case.stdin)
    assert isinstance(result.exception, SystemExit), f"not a clean exit: {result.exception!r}\n{result.output}"
    assert "Traceback" not in result.output
    assert result.exit_code == case.code, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    assert case.says in errors[0], errors[0]
    if case.code == ONE:
        assert re.search(r"; \S", errors[0]) or "--" in errors[0], f"does not say what to do: {errors[0]}"
    assert snapshot(w) == before, "the file system changed"


# ---- property-based: any config.json, any manifest, ends in a clean error or a working load ------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from edgettt import load  # noqa: E402
from edgettt.errors import EdgetttError  # noqa: E402
from edgettt.runner import Runner  # noqa: E402

JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True)
                           | st.text(max_size=8), lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def leaves(data, prefix=()):
    """Every (path, value) in a JSON document, containers included."""
    yield prefix, data
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    for key, value in items:
        yield from leaves(value, prefix + (key,))


def replaced(data, path, value):
    data = json.loads(json.dumps(data))
    if not path:  # the whole document: deleting it leaves null
        return None if value is DELETE else value
    target = data
    for key in path[:-1]:
        target = target[key]
    if value is DELETE and isinstance(target, dict):
        target.pop(path[-1], None)
    else:
        target[path[-1]] = None if value is DELETE else value
    return data


@PROPERTY
@given(data=st.data())
def test_any_config_loads_or_is_refused_in_one_line(world, tmp_path, data):
    model = tmp_path / "m"
    shutil.rmtree(model, ignore_errors=True)
    shutil.copytree(world / "par", model)
    config = json.loads((model / "config.json").read_text())
    key = data.draw(st.sampled_from(sorted(config) + ["new_key"]))
    value = data.draw(JSON_VALUES | st.just(DELETE) | st.integers(0, 10**12))
    (model / "config.json").write_text(json.dumps(replaced(config, (key,), value)))
    try:
        loaded = load(model)
    except EdgetttError as exc:
        assert "\n" not in str(exc) and str(model) in str(exc)
        return
    assert loaded.config.hidden_size == 32 and loaded.config.num_hidden_layers == LAYERS


@PROPERTY
@given(data=st.data())
def test_any_manifest_runs_or_is_refused_in_one_line(world, tmp_path, data):
    export = tmp_path / "e"
    if not export.exists():
        shutil.copytree(world / "export", export)
    manifest = json.loads((world / "export" / "manifest.json").read_text())
    path, _ = data.draw(st.sampled_from(list(leaves(manifest))))
    value = data.draw(JSON_VALUES | st.just(DELETE))
    (export / "manifest.json").write_text(json.dumps(replaced(manifest, path, value)))
    try:
        runner = Runner(export)
        "".join(runner.generate("ab", max_new_tokens=2))
    except EdgetttError as exc:
        assert "\n" not in str(exc)


def test_a_manifest_value_with_a_line_break_is_refused_in_one_line(world, tmp_path):
    """The property above once found it: a graph input's dtype "\\n" in the manifest made a two-line error
    (the message quoted it); EdgetttError now writes line breaks it quotes as \\n."""
    export = tmp_path / "e"
    shutil.copytree(world / "export", export)
    manifest = json.loads((export / "manifest.json").read_text())
    manifest["graphs"]["decode"]["inputs"][2]["dtype"] = "\n"
    (export / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(EdgetttError) as caught:
        Runner(export)
    assert "\n" not in str(caught.value) and "'\\n' in the manifest" in str(caught.value)
    assert str(EdgetttError("quoted: a\nb\r")) == "quoted: a\\nb\\r"  # whatever a message quotes
