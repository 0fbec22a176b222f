"""`edgettt bench` on an onnxruntime-genai model folder (the anchor a user would pick instead: a
transformer with its KV cache), timed by the same workers and table as edgettt's exports."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx import save

from edgettt.cli import cli

pytest.importorskip("onnxruntime_genai")  # in the test extras: CI runs these


def tiny_genai_model(folder: Path, vocab: int = 64, hidden: int = 8, head: int = 4) -> None:
    """A one-layer decoder in onnxruntime-genai's folder layout: embedding, logits, a KV cache."""
    rng = np.random.default_rng(0)
    inits = [nh.from_array(rng.standard_normal((vocab, hidden)).astype(np.float32), "embed"),
             nh.from_array(rng.standard_normal((hidden, vocab)).astype(np.float32), "head"),
             nh.from_array(rng.standard_normal((hidden, head)).astype(np.float32), "wk"),
             nh.from_array(np.array([1], np.int64), "axis1")]
    nodes = [h.make_node("Gather", ["embed", "input_ids"], ["x"]), h.make_node("MatMul", ["x", "head"], ["logits"]),
             h.make_node("MatMul", ["x", "wk"], ["k"]), h.make_node("Unsqueeze", ["k", "axis1"], ["k4"])]
    for kind in ("key", "value"):
        nodes.append(h.make_node("Concat", [f"past_key_values.0.{kind}", "k4"], [f"present.0.{kind}"], axis=2))
    kv = lambda name, seq: h.make_tensor_value_info(name, TP.FLOAT, ["batch", 1, seq, head])  # noqa: E731
    graph = h.make_graph(nodes, "tiny", [h.make_tensor_value_info("input_ids", TP.INT64, ["batch", "seq"]),
                                         h.make_tensor_value_info("attention_mask", TP.INT64, ["batch", "total"]),
                                         kv("past_key_values.0.key", "past"), kv("past_key_values.0.value", "past")],
                         [h.make_tensor_value_info("logits", TP.FLOAT, ["batch", "seq", vocab]),
                          kv("present.0.key", "total"), kv("present.0.value", "total")], inits)
    folder.mkdir(parents=True)
    save(h.make_model(graph, opset_imports=[h.make_opsetid("", 21)]), str(folder / "model.onnx"))
    config = {"model": {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "type": "llama", "vocab_size": vocab,
                        "context_length": 256,
                        "decoder": {"filename": "model.onnx", "head_size": head, "hidden_size": hidden,
                                    "num_attention_heads": 1, "num_key_value_heads": 1, "num_hidden_layers": 1,
                                    "session_options": {"provider_options": []},
                                    "inputs": {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                               "past_key_names": "past_key_values.%d.key",
                                               "past_value_names": "past_key_values.%d.value"},
                                    "outputs": {"logits": "logits", "present_key_names": "present.%d.key",
                                                "present_value_names": "present.%d.value"}}},
              "search": {"max_length": 256, "past_present_share_buffer": False, "do_sample": False, "num_beams": 1}}
    (folder / "genai_config.json").write_text(json.dumps(config, indent=2))


def test_speed_times_an_onnxruntime_genai_folder_beside_an_edgettt_model(tmp_path):
    tiny_genai_model(tmp_path / "anchor")
    result = CliRunner().invoke(cli, ["bench", str(tmp_path / "anchor"), "ttt-linear-tiny-parallel", "--pp", "8",
                                      "--tg", "4", "--depth", "0,9", "-r", "1", "--threads", "1",
                                      "--json", str(tmp_path / "s.json")])
    assert result.exit_code == 0, result.output
    rows = {(r["path"], r["test"]): r for r in json.loads((tmp_path / "s.json").read_text())["rows"]}
    anchor = str(tmp_path / "anchor")
    assert {r["engine"] for (p, _), r in rows.items() if p == anchor} == {"onnxruntime-genai"}
    assert rows[(anchor, "tg4@d9")]["tokens_per_s"] > 0 and rows[(anchor, "pp8")]["decode_nodes"] == 6
    assert rows[("ttt-linear-tiny-parallel", "pp8")]["engine"] == "torch"


def test_a_genai_folder_without_onnxruntime_genai_is_a_one_line_error(tmp_path, monkeypatch):
    import sys

    tiny_genai_model(tmp_path / "anchor")
    monkeypatch.setitem(sys.modules, "onnxruntime_genai", None)  # as if not installed
    result = CliRunner().invoke(cli, ["bench", str(tmp_path / "anchor"), "--pp", "8", "--tg", "4"])
    assert result.exit_code != 0 and "pip install onnxruntime-genai" in result.output
    assert "Traceback" not in result.output
