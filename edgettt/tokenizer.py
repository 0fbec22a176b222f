"""Tokenizers that travel with a model: byte-level by default, `tokenizer.json` when the directory has one.

Both offer `encode(str) -> list[int]`, `decode(list[int]) -> str` and `save(directory)`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .errors import EdgetttError


class ByteTokenizer:
    """Token id = UTF-8 byte value (0..255); needs a vocabulary of at least 256."""

    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> list[int]:
        return list(data)

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def save(self, directory: Path) -> None:
        pass  # the default needs no file


class JsonTokenizer:
    """A Hugging Face `tokenizer.json`, read with the tokenizers library."""

    name = "tokenizer.json"

    def __init__(self, file: Path):
        from tokenizers import Tokenizer

        self.file = file
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises plain Exception on bad files
            raise EdgetttError(f"{file}: not a readable tokenizer.json ({exc})") from None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_bytes(self, data: bytes) -> list[int]:
        return self.encode(data.decode("utf-8", errors="replace"))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def save(self, directory: Path) -> None:
        shutil.copyfile(self.file, directory / "tokenizer.json")


def load_tokenizer(directory: Path, vocab_size: int):
    """The tokenizer of a model directory, or None when it has none and its vocabulary is under 256."""
    file = directory / "tokenizer.json"
    if file.exists():
        return JsonTokenizer(file)
    return ByteTokenizer() if vocab_size >= 256 else None
