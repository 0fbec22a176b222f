"""Tokenizers that travel with a model: byte-level by default, `tokenizer.json` when the directory has one.

Both offer `encode(str) -> list[int]`, `decode(list[int]) -> str`, `decode_stream()` (for text
shown as it is generated) and `save(directory)`. Plain Python (the tokenizers library only for a
tokenizer.json): the ONNX runner, which must import without torch, uses them too.
"""

from __future__ import annotations

import codecs
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from edgettt.errors import EdgetttError


class ByteTokenizer:
    """Token id = UTF-8 byte value (0..255); needs a vocabulary of at least 256."""

    name = "bytes"

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> list[int]:
        return list(data)

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def decode_stream(self):
        """push(ids, final=False) -> the new text, as soon as it is valid UTF-8 (a character may span
        several tokens)."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        return lambda ids, final=False: decoder.decode(bytes(i for i in ids if 0 <= i < 256), final=final)

    def save(self, directory: Path) -> None:
        pass  # the default needs no file


class JsonTokenizer:
    """A Hugging Face `tokenizer.json`, read with the tokenizers library."""

    name = "tokenizer.json"

    def __init__(self, file: Path):
        self.file = file
        try:
            self._tok = Tokenizer.from_file(str(file))
        except Exception as exc:  # the library raises plain Exception on bad files
            raise EdgetttError(f"{file}: not a readable tokenizer.json ({exc}); give a Hugging Face tokenizer.json") from None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def check_fits(self, vocab_size: int) -> "JsonTokenizer":
        """This tokenizer, if every id it makes has a row in a model of `vocab_size` tokens."""
        if self.vocab_size > vocab_size:
            raise EdgetttError(f"{self.file}: the tokenizer has {self.vocab_size:,} tokens, the model's vocabulary "
                               f"{vocab_size:,}: ids from {vocab_size:,} on would have no embedding; give the "
                               "tokenizer the model was trained with")
        return self

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_bytes(self, data: bytes) -> list[int]:
        return self.encode(data.decode("utf-8", errors="replace"))

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids)

    def decode_stream(self):
        """push(ids, final=False) -> the new text: the whole sequence decoded again, its new tail returned
        (a token's text can depend on the tokens around it)."""
        seen: list[int] = []
        shown = [""]

        def push(ids, final=False):
            seen.extend(ids)
            text = self._tok.decode(seen)
            new, shown[0] = text[len(shown[0]):], text
            return new
        return push

    def save(self, directory: Path) -> None:
        shutil.copyfile(self.file, directory / "tokenizer.json")


def byte_level_tokenizer_json() -> str:
    """`ByteTokenizer` as a Hugging Face tokenizer.json (for runtimes that read only that, e.g.
    onnxruntime-genai): a BPE of 256 byte tokens without merges, token id = byte value, the bytes shown
    as GPT-2's printable characters."""
    shown = pre_tokenizers.ByteLevel.alphabet()  # GPT-2's 256 characters, one a byte
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]
    char = {b: chr(b) for b in printable}
    char.update({b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in char)})
    assert set(char.values()) == set(shown)
    tok = Tokenizer(models.BPE(vocab={char[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str(pretty=True)


def load_tokenizer(directory: Path, vocab_size: int):
    """The tokenizer of a model directory, or None when it has none and its vocabulary is under 256."""
    file = directory / "tokenizer.json"
    if file.exists():
        return JsonTokenizer(file)
    return ByteTokenizer() if vocab_size >= 256 else None
