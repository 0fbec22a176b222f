"""Text sources: built-in parts that never overlap, files, directories, stdin, fingerprints."""

import pytest
import torch

from edgettt import EdgetttError
from edgettt.data import SPLITS, docs_splits, python_docs, read_text, token_windows, topic_groups


def test_docs_splits_are_disjoint_deterministic_and_cover_everything():
    from pydoc_data.topics import topics

    splits = docs_splits(topics)
    assert set(splits) == set(topics) and set(splits.values()) == set(SPLITS)
    assert docs_splits(dict(reversed(list(topics.items())))) == splits  # order of the dict does not matter
    sizes = {s: len(python_docs(s)) for s in SPLITS}
    total = sum(len(v) for v in topics.values())
    assert sizes["test"] > 0.08 * total and sizes["val"] > 0.08 * total and sizes["train"] > 0.6 * total  # whole topics: parts are near, not at, 80/10/10
    parts = {s: python_docs(s) for s in SPLITS}
    for key, text in topics.items():  # each topic's text lies in its own part only
        snippet = text[:200].encode()
        assert [s for s in SPLITS if snippet in parts[s]] == [splits[key]]


def test_no_paragraph_of_the_held_out_parts_is_in_the_training_text():
    """The reference repeats sections across topics (`for` is also inside `compound`), and
    pydoc_data/topics.py, a standard library file, holds all of it: neither may leak into training."""
    from pydoc_data.topics import topics

    groups = topic_groups(topics)
    assert any({"compound", "for"} <= set(g) for g in groups)
    train = python_docs("train")
    stdlib = read_text("python-stdlib").data
    for part in ("test", "val"):
        paragraphs = [p.strip() for p in python_docs(part).split(b"\n\n")]
        long = [p for p in paragraphs if len(p) >= 80]
        assert len(long) > 100
        assert not [p for p in long if p in train], part
        assert not [p for p in long if p.split(b"\n")[0] in stdlib and len(p.split(b"\n")[0]) >= 60], part


def test_builtin_names_and_fingerprints():
    test = read_text("python-docs")
    assert test.name == "python-docs:test" and test.data == read_text("python-docs:test").data
    sample = read_text(None)
    assert sample.name == "python-docs-sample" and test.data.startswith(sample.data)
    fp = sample.fingerprint()
    assert fp["bytes"] == len(sample.data) and len(fp["sha256"]) == 16
    stdlib = read_text("python-stdlib")
    assert b"def " in stdlib.data and len(stdlib.data) > 1_000_000


def test_file_directory_and_stdin(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.md").write_text("beta")
    (tmp_path / "c.py").write_text("ignored")
    assert read_text(str(tmp_path)).data == b"alpha\n\nbeta"
    assert read_text(str(tmp_path / "a.txt")).data == b"alpha"
    import io
    import sys

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"from stdin")))
    assert read_text("-").data == b"from stdin"


def test_bad_text_sources(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(EdgetttError, match="the text is empty"):
        read_text(str(tmp_path / "empty.txt"))
    with pytest.raises(EdgetttError, match="no such file or directory"):
        read_text(str(tmp_path / "nope"))
    (tmp_path / "d").mkdir()
    with pytest.raises(EdgetttError, match="no .txt or .md files"):
        read_text(str(tmp_path / "d"))


def test_invalid_utf8_is_fine_for_byte_level_models(tmp_path, tiny_model):
    from edgettt.evaluation import encode

    (tmp_path / "bad.txt").write_bytes(b"ok \xff\xfe bytes")
    model = tiny_model(vocab_size=256)
    ids = encode(model, read_text(str(tmp_path / "bad.txt")))
    assert ids == list(b"ok \xff\xfe bytes")
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([ids]))).all()


def test_token_windows():
    w = token_windows(list(range(10)), ctx=3)
    assert w.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert token_windows(list(range(3)), ctx=8).tolist() == [[0, 1, 2]]
    assert token_windows(list(range(100)), ctx=4, max_tokens=8).shape == (2, 5)
