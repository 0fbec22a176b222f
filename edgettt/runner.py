"""The edge runner: generate text from an exported model with onnxruntime and numpy only.

This module must import on a device without torch (tested with torch blocked). Everything it needs
comes from the export directory's `manifest.json`: the graphs, which input takes the token ids,
which output is the logits, the state tensors and the tokenizer.

    runner = Runner("out/")
    for piece in runner.generate("def main(", max_new_tokens=64): print(piece, end="")
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from .errors import EdgetttError  # plain Python: no torch behind it

class ByteCodec:
    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode_stream(self):
        """Bytes in, text out as soon as it is valid UTF-8 (a character may span several tokens)."""
        import codecs

        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda ids, final=False: decoder.decode(bytes(ids), final=final)


class JsonCodec:
    def __init__(self, file: Path):
        from tokenizers import Tokenizer  # only for exports that carry a tokenizer.json

        self.tok = Tokenizer.from_file(str(file))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def decode_stream(self):
        seen: list[int] = []
        shown = [""]

        def push(ids, final=False):
            seen.extend(ids)
            text = self.tok.decode(seen)
            new, shown[0] = text[len(shown[0]):], text
            return new
        return push


def load_manifest(directory: Path) -> dict:
    file = directory / "manifest.json"
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise EdgetttError(f"{directory}: no manifest.json; make an export with `edgettt export MODEL {directory}`") from None
    except json.JSONDecodeError as exc:
        raise EdgetttError(f"{file}: not valid JSON ({exc})") from None
    if manifest.get("edgettt_export") != 1:
        raise EdgetttError(f"{file}: not an edgettt export manifest (format {manifest.get('edgettt_export')!r})")
    return manifest


def session(path: Path, config: dict[str, str], threads: int | None = None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    for key, value in config.items():  # from the manifest
        options.add_session_config_entry(key, value)
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own types; name the op it lacks
        raise EdgetttError(f"{path}: onnxruntime {ort.__version__} cannot load it ({str(exc).splitlines()[0]}); "
                          "a newer onnxruntime may have the operator it names") from None


class Runner:
    def __init__(self, directory, threads: int | None = None):
        self.dir = Path(directory)
        self.manifest = m = load_manifest(self.dir)
        self.prefill_graph = m["graphs"]["prefill"]
        self.decode_graph = m["graphs"]["decode"]
        config = m.get("session_config", {})
        self.prefill = session(self.dir / self.prefill_graph["file"], config, threads)
        self.decode = session(self.dir / self.decode_graph["file"], config, threads)
        self.block = m["mini_batch_size"]
        tok = m["tokenizer"]
        self.codec = JsonCodec(self.dir / tok["file"]) if tok["type"] == "tokenizer.json" else ByteCodec()

    @staticmethod
    def _role(io: list[dict], role: str) -> str:
        return next(x["name"] for x in io if x["role"] == role)

    @staticmethod
    def _split(graph: dict, outputs: list[np.ndarray]) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Output list -> (logits, {state name: array}) by the manifest's roles."""
        logits = next(v for x, v in zip(graph["outputs"], outputs) if x["role"] == "logits")
        return logits, {x["state"]: v for x, v in zip(graph["outputs"], outputs) if x["role"] == "state"}

    def run_prefill(self, ids: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """ids [B, T] -> (logits [B, T, V], states)."""
        outputs = self.prefill.run(None, {self._role(self.prefill_graph["inputs"], "input_ids"): ids.astype(np.int64)})
        return self._split(self.prefill_graph, outputs)

    def run_decode(self, ids: np.ndarray, position: int, states: dict) -> tuple[np.ndarray, dict]:
        """ids [B] at absolute `position` -> (logits [B, V], new states)."""
        feeds = {}
        for x in self.decode_graph["inputs"]:
            if x["role"] == "input_ids":
                feeds[x["name"]] = ids.astype(np.int64).reshape(-1, 1)
            elif x["role"] == "position":
                feeds[x["name"]] = np.array(position, dtype=np.int64)
            elif x["role"] == "inner_position":  # exports from before the position buckets of the int8 state
                feeds[x["name"]] = np.array(position % self.block, dtype=np.int64)
            else:
                feeds[x["name"]] = states[x["state"]]
        logits, states = self._split(self.decode_graph, self.decode.run(None, feeds))
        return logits[:, -1], states

    def decode_tokens(self, ids: np.ndarray, start: int, states: dict) -> tuple[np.ndarray, dict]:
        """Feed ids [B, n] one step at a time from absolute position `start` -> (logits [B, n, V], states)."""
        steps = []
        for t in range(ids.shape[1]):
            logits, states = self.run_decode(ids[:, t], start + t, states)
            steps.append(logits)
        return np.stack(steps, axis=1), states

    def generate(self, prompt: str, max_new_tokens: int = 64, temperature: float = 0.0, seed: int = 0,
                 stats: dict | None = None):
        """Yield text pieces as they decode; greedy when temperature is 0. Fills `stats` (timings)."""
        ids = self.codec.encode(prompt)
        if not ids:
            raise EdgetttError("the prompt is empty: give at least one character")
        rng = np.random.default_rng(seed)
        push = self.codec.decode_stream()
        t0 = time.perf_counter()
        logits, states = self.run_prefill(np.array([ids]))
        logits = logits[:, -1]
        t1 = time.perf_counter()
        position, generated = len(ids), []
        for _ in range(max_new_tokens):
            token = pick(logits[0], temperature, rng)
            generated.append(token)
            yield push([token])
            logits, states = self.run_decode(np.array([token]), position, states)
            position += 1
        yield push([], final=True)  # bytes of an unfinished character, as replacement characters
        t2 = time.perf_counter()
        if stats is not None:
            stats.update(prompt_tokens=len(ids), new_tokens=len(generated), tokens=generated,
                         prefill_seconds=t1 - t0, decode_seconds=t2 - t1,
                         prefill_tokens_per_s=len(ids) / max(t1 - t0, 1e-9),
                         decode_tokens_per_s=len(generated) / max(t2 - t1, 1e-9))


def pick(logits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    if temperature <= 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temperature
    p = np.exp(z - z.max())
    return int(rng.choice(p.size, p=p / p.sum()))


def peak_memory_mb() -> float:
    """Peak resident memory of this process (Linux and macOS report it in different units)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
