"""What every family's config does with its config.json: read it as a JSON object, check its sizes, switches and
numbers, split the keys a config knows from those it keeps for a round trip, write it back; and the width of
flash-linear-attention's MLP, which LaCT and DeltaNet share."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from edgettt.errors import EdgetttError


def read_config_object(path: Path) -> dict:
    """config.json as a dict of keys, or a one-line error naming what is wrong with the file."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise EdgetttError(f"{path}: missing; a model directory needs config.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise EdgetttError(f"{path}: not readable JSON ({exc}); check the file") from None
    if not isinstance(raw, dict):
        raise EdgetttError(f"{path}: expected a JSON object of config keys; fix the config")
    return raw


def check_sizes_and_scalars(config, limits: dict[str, int], positive: tuple[str, ...], bad) -> None:
    """Integer sizes within `limits` (from 1) and positive finite numbers, as every family's config
    checks them; `bad(what)` makes the error."""
    for key, limit in limits.items():
        value = getattr(config, key)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise bad(f"{key} must be an integer from 1 to {limit:,}, got {value!r}")
    for key in positive:
        value = getattr(config, key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise bad(f"{key} must be a positive finite number, got {value!r}")


def check_fits_memory(need: int, source: str) -> None:
    """Refuse, before allocating, a model whose float32 weights (`need` bytes) would not fit in this machine's
    memory (every family's `create`)."""
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        raise EdgetttError(f"{source}: a model of this size needs about {need / 2**30:.1f} GiB of float32 weights, "
                           f"more than this machine's {have / 2**30:.1f} GiB; choose smaller sizes")


def check_switches(config, keys, bad) -> None:
    """Each of `keys` true or false."""
    for key in keys:
        if not isinstance(getattr(config, key), bool):
            raise bad(f"{key} must be true or false, got {getattr(config, key)!r}")


def check_intermediate_size(value, bad) -> None:
    """An MLP width given (an integer in range) or left to the config's rule (null)."""
    if value is not None and (not isinstance(value, int) or not 1 <= value <= 2**18):
        raise bad(f"intermediate_size must be an integer from 1 to {2**18:,} or null, got {value!r}")


def fla_mlp_size(config) -> int:
    """flash-linear-attention's GatedMLP width: `intermediate_size`, or 2/3 of hidden_ratio x hidden rounded up to
    256."""
    if config.intermediate_size is not None:
        return config.intermediate_size
    size = int(config.hidden_size * (config.hidden_ratio or 4) * 2 / 3)
    return 256 * ((size + 255) // 256)


def known_and_extra(cls, raw: dict[str, Any]) -> tuple[dict, dict]:
    """A dataclass config's keys of `raw` (its fields but `extra`), and the rest but `model_type` (kept as they were
    for a round trip)."""
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    return ({k: v for k, v in raw.items() if k in names},
            {k: v for k, v in raw.items() if k not in names and k != "model_type"})


def config_dict(config, model_type: str) -> dict[str, Any]:
    """A public-layout config (LaCT, DeltaNet) as config.json holds it: its extra keys, its fields, a quantized
    model's quantization, its model_type."""
    out = dict(config.extra)
    out.update({f.name: getattr(config, f.name) for f in dataclasses.fields(config)
                if f.name not in ("extra", "quantization")})
    if config.quantization:
        out["quantization"] = config.quantization
    out["model_type"] = model_type
    return out
