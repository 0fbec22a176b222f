"""The files of an export: one weights file both graphs share, and the bytes a graph needs.

`edgettt export` traces prefill.onnx and decode.onnx separately, and each would carry its own copy of
every weight (the export twice the model's size, and a graph over 2 GB cannot be one protobuf file).
`share_weights` moves every initializer of 1 KiB or more out of both graphs into `weights.bin`, once
per distinct content (a weight the graphs hold in two shapes, such as a tied embedding's table, is
stored once), each at a 4 KiB-aligned offset (pages ONNX Runtime can map). The graphs refer to it
by ONNX's external data (location, offset, length). The exporter's per-node stack traces go too. `graph_bytes` is what one graph needs on disk:
its file and the parts of the weights file it refers to.

Uses `onnx` only (no torch): the runner's side reads sizes with it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import onnx
import onnx.external_data_helper
from onnx import numpy_helper

WEIGHTS_FILE = "weights.bin"
MIN_EXTERNAL_BYTES = 1024
ALIGN = 4096


def all_graphs(graph):
    """`graph` and every graph inside its nodes (Scan / If / Loop bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from all_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from all_graphs(g)


def _initializers(graph):
    for g in all_graphs(graph):
        yield from g.initializer


def _drop_node_metadata(graph) -> None:
    """The exporter's per-node stack traces and scopes: most of a graph file's bytes, no use to a runtime."""
    for g in all_graphs(graph):
        for node in g.node:
            del node.metadata_props[:]
            node.ClearField("doc_string")


def _refer(tensor, offset: int, length: int) -> None:
    tensor.ClearField("raw_data")
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", WEIGHTS_FILE), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def share_weights(directory: Path, graphs: list[str]) -> None:
    """Rewrite the `graphs` in `directory` (each may have external data of its own, which is removed)
    to keep their large initializers in one `weights.bin`."""
    directory = Path(directory)
    models = [onnx.load(str(directory / name), load_external_data=False) for name in graphs]
    own_data = {directory / e.value for m in models for t in _initializers(m.graph) for e in t.external_data
                if e.key == "location"}
    for model in models:
        onnx.external_data_helper.load_external_data_for_model(model, str(directory))
    placed: dict[bytes, tuple[int, int]] = {}
    with open(directory / WEIGHTS_FILE, "wb") as out:
        for model in models:
            for tensor in _initializers(model.graph):
                raw = tensor.raw_data if tensor.HasField("raw_data") else numpy_helper.to_array(tensor).tobytes()
                if len(raw) < MIN_EXTERNAL_BYTES:
                    continue
                key = hashlib.sha256(raw).digest()
                if key not in placed:
                    out.write(b"\0" * (-out.tell() % ALIGN))
                    placed[key] = (out.tell(), len(raw))
                    out.write(raw)
                for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
                    tensor.ClearField(field)
                _refer(tensor, *placed[key])
    for model, name in zip(models, graphs):
        _drop_node_metadata(model.graph)
        onnx.save(model, str(directory / name))
    for path in own_data:
        path.unlink(missing_ok=True)


def graph_bytes(path: Path) -> int:
    """Bytes on disk one graph needs: its file plus the distinct external data ranges it refers to."""
    path = Path(path)
    model = onnx.load(str(path), load_external_data=False)
    ranges = set()
    for tensor in _initializers(model.graph):
        entries = {e.key: e.value for e in tensor.external_data}
        if "location" in entries:
            ranges.add((entries["location"], int(entries.get("offset", 0)), int(entries.get("length", 0)) or
                        (path.parent / entries["location"]).stat().st_size))
    return path.stat().st_size + sum(length for _, _, length in ranges)
