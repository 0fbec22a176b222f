"""An export as onnxruntime-genai opens it: `model.onnx`, `genai_config.json` and the tokenizer files.

genai runs one decoder graph for a prompt and for every decoded token: input_ids [B, T] and
position_ids [B, T] in, logits [B, T, V] out, and for a hybrid model's recurrent layers two state
tensors a layer, `past_key_values.{i}.conv_state` [B, C, K-1] and `past_key_values.{i}.recurrent_state`
[B, H, Dk, Dv], which genai allocates, fills with zeros at the start and feeds back after each run
(its src/models/recurrent_state.cpp finds them by these names; every dimension but the batch fixed,
one shape and type for all layers). An edgettt layer keeps several tensors (TTT-Linear S1 and A1,
TTT-MLP two levels and conv tails, LaCT fast weights, momentum and a window of keys and values),
which start from learned values, not zeros. So, faithfully to both:

- recurrent_state holds what a layer has learned so far (by role, `formats.state_roles`: TTT's recurrent state
  S1 [B, H, Dk, Dv] as it is, a reshape, no copy; LaCT's first fast weights), conv_state the layer's other tensors flat, one after another [B, 1, M] (TTT-Linear: A1 alone, again a
  reshape); a layer with one tensor gets a [B, 1, 1] conv_state placeholder passed through;
- genai's zeros are read only at position 0, where the graph starts from the model's initial state
  whatever it is given: the first run of a generation, or after genai rewinds to the start;
- the graph is made of the export's own graphs, not traced again: at position 0 the prefill graph over
  the prompt; at any later position a Loop of the decode graph, a token a step. genai therefore
  computes what `edgettt run` computes, token for token.

A state kept in other types (int12's float16 keys and values, int8) has no place in genai's float32
state tensors; such an export is written without genai's files (the manifest says why).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from edgettt.formats.state_roles import HELD_ACROSS_COMMITS
from edgettt.onnx_files import all_graphs
from edgettt.runner import session
from edgettt.tokenizer import byte_level_tokenizer_json

GENAI_GRAPH = "model.onnx"
GENAI_CONFIG = "genai_config.json"
PAST, PRESENT = "past_key_values.%d.key", "present.%d.key"  # genai derives the state names from these


def state_names(template: str, layer: int) -> tuple[str, str]:
    """(conv_state, recurrent_state) of `layer` as genai names them from a key template."""
    stem = template.rsplit(".", 1)[0] % layer
    return f"{stem}.conv_state", f"{stem}.recurrent_state"


def unsupported(manifest: dict) -> str | None:
    """Why genai cannot run this export, or None."""
    other = sorted({s["dtype"] for s in manifest["state"]} - {"float32"})
    if other:
        return (f"its state keeps {', '.join(other)} tensors and genai binds float32 ones; export a model "
                "quantized with --state fp32")
    shapes = {str(layout(manifest, i)[2:]) for i in range(layer_count(manifest))}
    if len(shapes) != 1:
        return "its layers keep states of different sizes and genai gives every layer one shape"
    return None


def layer_count(manifest: dict) -> int:
    return 1 + max(s["layer"] for s in manifest["state"])


def layer_specs(manifest: dict, layer: int) -> list[dict]:
    """A layer's state tensors, what it has learned so far first (its recurrent state or fast weights, by role;
    an export from before the manifest named roles: its first tensor)."""
    specs = [s for s in manifest["state"] if s["layer"] == layer]
    held = [s for s in specs if s.get("role") in HELD_ACROSS_COMMITS][:1]
    return held + [s for s in specs if s not in held]


def layout(manifest: dict, layer: int) -> tuple[dict, list[dict], list[int], list[int]]:
    """How a layer's tensors sit in genai's two: (the tensor recurrent_state holds, the tensors conv_state
    holds flat one after another, recurrent_state's shape, conv_state's shape; batch as 0)."""
    first, *rest = layer_specs(manifest, layer)
    shape = first["shape"] if len(first["shape"]) == 3 else [1, 1, int(np.prod(first["shape"]))]
    return first, rest, [0, *shape], [0, 1, max(1, sum(int(np.prod(s["shape"])) for s in rest))]


# ---- composing the graph


def _renamed(graph: onnx.GraphProto, prefix: str) -> onnx.GraphProto:
    """A copy of `graph` with every value name (and those of its subgraphs) prefixed: two graphs' names
    then live side by side in one model."""
    graph = onnx.GraphProto.FromString(graph.SerializeToString())

    def name(n: str) -> str:
        return prefix + n if n else n

    for g in all_graphs(graph):
        for v in (*g.input, *g.output, *g.value_info, *g.initializer, *g.sparse_initializer):
            v.name = name(v.name)
        for node in g.node:
            node.input[:] = [name(n) for n in node.input]
            node.output[:] = [name(n) for n in node.output]
            node.name = name(node.name)
    return graph


def _const(name: str, value, dtype=np.int64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype=dtype), name))


def _pack(manifest: dict, names: dict[str, str], prefix: str) -> tuple[list, list[str]]:
    """Nodes putting each layer's state tensors `names[state]` into genai's two (`layout`); returns the
    nodes and the names of [recurrent_0, conv_0, recurrent_1, ...] (a conv_state that holds nothing is the
    main graph's placeholder: left out)."""
    nodes, packed = [], []
    for i in range(layer_count(manifest)):
        first, rest, rec_shape, conv_shape = layout(manifest, i)
        q = f"{prefix}{i}."
        nodes += [_const(q + "rec_shape", rec_shape),
                  helper.make_node("Reshape", [names[first["name"]], q + "rec_shape"], [q + "rec"])]
        packed.append(q + "rec")
        if rest:
            nodes.append(_const(q + "flat", [0, -1]))
            nodes += [helper.make_node("Reshape", [names[r["name"]], q + "flat"], [f"{q}{r['name']}.flat"]) for r in rest]
            nodes += [helper.make_node("Concat", [f"{q}{r['name']}.flat" for r in rest], [q + "cat"], axis=1),
                      _const(q + "conv_shape", conv_shape),
                      helper.make_node("Reshape", [q + "cat", q + "conv_shape"], [q + "conv"])]
            packed.append(q + "conv")
    return nodes, packed


def _unpack(manifest: dict, prefix: str) -> tuple[list, dict[str, str]]:
    """Nodes taking each layer's tensors out of genai's two (`layout`); returns (nodes, {state: name})."""
    nodes, names = [], {}
    for i in range(layer_count(manifest)):
        first, rest, _, _ = layout(manifest, i)
        conv, rec = state_names(PAST, i)
        q = f"{prefix}{i}."
        nodes += [_const(q + first["name"] + ".shape", [0, *first["shape"]]),
                  helper.make_node("Reshape", [rec, q + first["name"] + ".shape"], [q + first["name"]])]
        names[first["name"]] = q + first["name"]
        if rest:
            nodes += [_const(q + "flat", [0, -1]), _const(q + "axis1", [1]),
                      helper.make_node("Reshape", [conv, q + "flat"], [q + "cat"])]
        offset = 0
        for r in rest:
            n, t = int(np.prod(r["shape"])), q + r["name"]
            nodes += [_const(t + ".lo", [offset]), _const(t + ".hi", [offset + n]), _const(t + ".shape", [0, *r["shape"]]),
                      helper.make_node("Slice", [q + "cat", t + ".lo", t + ".hi", q + "axis1"], [t + ".f"]),
                      helper.make_node("Reshape", [t + ".f", t + ".shape"], [t])]
            names[r["name"]] = t
            offset += n
    return nodes, names


def _role(graph: dict, side: str, role: str) -> str:
    return next(x["name"] for x in graph[side] if x["role"] == role)


def _states(graph: dict, side: str) -> dict[str, str]:
    return {x["state"]: x["name"] for x in graph[side] if x["role"] == "state"}


def _fresh_branch(manifest: dict, prefill: onnx.GraphProto) -> onnx.GraphProto:
    """At position 0: the prefill graph over the prompt, every token's logits, the states packed."""
    io = manifest["graphs"]["prefill"]
    p = "p/"
    nodes = [helper.make_node("Identity", ["input_ids"], [p + _role(io, "inputs", "input_ids")])]
    if any(x["role"] == "logits_from" for x in io["inputs"]):
        nodes.append(_const(p + _role(io, "inputs", "logits_from"), 0))
    nodes += list(prefill.node)
    pack, packed = _pack(manifest, {k: p + v for k, v in _states(io, "outputs").items()}, p + "pack/")
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in [p + _role(io, "outputs", "logits"), *packed]]
    return helper.make_graph(nodes + pack, "fresh", [], outputs, initializer=list(prefill.initializer))


def _steps_branch(manifest: dict, decode: onnx.GraphProto) -> onnx.GraphProto:
    """At a later position: the decode graph a token at a time (an ONNX Loop over the T tokens)."""
    io = manifest["graphs"]["decode"]
    d = "d/"
    states_in, states_out = _states(io, "inputs"), _states(io, "outputs")
    order = [s["name"] for s in manifest["state"]]
    body_nodes = [
        helper.make_node("Gather", ["input_ids", d + "step"], [d + "ids"], axis=1),
        _const(d + "axis1", [1]),
        helper.make_node("Unsqueeze", [d + "ids", d + "axis1"], [d + _role(io, "inputs", "input_ids")]),
        helper.make_node("Add", ["genai.position", d + "step"], [d + _role(io, "inputs", "position")]),
        *decode.node,
        helper.make_node("Identity", [d + "cond"], [d + "cond_out"]),
    ]
    inputs = [helper.make_tensor_value_info(d + "step", TensorProto.INT64, []),
              helper.make_tensor_value_info(d + "cond", TensorProto.BOOL, []),
              *[helper.make_tensor_value_info(d + states_in[s], TensorProto.FLOAT, None) for s in order]]
    outputs = [helper.make_tensor_value_info(d + "cond_out", TensorProto.BOOL, []),
               *[helper.make_tensor_value_info(d + states_out[s], TensorProto.FLOAT, None) for s in order],
               helper.make_tensor_value_info(d + _role(io, "outputs", "logits"), TensorProto.FLOAT, None)]
    body = helper.make_graph(body_nodes, "token", inputs, outputs, initializer=list(decode.initializer))
    unpack, names = _unpack(manifest, "s/unpack/")
    nodes = [*unpack,
             helper.make_node("Shape", ["input_ids"], ["s/T"], start=1, end=2),
             helper.make_node("Squeeze", ["s/T"], ["s/T0"]),
             helper.make_node("Constant", [], ["s/true"], value=numpy_helper.from_array(np.array(True), "s/true")),
             helper.make_node("Loop", ["s/T0", "s/true", *[names[s] for s in order]],
                              [*[f"s/final.{s}" for s in order], "s/logits_steps"], body=body),
             # [T, B, 1, V] -> [B, T, V]
             _const("s/axis2", [2]),
             helper.make_node("Squeeze", ["s/logits_steps", "s/axis2"], ["s/logits_tbv"]),
             helper.make_node("Transpose", ["s/logits_tbv"], ["s/logits"], perm=[1, 0, 2])]
    pack, packed = _pack(manifest, {s: f"s/final.{s}" for s in order}, "s/pack/")
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ["s/logits", *packed]]
    return helper.make_graph(nodes + pack, "steps", [], outputs)


def _dims(shape: list[int]) -> list:
    return ["batch", *shape[1:]]


def genai_model(directory: Path, manifest: dict) -> onnx.ModelProto:
    """model.onnx for genai from the export in `directory` (its graphs' weights stay in weights.bin)."""
    graphs = manifest["graphs"]
    prefill = onnx.load(str(directory / graphs["prefill"]["file"]), load_external_data=False)
    decode = onnx.load(str(directory / graphs["decode"]["file"]), load_external_data=False)
    p_graph, d_graph = _renamed(prefill.graph, "p/"), _renamed(decode.graph, "d/")
    V = manifest["vocab_size"]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"]),
              helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "tokens"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "tokens", V])]
    nodes = [_const("genai.zero", 0),
             # the position of the first token; genai gives every row the same
             helper.make_node("Gather", ["position_ids", "genai.zero"], ["genai.column"], axis=1),
             helper.make_node("Gather", ["genai.column", "genai.zero"], ["genai.position"], axis=0),
             helper.make_node("Equal", ["genai.position", "genai.zero"], ["genai.fresh"])]
    presents = []
    for i in range(layer_count(manifest)):
        (conv_in, rec_in), (conv_out, rec_out) = state_names(PAST, i), state_names(PRESENT, i)
        _, rest, rec_shape, conv_shape = layout(manifest, i)
        inputs += [helper.make_tensor_value_info(conv_in, TensorProto.FLOAT, _dims(conv_shape)),
                   helper.make_tensor_value_info(rec_in, TensorProto.FLOAT, _dims(rec_shape))]
        outputs += [helper.make_tensor_value_info(conv_out, TensorProto.FLOAT, _dims(conv_shape)),
                    helper.make_tensor_value_info(rec_out, TensorProto.FLOAT, _dims(rec_shape))]
        presents += [rec_out, conv_out] if rest else [rec_out]
        if not rest:  # the placeholder genai wants beside the recurrent_state
            nodes.append(helper.make_node("Identity", [conv_in], [conv_out]))
    nodes.append(helper.make_node("If", ["genai.fresh"], ["logits", *presents],
                                  then_branch=_fresh_branch(manifest, p_graph),
                                  else_branch=_steps_branch(manifest, d_graph)))
    graph = helper.make_graph(nodes, "edgettt-genai", inputs, outputs)
    model = helper.make_model(graph, opset_imports=list(decode.opset_import), ir_version=decode.ir_version)
    model.producer_name = "edgettt"
    return model


# ---- the folder


def genai_config(manifest: dict) -> dict:
    """genai_config.json: a "decoder" model whose KV names lead genai to the recurrent state names."""
    L = layer_count(manifest)
    return {
        "model": {
            "type": "decoder", "vocab_size": manifest["vocab_size"], "context_length": (1 << 31) - 1,
            # genai ends a generation at the end-of-text token (`edgettt run` at max_new_tokens or --stop);
            # pad_token_id is the id genai skips at a prompt's end: one no tokenizer makes
            "bos_token_id": _token(manifest, "bos_token_id"), "eos_token_id": _token(manifest, "eos_token_id"),
            "pad_token_id": manifest["vocab_size"],
            "decoder": {
                "filename": GENAI_GRAPH, "session_options": dict(manifest.get("session_config", {})),
                # a TTT model has no attention heads or KV cache; genai reads these numbers but sizes
                # no cache from them when the graph has no past key inputs
                "num_hidden_layers": L, "num_attention_heads": 1, "num_key_value_heads": 1, "head_size": 1,
                "hidden_size": 1,
                "inputs": {"input_ids": "input_ids", "position_ids": "position_ids", "past_key_names": PAST,
                           "past_value_names": PAST.replace("key", "value")},
                "outputs": {"logits": "logits", "present_key_names": PRESENT,
                            "present_value_names": PRESENT.replace("key", "value")},
            },
        },
        "search": {"max_length": 1 << 16, "do_sample": False, "num_beams": 1},
    }


def _token(manifest: dict, key: str) -> int:
    """A special token's id from the manifest; 0 where the model has none (genai needs an id)."""
    value = manifest.get(key)
    return value if isinstance(value, int) and 0 <= value < manifest["vocab_size"] else 0


def write_genai_files(directory: Path, manifest: dict) -> dict:
    """model.onnx, genai_config.json and the tokenizer files genai reads into `directory`; returns the
    manifest's "genai" entry."""
    why = unsupported(manifest)
    if why is not None:
        return {"written": False, "why": why}
    onnx.save(genai_model(directory, manifest), str(directory / GENAI_GRAPH))
    (directory / GENAI_CONFIG).write_text(json.dumps(genai_config(manifest), indent=2) + "\n")
    if manifest["tokenizer"]["type"] == "bytes":  # genai reads a tokenizer.json: one of 256 byte tokens
        (directory / "tokenizer.json").write_text(byte_level_tokenizer_json())
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
         "clean_up_tokenization_spaces": False}, indent=2) + "\n")
    return {"written": True, "graph": GENAI_GRAPH, "config": GENAI_CONFIG,
            "state": "per layer: recurrent_state holds the layer's first tensor of `state`, conv_state the others, "
                     "flat one after another (a [B, 1, 1] placeholder when there are none)"}


def run_graph(directory: Path, manifest: dict, ids: np.ndarray, split: int) -> np.ndarray:
    """Logits [B, T, V] of model.onnx in onnxruntime as genai drives it: ids[:, :split] from genai's zero
    state at position 0, then the rest in one run from the state that left (a second prompt)."""
    sess = session(directory / GENAI_GRAPH, manifest.get("session_config", {}))
    B, states = ids.shape[0], {}
    for i in range(layer_count(manifest)):
        (conv, rec), (_, _, rec_shape, conv_shape) = state_names(PAST, i), layout(manifest, i)
        states[conv], states[rec] = np.zeros([B, *conv_shape[1:]], np.float32), np.zeros([B, *rec_shape[1:]], np.float32)
    logits = []
    for lo, hi in ((0, split), (split, ids.shape[1])):
        positions = np.broadcast_to(np.arange(lo, hi, dtype=np.int64), (B, hi - lo))
        out = sess.run(None, {"input_ids": ids[:, lo:hi].astype(np.int64), "position_ids": positions, **states})
        logits.append(out[0])
        states = {name.replace("present", "past_key_values"): v for name, v in
                  zip([o.name for o in sess.get_outputs()][1:], out[1:])}
    return np.concatenate(logits, axis=1)
