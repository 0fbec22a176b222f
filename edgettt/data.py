"""Sample text: the `--data` argument of every command, and how text is cut into windows.

`--data` takes a text file, a directory of .txt/.md files, `-` for standard input, or a built-in
name, none of which needs a download:
    python-docs[:train|:val|:test]  the English reference documentation every CPython carries
                                    (`pydoc_data.topics`), split by whole topics into about 80/10/10
                                    of the bytes; topics that share a paragraph stay in one part,
                                    so the parts never overlap (see `docs_splits`);
                                    bare `python-docs` is the test part
    python-docs-sample              a fixed 16 KB slice of the test part: quick reports
    python-stdlib                   the standard library's own .py sources (no tests, and not
                                    pydoc_data, which holds the documentation), for training
Every text is named with a fingerprint (bytes, sha256 prefix) in the reports that use it.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from pydoc_data.topics import topics

from edgettt.errors import EdgetttError

DOCS = "python-docs"
SAMPLE = "python-docs-sample"
STDLIB = "python-stdlib"
SPLITS = ("train", "val", "test")
SAMPLE_BYTES = 16384
BUILTIN_NAMES = (DOCS, *(f"{DOCS}:{s}" for s in SPLITS), SAMPLE, STDLIB)


@dataclass
class Text:
    name: str
    data: bytes

    def fingerprint(self) -> dict:
        return {"name": self.name, "bytes": len(self.data), "sha256": hashlib.sha256(self.data).hexdigest()[:16]}


SHARED_PARAGRAPH = 40  # bytes: shorter paragraphs ("Changed in version 3.8.") may repeat anywhere


def topic_groups(topics: dict[str, str]) -> list[list[str]]:
    """Topics that share a paragraph, as groups (sorted). The reference embeds sections in several
    topics (`for`, `while`, `try` are also inside `compound`; `augassign` inside `assignment`):
    splitting those apart would put the same text in two parts."""
    parent = {key: key for key in topics}

    def root(key: str) -> str:
        while parent[key] != key:
            key = parent[key]
        return key

    first_seen: dict[str, str] = {}
    for key in sorted(topics):
        for paragraph in topics[key].split("\n\n"):
            paragraph = paragraph.strip()
            if len(paragraph) < SHARED_PARAGRAPH:
                continue
            other = first_seen.setdefault(paragraph, key)
            parent[root(key)] = root(other)
    groups: dict[str, list[str]] = {}
    for key in sorted(topics):
        groups.setdefault(root(key), []).append(key)
    return list(groups.values())


def docs_splits(topics: dict[str, str]) -> dict[str, str]:
    """Topic -> part. Groups of topics that share text (`topic_groups`), in the order of their first
    name's sha256, fill test, then val, each up to 10% of the bytes (a group that would overflow
    the part waits for the next); the rest is train. Whole groups, so no paragraph is in two parts."""
    groups = sorted(topic_groups(topics), key=lambda g: hashlib.sha256(g[0].encode()).hexdigest())
    total = sum(len(v) for v in topics.values())
    filled = {"test": 0, "val": 0}
    out = {}
    for group in groups:
        size = sum(len(topics[key]) for key in group)
        part = next((p for p in filled if filled[p] + size <= 0.1 * total), "train")
        if part in filled:
            filled[part] += size
        out.update(dict.fromkeys(group, part))
    return out


def python_docs(split: str) -> bytes:
    splits = docs_splits(topics)
    return "\n\n".join(topics[key] for key in sorted(topics) if splits[key] == split).encode("utf-8")


def python_stdlib() -> bytes:
    root = Path(sysconfig.get_paths()["stdlib"])
    # pydoc_data/topics.py is the reference documentation itself, test part included: not a source
    skip = {"site-packages", "test", "tests", "idlelib", "lib2to3", "pydoc_data"}
    files = sorted(f for f in root.rglob("*.py") if not skip & set(f.relative_to(root).parts))
    return b"\n".join(f.read_bytes() for f in files)


def builtin_text(name: str) -> bytes:
    if name == SAMPLE:
        return python_docs("test")[:SAMPLE_BYTES]
    if name == STDLIB:
        return python_stdlib()
    split = name.partition(":")[2] or "test"
    return python_docs(split)


def read_text(spec: str | None) -> Text:
    """None -> the built-in sample; a built-in name; `-` -> stdin; a directory; a file."""
    spec = SAMPLE if spec is None else spec
    if spec in BUILTIN_NAMES:
        return Text(f"{DOCS}:test" if spec == DOCS else spec, builtin_text(spec))
    if spec == "-":
        data, name = sys.stdin.buffer.read(), "<stdin>"
    else:
        data, name = _read_path(Path(spec)), spec
    if not data:
        raise EdgetttError(f"{name}: the text is empty; give a text with some content")
    _check_is_text(data, name)
    return Text(name, data)


def _check_is_text(data: bytes, name: str, probe: int = 1 << 16) -> None:
    """Refuse a binary file given as text (an executable, an archive, a weights file), judged by its first
    64 KiB: a NUL byte, or more than 5% control characters. Bytes that are not UTF-8 are fine: a
    byte-level model reads any text (Latin-1 too). Measured on a binary, a model gives a meaningless number."""
    head = data[:probe]
    nul = head.find(b"\0")
    if nul >= 0:
        raise EdgetttError(f"{name}: a binary file, not text (a NUL byte at offset {nul}); give a text file")
    controls = sum(head.count(bytes([c])) for c in range(1, 32) if c not in (9, 10, 12, 13))
    if controls > 0.05 * len(head):
        raise EdgetttError(f"{name}: a binary file, not text ({100 * controls / len(head):.0f}% control "
                           "characters); give a text file")


def text_path(spec: str | None) -> Path | None:
    """The file or folder a TEXT spec reads, or None for standard input and the built-in texts."""
    if spec is None or spec == "-" or spec in BUILTIN_NAMES:
        return None
    return Path(spec)


def _read_path(path: Path) -> bytes:
    try:
        if path.is_dir():
            files = sorted(f for f in path.rglob("*") if f.suffix in (".txt", ".md") and f.is_file())
            if not files:
                raise EdgetttError(f"{path}: directory has no .txt or .md files; give a file or a folder of text files")
            return b"\n\n".join(f.read_bytes() for f in files)
        if path.is_file():
            return path.read_bytes()
    except OSError as exc:
        raise EdgetttError(f"{path}: cannot read ({exc.strerror})") from None
    raise EdgetttError(f"{path}: no such file or directory; give a text file, a directory of .txt/.md files, "
                       f"'-' for standard input, or one of {', '.join(BUILTIN_NAMES)}")


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
