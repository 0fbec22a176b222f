"""The edge runner: generate text from an exported model with onnxruntime and numpy only.

This module must import on a device without torch (tested with torch blocked). Everything it needs
comes from the export directory's `manifest.json`: the graphs, which input takes the token ids,
which output is the logits, the state tensors and the tokenizer.

    runner = Runner("out/")
    for piece in runner.generate("def main(", max_new_tokens=64): print(piece, end="")

The runner holds the sequence it read and generated (`current`, a `state_file.Snapshot`): `generate(...,
resume=True)` and `read` continue it, `snapshot()` / `restore()` rewind it, `save_state` / `load_state`
keep it in a file, `cache_prefix` prefills a prompt's shared beginning once for many prompts.
"""

from __future__ import annotations

import hashlib
import json
import math
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgettt import state_file
from edgettt.errors import EdgetttError  # plain Python: no torch behind it
from edgettt.formats.state_roles import RECURRENT
from edgettt.formats.state_roles import ROLES as STATE_ROLES
from edgettt.outputs import as_output
from edgettt.state_file import RECENT_TOKENS, Snapshot
from edgettt.tokenizer import ByteTokenizer, JsonTokenizer

ROLES = ("input_ids", "logits", "logits_from", "position", "inner_position", "state")
ORT_TYPES = {"tensor(int64)": "int64", "tensor(float)": "float32", "tensor(int8)": "int8", "tensor(uint8)": "uint8",
             "tensor(float16)": "float16"}


def is_export(path) -> bool:
    """Whether `path` is an export's folder (it has a manifest.json)."""
    return (Path(path) / "manifest.json").is_file()


def export_files(directory: Path) -> dict[str, int]:
    """An export's graphs and weights file, by name, with their bytes on disk: what it weighs."""
    return {f.name: f.stat().st_size for f in sorted(Path(directory).iterdir()) if f.suffix in (".onnx", ".bin")}


def export_facts(directory: Path) -> dict:
    """What `info` reports of an export: its manifest's model, its files' bytes on disk, its decode state's bytes
    by role (`formats.state_roles`; "unnamed" in an export from before the manifest named roles)."""
    m = load_manifest(directory)
    source = m.get("source", {})
    files = export_files(directory)
    by_role: dict[str, int] = {}
    for s in m["state"]:
        role = s.get("role", "unnamed")
        by_role[role] = by_role.get(role, 0) + math.prod(s["shape"]) * np.dtype(s["dtype"]).itemsize
    return {"path": str(directory), "export": True, "family": source.get("family"), "form": source.get("form"),
            "model": source.get("model"), "vocab_size": m["vocab_size"], "parameters": source.get("weights"),
            "files_bytes": files, "weights_bytes": sum(files.values()), "activations": m.get("activations"),
            "quantization": source.get("quantization"), "decode_state_bytes_per_sequence": sum(by_role.values()),
            "decode_state_bytes_by_role": by_role, "tokenizer": m["tokenizer"]["type"], "opset": m.get("opset"),
            "distilled_ctx": source.get("distilled_ctx")}


def load_manifest(directory: Path) -> dict:
    """manifest.json of an export, checked against its schema (every key the runner reads)."""
    file = directory / "manifest.json"
    if not directory.is_dir():
        raise EdgetttError(f"{directory}: no such export directory; make one with `edgettt export MODEL {directory}`")
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EdgetttError(f"{directory}: no manifest.json; make an export with `edgettt export MODEL {directory}`") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise EdgetttError(f"{file}: not valid JSON ({exc}); export the model again") from None
    if not isinstance(manifest, dict) or manifest.get("edgettt_export") != 1:
        found = manifest.get("edgettt_export") if isinstance(manifest, dict) else None
        raise EdgetttError(f"{file}: not an edgettt export manifest (format {found!r}); make it with `edgettt export`")
    check_manifest(manifest, directory, file)
    check_files(manifest, directory, file)
    return manifest


# an export's files as its manifest records them (`file_record`): their bytes and a fingerprint of a sample of them,
# so a file cut short, replaced or damaged is named before ONNX Runtime reads it
FINGERPRINT_BLOCKS, FINGERPRINT_BLOCK = 16, 1 << 16
MAX_STATE_ELEMENTS = 1 << 34  # a state tensor's elements a sequence, as a manifest may say (64 GiB of float32)
STATE_DTYPES = ("float32", "float16", "int8", "uint8")


def file_fingerprint(path: Path) -> str:
    """sha256 of a file's size and of 16 blocks of 64 KiB spread evenly over it (the whole file when smaller):
    a few reads whatever the size, and any cut, swap or overwrite of a block it samples changes it."""
    size = path.stat().st_size
    digest = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= FINGERPRINT_BLOCKS * FINGERPRINT_BLOCK:
            digest.update(f.read())
        else:
            for i in range(FINGERPRINT_BLOCKS):
                f.seek((size - FINGERPRINT_BLOCK) * i // (FINGERPRINT_BLOCKS - 1))
                digest.update(f.read(FINGERPRINT_BLOCK))
    return digest.hexdigest()[:16]


def file_record(directory: Path, names) -> dict[str, dict]:
    """The manifest's `files`: each named file's bytes and fingerprint, as written."""
    return {name: {"bytes": (directory / name).stat().st_size, "fingerprint": file_fingerprint(directory / name)}
            for name in sorted(names)}


def check_files(m: dict, directory: Path, file: Path) -> None:
    """The export's files against the manifest's record of them (exports that predate it have none)."""
    files = m.get("files")
    if files is None:
        return
    _require(isinstance(files, dict) and all(isinstance(v, dict) and _positive_int(v.get("bytes"))
                                             and isinstance(v.get("fingerprint"), str) for v in files.values()),
             file, "files must map file names to their bytes and fingerprint")
    for name, record in files.items():
        path = inside_file(directory, name, file, "files")
        size = path.stat().st_size
        _require(size == record["bytes"], file, f"{name} is {size:,} bytes, the export wrote {record['bytes']:,}: cut "
                                                "short or replaced")
        fingerprint = file_fingerprint(path)
        _require(fingerprint == record["fingerprint"], file,
                 f"{name}'s bytes are not the ones the export wrote (fingerprint {fingerprint}, recorded "
                 f"{record['fingerprint']}): changed or damaged")


def write_manifest(directory: Path, manifest: dict) -> None:
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def _require(ok: bool, file: Path, what: str) -> None:
    if not ok:
        raise EdgetttError(f"{file}: {what}; export the model again with `edgettt export`")


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def inside_file(directory: Path, name, file: Path, key: str) -> Path:
    """directory/name, refused unless it is a plain file name inside the export directory."""
    _require(isinstance(name, str) and name != "" and "\0" not in name, file, f"{key} is not a file name")
    path = directory / name
    inside = path.resolve().parent == directory.resolve() and not Path(name).is_absolute() and "/" not in name
    _require(inside, file, f"{key} {name!r} lies outside the export directory; the runner reads only files inside it")
    _require(path.is_file(), file, f"{key} {name!r} is missing from the export directory")
    return path


def check_manifest(m: dict, directory: Path, file: Path) -> None:
    """Every field the runner reads, of the right type; graph and tokenizer files inside `directory`."""
    _require(_positive_int(m.get("vocab_size")), file, "vocab_size is missing or not a positive integer")
    _require(_positive_int(m.get("mini_batch_size")), file, "mini_batch_size is missing or not a positive integer")
    tok = m.get("tokenizer")
    _require(isinstance(tok, dict) and tok.get("type") in ("bytes", "tokenizer.json"), file,
             "tokenizer is missing or of an unknown type (expected 'bytes' or 'tokenizer.json')")
    if tok["type"] == "tokenizer.json":
        inside_file(directory, tok.get("file"), file, "tokenizer.file")
    _require(isinstance(m.get("session_config", {}), dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in m.get("session_config", {}).items()), file,
        "session_config must map names to strings")
    _require(isinstance(m.get("source", {}), dict), file, "source must be an object")
    ctx = m.get("source", {}).get("distilled_ctx")
    _require(ctx is None or _positive_int(ctx), file, "source.distilled_ctx must be a positive integer")
    graphs = m.get("graphs")
    _require(isinstance(graphs, dict) and {"prefill", "decode"} <= set(graphs), file,
             "graphs must name a prefill and a decode graph")
    for kind in ("prefill", "decode"):
        graph = graphs[kind]
        _require(isinstance(graph, dict), file, f"graphs.{kind} must be an object")
        inside_file(directory, graph.get("file"), file, f"graphs.{kind}.file")
        for side in ("inputs", "outputs"):
            io = graph.get(side)
            _require(isinstance(io, list) and all(_io_entry(x) for x in io), file,
                     f"graphs.{kind}.{side} must list objects with name, dtype, shape and a known role")
        _require(any(x["role"] == "input_ids" for x in graph["inputs"]), file, f"graphs.{kind}.inputs has no input_ids")
        _require([x["role"] for x in graph["outputs"]].count("logits") == 1, file,
                 f"graphs.{kind}.outputs must have one logits output")
    decode_in = {x["state"] for x in graphs["decode"]["inputs"] if x["role"] == "state"}
    for kind in ("prefill", "decode"):
        out = {x["state"] for x in graphs[kind]["outputs"] if x["role"] == "state"}
        _require(out == decode_in, file, f"graphs.{kind}.outputs' states differ from decode's state inputs")
    _require(any(x["role"] in ("position", "inner_position") for x in graphs["decode"]["inputs"]), file,
             "graphs.decode.inputs has no position")
    state = m.get("state")
    _require(isinstance(state, list) and all(_state_entry(s) for s in state), file,
             "state must list objects with name, dtype, a known role and a shape of positive integers")
    _require({s["name"] for s in state} == decode_in, file, "state does not name the decode graph's state inputs")


def _state_entry(s) -> bool:
    return (isinstance(s, dict) and isinstance(s.get("name"), str) and s.get("dtype") in STATE_DTYPES
            and s.get("role", RECURRENT) in STATE_ROLES and isinstance(s.get("shape"), list) and all(_positive_int(n) for n in s["shape"])
            and math.prod(s["shape"]) <= MAX_STATE_ELEMENTS)


def _io_entry(x) -> bool:
    return (isinstance(x, dict) and isinstance(x.get("name"), str) and isinstance(x.get("dtype"), str)
            and isinstance(x.get("shape"), list) and x.get("role") in ROLES
            and (x["role"] != "state" or isinstance(x.get("state"), str)))


def check_graph(sess: ort.InferenceSession, graph: dict, vocab_size: int, file: Path) -> None:
    """The loaded graph's inputs and outputs against the manifest: names, order, dtypes, fixed dims."""
    for side, actual in (("inputs", sess.get_inputs()), ("outputs", sess.get_outputs())):
        listed = graph[side]
        _require([a.name for a in actual] == [x["name"] for x in listed], file,
                 f"the manifest's {side} {[x['name'] for x in listed][:4]} are not the graph's "
                 f"{[a.name for a in actual][:4]}")
        for a, x in zip(actual, listed):
            _require(ORT_TYPES.get(a.type) == x["dtype"], file, f"{x['name']} is {a.type} in the graph, "
                                                                  f"{x['dtype']!r} in the manifest")
            fixed = [(g, s) for g, s in zip(a.shape, x["shape"]) if isinstance(g, int) and isinstance(s, int)]
            _require(len(a.shape) == len(x["shape"]) and all(g == s for g, s in fixed), file,
                     f"{x['name']} has shape {a.shape} in the graph, {x['shape']} in the manifest")
            if x["role"] == "logits":
                _require(a.shape[-1] == vocab_size, file, f"the graph's vocabulary {a.shape[-1]} is not the "
                                                          f"manifest's vocab_size {vocab_size}")


def session(path: Path, config: dict[str, str], threads: int | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    for key, value in config.items():  # from the manifest
        options.add_session_config_entry(key, value)
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own types; name the op it lacks
        if "out of bounds or can not be read" in str(exc):  # an export without a record of its files' bytes
            raise EdgetttError(f"{path}: its weights file is shorter than the graph reads: the export is damaged; "
                               "export the model again") from None
        raise EdgetttError(f"{path}: onnxruntime {ort.__version__} cannot load it ({str(exc).splitlines()[0]}); "
                          "a newer onnxruntime may have the operator it names, or export the model again") from None


class Runner:
    def __init__(self, directory, threads: int | None = None):
        self.dir = Path(directory)
        self.manifest = m = load_manifest(self.dir)
        self.prefill_graph = m["graphs"]["prefill"]
        self.decode_graph = m["graphs"]["decode"]
        config = m.get("session_config", {})
        self.prefill = session(self.dir / self.prefill_graph["file"], config, threads)
        self.decode = session(self.dir / self.decode_graph["file"], config, threads)
        for sess, graph in ((self.prefill, self.prefill_graph), (self.decode, self.decode_graph)):
            check_graph(sess, graph, m["vocab_size"], self.dir / graph["file"])
        self.block = m["mini_batch_size"]
        tok = m["tokenizer"]
        self.tokenizer = JsonTokenizer(self.dir / tok["file"]) if tok["type"] == "tokenizer.json" else ByteTokenizer()
        self.current: Snapshot | None = None  # the sequence read so far (`read`, `generate`); None: fresh
        self.prefixes: dict[tuple[int, ...], Snapshot] = {}  # `cache_prefix`

    @staticmethod
    def _role(io: list[dict], role: str) -> str:
        return next(x["name"] for x in io if x["role"] == role)

    @staticmethod
    def _split(graph: dict, outputs: list[np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Output list -> (logits, {state name: array}) by the manifest's roles."""
        logits = next(v for x, v in zip(graph["outputs"], outputs) if x["role"] == "logits")
        return logits, {x["state"]: v for x, v in zip(graph["outputs"], outputs) if x["role"] == "state"}

    def run_prefill(self, ids: np.ndarray, last_only: bool = False) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """ids [B, T] -> (logits [B, T, V], states); `last_only`: logits [B, 1, V] of the last token
        (computed alone where the export can: exports from before `logits_from` compute them all)."""
        feeds = {self._role(self.prefill_graph["inputs"], "input_ids"): ids.astype(np.int64)}
        if any(x["role"] == "logits_from" for x in self.prefill_graph["inputs"]):
            start = ids.shape[1] - 1 if last_only else 0
            feeds[self._role(self.prefill_graph["inputs"], "logits_from")] = np.array(start, dtype=np.int64)
        logits, states = self._split(self.prefill_graph, self.prefill.run(None, feeds))
        return (logits[:, -1:] if last_only else logits), states

    def run_decode(self, ids: np.ndarray, position: int, states: dict) -> tuple[np.ndarray, dict]:
        """ids [B] at absolute `position` -> (logits [B, V], new states)."""
        logits, states = self.decode_tokens(ids.reshape(-1, 1), position, states)
        return logits[:, 0], states

    def decode_tokens(self, ids: np.ndarray, start: int, states: dict) -> tuple[np.ndarray, dict]:
        """Feed ids [B, n] one step at a time from absolute position `start` -> (logits [B, n, V], states).
        The states stay onnxruntime's own values from step to step (an IO binding): no copy into numpy
        and back each token, for a 125m model about 5 MB a step."""
        graph = self.decode_graph
        binding = self.decode.io_binding()
        values = {name: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a)) for name, a in states.items()}
        steps = []
        for t in range(ids.shape[1]):
            for x in graph["inputs"]:
                if x["role"] == "input_ids":
                    binding.bind_cpu_input(x["name"], ids[:, t].astype(np.int64).reshape(-1, 1))
                elif x["role"] in ("position", "inner_position"):  # inner: exports from before the int8
                    position = start + t if x["role"] == "position" else (start + t) % self.block  # state's buckets
                    binding.bind_cpu_input(x["name"], np.array(position, dtype=np.int64))
                else:
                    binding.bind_ortvalue_input(x["name"], values[x["state"]])
            for x in graph["outputs"]:
                binding.bind_output(x["name"], "cpu")
            self.decode.run_with_iobinding(binding)
            outputs = binding.get_outputs()
            steps.append(next(v for x, v in zip(graph["outputs"], outputs) if x["role"] == "logits").numpy()[:, -1])
            values = {x["state"]: v for x, v in zip(graph["outputs"], outputs) if x["role"] == "state"}
            binding.clear_binding_inputs()
            binding.clear_binding_outputs()
        return np.stack(steps, axis=1), {name: v.numpy() for name, v in values.items()}

    # ---- the sequence the runner holds: read text into it, generate from it, keep it

    def reset(self) -> None:
        """Forget the sequence: the next text read starts from the model's initial state."""
        self.current = None

    def snapshot(self) -> Snapshot:
        """A copy of the sequence read so far (restore it to rewind to this point)."""
        if self.current is None:
            raise EdgetttError("snapshot: nothing read yet; read or generate some text first")
        return self.current.copy()

    def restore(self, snapshot: Snapshot) -> None:
        """Continue from `snapshot` (a copy of it: the snapshot can be restored again)."""
        self.current = snapshot.copy()

    def save_state(self, path, force: bool = False) -> None:
        """Write the sequence's state to `path` (a safetensors file; replaces an older state file only
        with `force`), or to an `outputs.Output` planned before the work."""
        out = as_output(path, "state", force, inputs=[self.dir])
        snapshot = self.snapshot()
        with out.write() as tmp:
            state_file.save(snapshot, tmp, self.manifest)

    def load_state(self, path) -> None:
        """Continue from the state in `path`, checked against this export's manifest first."""
        self.current = state_file.load(path, self.manifest, str(self.dir))

    def cache_prefix(self, text: str) -> Snapshot:
        """Prefill `text` once and keep its state: a later `generate` whose prompt starts with it (token for
        token) starts from there and reads only the rest."""
        ids = self._encode(text)
        self.reset()
        self._read(ids)
        self.prefixes[tuple(ids)] = self.snapshot()
        return self.prefixes[tuple(ids)]

    def read(self, text: str) -> None:
        """Append `text` to the sequence (from the initial state when there is none)."""
        self._read(self._encode(text))

    def _encode(self, text: str) -> list[int]:
        ids = self.tokenizer.encode(text)
        if not ids:
            raise EdgetttError("--prompt: the prompt is empty; give at least one character")
        return ids

    def _read(self, ids: list[int]) -> int:
        """The sequence after `ids`: a prefill from a fresh state (or from the longest cached prefix),
        decode steps from a later position. Returns the number of tokens read (less a cached prefix)."""
        if self.current is None:
            cached = max((p for p in self.prefixes if len(p) <= len(ids) and list(p) == ids[:len(p)]), key=len,
                         default=None)
            if cached is not None:
                self.restore(self.prefixes[cached])
                ids = ids[len(cached):]
        if not ids:
            return 0
        if self.current is None:
            logits, states = self.run_prefill(np.array([ids]), last_only=True)
            self.current = Snapshot(len(ids), states, logits[0, -1], ids[-RECENT_TOKENS:])
            return len(ids)
        logits, states = self.decode_tokens(np.array([ids]), self.current.position, self.current.states)
        recent = (self.current.recent + ids)[-RECENT_TOKENS:]
        self.current = Snapshot(self.current.position + len(ids), states, logits[0, -1], recent)
        return len(ids)

    def generate(self, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0, seed: int = 0,
                 stats: dict | None = None, sampling: Sampling | None = None, stop: tuple[str, ...] = (),
                 resume: bool = False):
        """Yield text pieces as they decode; greedy when temperature is 0 (`sampling` adds top-k, top-p and
        the repetition penalty). Ends early when the text produced so far ends with one of `stop`
        (the stop string is yielded). Starts from the initial state (or a cached prefix), or with `resume`
        continues the sequence held (a loaded state, the last generation: `prompt` may then be empty).
        Afterwards the runner holds the sequence read and generated. Fills `stats` (timings)."""
        if not resume:
            self.reset()
        if self.current is None or prompt:
            ids = self._encode(prompt)
        else:
            ids = []
        sampling = sampling or Sampling(temperature=temperature)
        rng = np.random.default_rng(seed)
        push = self.tokenizer.decode_stream()
        t0 = time.perf_counter()
        read = self._read(ids)
        t1 = time.perf_counter()
        generated, text = [], ""
        for _ in range(max_new_tokens):
            token = sampling.pick(self.current.logits, self.current.recent, rng)
            generated.append(token)
            piece = push([token])
            text += piece
            yield piece
            self._read([token])
            if any(text.endswith(s) for s in stop if s):
                break
        yield push([], final=True)  # bytes of an unfinished character, as replacement characters
        t2 = time.perf_counter()
        if stats is not None:
            stats.update(prompt_tokens=len(ids), read_tokens=read, new_tokens=len(generated), tokens=generated,
                         position=self.current.position, prefill_seconds=t1 - t0, decode_seconds=t2 - t1,
                         prefill_tokens_per_s=read / max(t1 - t0, 1e-9),
                         decode_tokens_per_s=len(generated) / max(t2 - t1, 1e-9))


@dataclass
class Sampling:
    """How the next token is chosen from the logits, as llama.cpp's samplers do it: the repetition
    penalty over the last `repeat_last_n` tokens (positive logits divided by it, negative multiplied;
    1 turns it off; llama.cpp's default 1.1 over 64), a cap on runs of one token (`max_run` in a row,
    0: no cap), then greedy (temperature 0) or top-k, top-p and temperature sampling.

    Why the cap: greedy decoding of the tiny byte-level models falls into runs of spaces after a line
    break (ttt-linear-tiny-parallel, "The print() function": 36 spaces in a row, the space's logit 4
    above the next token's at every step), which a penalty of 1.1 does not break (it would take 2,
    which distorts everything else); 16 in a row still allows any indentation Python text has."""

    temperature: float = 0.0
    top_k: int = 0  # 0: all tokens
    top_p: float = 1.0
    repetition_penalty: float = 1.1
    repeat_last_n: int = 64
    max_run: int = 16

    def pick(self, logits: np.ndarray, history: list[int], rng: np.random.Generator) -> int:
        z = logits.astype(np.float64)
        if self.repetition_penalty != 1.0 and self.repeat_last_n > 0 and history:
            seen = np.unique(np.asarray(history[-self.repeat_last_n:]))
            z[seen] = np.where(z[seen] > 0, z[seen] / self.repetition_penalty, z[seen] * self.repetition_penalty)
        if self.max_run and len(history) >= self.max_run and len(set(history[-self.max_run:])) == 1:
            z[history[-1]] = -np.inf  # a run of max_run: something else next
        if self.temperature <= 0:
            return int(np.argmax(z))
        if 0 < self.top_k < z.size:
            z[z < np.partition(z, -self.top_k)[-self.top_k]] = -np.inf
        p = np.exp((z - z.max()) / self.temperature)
        p /= p.sum()
        if self.top_p < 1.0:
            order = np.argsort(-p)
            keep = np.cumsum(p[order]) - p[order] < self.top_p  # the smallest set whose mass reaches top_p
            p[order[~keep]] = 0
            p /= p.sum()
        return int(rng.choice(p.size, p=p))


def peak_memory_mb() -> float:
    """Peak resident memory of this process (Linux and macOS report it in different units)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
