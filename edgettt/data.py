"""Sample text for measuring models: a file, `-` for standard input, or the built-in sample.

The built-in sample is a fixed slice of the English reference documentation that every CPython
carries (`pydoc_data.topics`), so no download is needed. Every text is named with a fingerprint
(bytes, sha256 prefix) in the reports that use it.
"""

from __future__ import annotations

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import EdgetttError

BUILTIN_SAMPLE = "python-docs-sample"
SAMPLE_BYTES = 16384


@dataclass
class Text:
    name: str
    data: bytes

    def fingerprint(self) -> dict:
        return {"name": self.name, "bytes": len(self.data), "sha256": hashlib.sha256(self.data).hexdigest()[:16]}


def builtin_sample() -> bytes:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[key] for key in sorted(topics))
    return text.encode("utf-8")[:SAMPLE_BYTES]


def read_text(spec: str | None) -> Text:
    """`None` or the built-in name -> the built-in sample; `-` -> stdin; otherwise a file path."""
    if spec is None or spec == BUILTIN_SAMPLE:
        return Text(BUILTIN_SAMPLE, builtin_sample())
    if spec == "-":
        data = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        path = Path(spec)
        if not path.is_file():
            raise EdgetttError(f"{spec}: no such file; give a text file, '-' for standard input, "
                               f"or '{BUILTIN_SAMPLE}'")
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise EdgetttError(f"{spec}: cannot read ({exc.strerror})") from None
        name = str(path)
    if not data:
        raise EdgetttError(f"{name}: the text is empty; give a text with some content")
    return Text(name, data)


def token_windows(ids: list[int], ctx: int, max_tokens: int | None = None) -> torch.Tensor:
    """Cut token ids into non-overlapping windows of ctx + 1 tokens (inputs and next-token targets).

    Returns [N, ctx + 1] int64; a text shorter than one window gives one shorter window.
    """
    if max_tokens is not None:
        ids = ids[:max_tokens + 1]
    if len(ids) < 2:
        raise EdgetttError("the text has fewer than 2 tokens; give a longer text")
    n = max(1, (len(ids) - 1) // ctx)
    width = min(ctx, len(ids) - 1) + 1
    return torch.tensor([ids[i * ctx:i * ctx + width] for i in range(n)], dtype=torch.int64)
