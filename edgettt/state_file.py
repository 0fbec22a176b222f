"""A sequence's state as the runner keeps it, and its file: what a text read so far leaves behind.

A TTT model's whole memory of a text is a few fixed-size tensors a layer, so a conversation can be
saved, restored, shared between prompts and rewound by copying them. `Snapshot` is that memory as
the edge runner holds it (numpy, no torch); `save` and `load` write and read it as a safetensors file:
the state tensors (batch 1) under the manifest's state names, the last token's logits, and in the
metadata the export it belongs to (its source fingerprint and state specs: shapes, types and roles), the position and the
last tokens (which the repetition penalty looks back at). `load` checks all of it against the
export's manifest before anything is used: a state from another export, truncated or of other
shapes or types is a one-line error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from edgettt.errors import EdgetttError

STATE_FORMAT = "edgettt-state"
RECENT_TOKENS = 64  # the tokens a snapshot keeps for the repetition penalty (its window, llama.cpp's 64)
MAX_POSITION = 2**40  # a position read from a file: beyond any text (10^12 tokens), within the graphs' int64


@dataclass
class Snapshot:
    """The state after `position` tokens: the state tensors by name ([1, ...] each), the logits [V] of
    the last token read (what the next token is picked from) and the last tokens read or generated."""

    position: int
    states: dict[str, np.ndarray]
    logits: np.ndarray
    recent: list[int] = field(default_factory=list)

    def copy(self) -> "Snapshot":
        return replace(self, states={k: v.copy() for k, v in self.states.items()}, logits=self.logits.copy(),
                       recent=list(self.recent))

    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.states.values()) + self.logits.nbytes


def _specs(manifest: dict) -> dict[str, dict]:
    """Each state tensor's shape (batch 1), dtype and role (`formats.state_roles`; none in an export from before
    the manifest named roles), by name."""
    return {s["name"]: {"shape": [1, *s["shape"]], "dtype": s["dtype"], **({"role": s["role"]} if "role" in s else {})}
            for s in manifest["state"]}


def save(snapshot: Snapshot, path: Path, manifest: dict) -> None:
    """Write `snapshot` to `path` (the caller stages the path: see `outputs.Output`)."""
    tensors = {f"state.{name}": np.ascontiguousarray(v) for name, v in snapshot.states.items()}
    tensors["logits"] = np.ascontiguousarray(snapshot.logits, dtype=np.float32)
    meta = {"format": STATE_FORMAT, "version": "1", "fingerprint": str(manifest["source"].get("fingerprint")),
            "position": str(snapshot.position), "recent": json.dumps(snapshot.recent),
            "state": json.dumps(_specs(manifest), sort_keys=True)}
    save_file(tensors, str(path), metadata=meta)


def load(path, manifest: dict, export: str) -> Snapshot:
    """The snapshot in `path`, checked against the export's manifest (`export`: its folder, for messages)."""
    path = Path(path)

    def bad(what: str):
        raise EdgetttError(f"{path}: {what}; give a state saved from {export} (`edgettt run {export} ... --save-state "
                           "FILE`)")

    if not path.is_file():
        raise EdgetttError(f"{path}: no such state file; save one with `edgettt run {export} --save-state FILE`")
    try:
        tensors = load_file(str(path))
        with open(path, "rb") as f:  # the metadata: load_file gives only the tensors
            meta = json.loads(f.read(int.from_bytes(f.read(8), "little"))).get("__metadata__") or {}
    except (SafetensorError, OSError, ValueError, UnicodeDecodeError) as exc:
        bad(f"not a readable state file ({str(exc).splitlines()[0][:120]}); it may be truncated")
    if meta.get("format") != STATE_FORMAT:
        bad("not an edgettt state file")
    if meta.get("fingerprint") != str(manifest["source"].get("fingerprint")):
        bad(f"saved from another model (fingerprint {meta.get('fingerprint')}, this export's "
            f"{manifest['source'].get('fingerprint')})")
    specs = _specs(manifest)
    names = {k.removeprefix("state.") for k in tensors if k.startswith("state.")}
    if names != set(specs):
        bad(f"its state tensors {sorted(names)[:4]}... are not this export's {sorted(specs)[:4]}...")
    try:
        saved = json.loads(meta.get("state", "{}"))
    except ValueError:
        saved = None
    if not isinstance(saved, dict):
        bad("its list of state tensors is not readable")
    for name, spec in specs.items():
        role = saved.get(name, {}).get("role") if isinstance(saved.get(name), dict) else None
        if role is not None and "role" in spec and role != spec["role"]:
            bad(f"state {name} was saved as the {role}, this export keeps its {spec['role']} there")
        t = tensors[f"state.{name}"]
        if list(t.shape) != spec["shape"] or str(t.dtype) != spec["dtype"]:
            bad(f"state {name} is {t.dtype} {list(t.shape)}, this export keeps {spec['dtype']} {spec['shape']}")
    logits = tensors.get("logits")
    if logits is None or logits.shape != (manifest["vocab_size"],) or logits.dtype != np.float32:
        bad(f"its logits are not float32 [{manifest['vocab_size']}]")
    try:
        position, recent = int(meta.get("position", "")), json.loads(meta.get("recent", ""))
    except ValueError:
        bad("its position or recent tokens are not numbers")
    if not 1 <= position <= MAX_POSITION or not isinstance(recent, list) or not all(
            isinstance(t, int) and 0 <= t < manifest["vocab_size"] for t in recent):
        bad(f"its position or recent tokens are out of range (a position from 1 to 2**40, tokens below "
            f"{manifest['vocab_size']})")
    return Snapshot(position, {name: tensors[f"state.{name}"] for name in specs}, logits, recent[-RECENT_TOKENS:])
