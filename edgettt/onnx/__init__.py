"""Export a converted (parallel-form) model to ONNX Runtime (DESIGN section 6).

    export_model(model, "out/", name="ttt-linear-tiny-parallel")

writes `prefill.onnx` (input ids [batch, tokens] -> logits and every state tensor after the text),
`decode.onnx` (one token, the position inside the mini-batch and the states -> logits and the new
states; a mini-batch commit is arithmetic, not a branch), `weights.bin` (the weights both graphs
share, `onnx_files.py`) and `manifest.json`, everything the numpy + onnxruntime runner
(`edgettt.runner`) needs. Quantized weights go out as the ONNX Runtime operators that read their
bytes (each weight format names its operator: see `quant/weight_formats.py`), by default on int8
activations (`ACTIVATIONS`); an int8 state crosses the graph boundary as int8 (S - S0 over the
calibrated per-row scales, `onnx_ops`).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io as io_module
import logging
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

from edgettt.checkpoint import model_fingerprint
from edgettt.errors import EdgetttError
from edgettt.evaluation import release_freed_memory
from edgettt.families.base import fuse_input_projections
from edgettt.families.base import LanguageModel, State
from edgettt.families.registry import family_of
from edgettt.onnx_files import WEIGHTS_FILE, share_weights
from edgettt.ops import onnx_export
from edgettt.outputs import as_output
from edgettt.progress import bar
from edgettt.quant.apply import set_module, weight_bits
from edgettt.quant.linear import QuantLinear, TiedEmbedding, stacked_float_linear
from edgettt.formats.state_formats import state_format
from edgettt.runner import file_record, write_manifest
from edgettt.web import add_web_files
from edgettt.onnx import genai, onnx_ops
from edgettt.onnx.verify import verify

EXPORT_FORMAT = 1
DEFAULT_OPSET = 21  # QuantizeLinear / DequantizeLinear per axis, as ONNX Runtime >= 1.17 reads them
SESSION_CONFIG = {"session.disable_quant_qdq": "1"}


class ExportLinear(nn.Module):
    """A QuantLinear as the custom op its ONNX node is made from (its weight format's `export_matmul`);
    holds the quantized bytes as that operator reads them. `activations`: see `ACTIVATIONS`."""

    def __init__(self, q: QuantLinear, activations: str = "float", stacked: list[QuantLinear] = (),
                 normalized_input: bool = False):
        super().__init__()
        parts = [q, *stacked]  # layers of one input, their output rows stacked (`fuse_input_projections`)
        self.format, self.K, self.N, self.group = q.format, q.in_features, sum(p.out_features for p in parts), q.group_size
        self.requested, self.graph = activations, "decode"  # the graph being traced (`trace_graph`)
        exported = [q.format.export_tensors(p.tensors()) for p in parts]
        for name in exported[0]:
            self.register_buffer(name, torch.cat([t[name] for t in exported]))
        self.float_rows = None  # the dequantized table, for a tied head whose format has no gather op
        # whether the input is a block's RMS-normed hidden state (the stacked q/k/v and gate/up): a
        # narrow range that one int8 scale per tensor covers (prefill "int8-tensor"). down_proj's input,
        # silu(gate) * up, is heavy-tailed: per tensor it alone costs KLD 7e-3 on ttt-linear-tiny-parallel
        # int4 (benchmarks/results/prefill_int8_cpu.md); o_proj and the head keep MatMulNBits as well
        self.normalized_input = normalized_input

    def _tensors(self) -> dict:
        return dict(self.named_buffers(recurse=False))

    @property
    def activations(self) -> str:
        """How this layer multiplies in the graph being traced (the format's `export_matmul`)."""
        if self.requested == "float":
            return "float"
        if self.graph == "prefill" and self.normalized_input and self.format.exports_int8_rows:
            return "int8-tensor"
        return "int8" if self.graph in self.format.int8_activation_graphs else "float"

    def forward(self, x):
        return self.format.export_matmul(x, self._tensors(), self.K, self.N, self.group, self.activations)

    def rows(self, ids):
        if self.float_rows is not None:
            return nn.functional.embedding(ids, self.float_rows)
        return self.format.export_rows(ids, self._tensors(), self.K, self.N, self.group)


# how quantized layers multiply in ONNX Runtime: "int8" quantizes the activations to int8 and
# multiplies in integers where that is the faster kernel (`ExportLinear.activations`): in a decode
# step MatMulNBits' accuracy level 4 (x in blocks along K; 2-4x fp32 on CPUs with int8 dot products),
# in a prefill DynamicQuantizeMatMul for the layers that read a normalized input (x per tensor, int8
# rows made at session load; AMX/VNNI int8 GEMM); at a measured accuracy cost the verification
# reports. "float" multiplies in fp32
ACTIVATIONS = ("int8", "float")
DEFAULT_ACTIVATIONS = "int8"


def default_activations(web: bool) -> str:
    """Activations when none are asked for: float for a browser folder (onnxruntime-web's MatMulNBits multiplies
    in float, so int8 activations would only part its text from the native runner's), else int8."""
    return "float" if web else DEFAULT_ACTIVATIONS


def int8_activations(model: LanguageModel, activations: str) -> list[str]:
    """The graphs in which an export with `activations` multiplies some of `model`'s layers in int8."""
    formats = {m.format for m in model.modules() if isinstance(m, QuantLinear)}
    graphs = {g for f in formats for g in f.int8_activation_graphs} | {"prefill" for f in formats if f.exports_int8_rows}
    return sorted(graphs) if activations == "int8" else []


def trace_graph(model: LanguageModel, graph: str) -> None:
    """Tell the exportable copy's quantized layers which graph is traced next (their activations)."""
    for module in model.modules():
        if isinstance(module, ExportLinear):
            module.graph = graph


def stacked_linear(layers: list[nn.Module], activations: str) -> nn.Module | None:
    """One layer computing all of `layers` (same input) with their rows stacked, or None where they
    differ in kind, format or group, or the format's exported tensors are not one row per output."""
    if (stacked := stacked_float_linear(layers)) is not None:
        return stacked
    if not QuantLinear.stackable(layers):
        return None
    return ExportLinear(layers[0], activations, stacked=layers[1:], normalized_input=True)  # see `FusableInputs`


def export_refusal(config) -> str | None:
    """Why a model of `config` has no export (its form, or what its family refuses), else None: what the CLI
    checks from config.json before the weights are read."""
    family = family_of(config)
    if config.form not in family.exportable_forms:
        return unexportable_form(config.form)
    return family.export_refusal(config)


def unexportable_form(form: str) -> str:
    return (f"form {form!r} is recurrent across mini-batches and has no parallel prefill graph; convert with "
            "`edgettt convert SRC OUT --form parallel` and export that")


def exportable_copy(model: LanguageModel, activations: str = "float") -> LanguageModel:
    """A copy of `model` whose quantized layers call the export ops, the projections of one input
    stacked into one product. Refuses what ONNX cannot express."""
    refusal = export_refusal(model.config)
    if refusal:
        raise EdgetttError(f"{model.state_layers()[0][0]}: {refusal}")
    model = copy.deepcopy(model).float().eval()
    fuse_input_projections(model, lambda layers: stacked_linear(layers, activations))
    for name, module in list(model.named_modules()):
        if isinstance(module, QuantLinear):
            set_module(model, name, ExportLinear(module, activations))
    embed = model.get_submodule(model.EMBEDDING_KEY.rsplit(".", 1)[0])
    if isinstance(embed, TiedEmbedding):
        if not embed.head.format.exports_rows:
            model.lm_head.float_rows = embed.head.dequantized()
        embed.tie(model.lm_head)
    return model


def state_specs(model: LanguageModel) -> list[dict]:
    """Every decode-state tensor, in graph order: name, role and level (`formats.state_roles`), per-sequence
    shape, dtype and quantization."""
    specs = []
    layers = zip(model.state_layers(), model.init_state(1).layers, model.state_roles())
    for i, ((_, layer), tensors, roles) in enumerate(layers):
        fmt = state_format(getattr(layer, "state_format", "fp32"))  # (an original TTT layer has none)
        formatted = layer.formatted_state_names()
        for name, t in tensors.items():
            spec = {"name": f"{i}.{name}", "layer": i, "tensor": name, "role": roles[name].role,
                    "level": roles[name].level, "shape": list(t.shape[1:]),
                    "dtype": "float16" if t.dtype == torch.float16 else "float32"}
            if name in formatted and fmt.int8:  # the scales (and the initial state) are inside the graphs
                spec["dtype"] = "int8"
                spec["quantization"] = fmt.describe()
            parts = fmt.crossing(spec["role"], spec["shape"])
            if parts is None:
                specs.append(spec)
                continue
            for part, dtype, shape in parts:  # a tensor kept in codes crosses as them (`StateFormat.crossing`)
                specs.append(dict(spec, name=f"{i}.{name}.{part}", part=part, dtype=dtype, shape=shape,
                                  quantization=fmt.describe()))
    return specs


def int8_state_params(model: LanguageModel, specs: list[dict]) -> dict[str, tuple]:
    """(S0, scale_of, rows) of every int8 state tensor: S = S0 + q * scale, rows = H * Dk, and
    scale_of(position) -> [H, Dk] the scales of a state last committed at `position` (a 0-d tensor)."""
    params = {}
    for spec in specs:
        if spec["dtype"] != "int8":
            continue
        mixer = model.state_layers()[spec["layer"]][1]
        S0 = mixer.initial_states()[spec["level"] - 1].detach().float()
        scale_of = functools.partial(mixer.state_scale, spec["level"])
        params[spec["name"]] = (mixer.state_format.offset(S0), scale_of, S0.shape[0] * S0.shape[1])
    return params


def crossing_params(model: LanguageModel, specs: list[dict]) -> dict[tuple[int, str], tuple]:
    """(format, S0 of its level or None, role) of every state tensor that crosses the graphs in parts, by (layer,
    tensor)."""
    params = {}
    for spec in specs:
        if "part" in spec and (spec["layer"], spec["tensor"]) not in params:
            mixer = model.state_layers()[spec["layer"]][1]
            S0 = None
            if spec["tensor"] in mixer.formatted_state_names():
                S0 = mixer.initial_states()[spec["level"] - 1].detach().float()
            params[spec["layer"], spec["tensor"]] = (mixer.state_format, S0, spec["role"])
    return params


def last_commit(position: torch.Tensor, block: int) -> torch.Tensor:
    """Tokens seen at the last mini-batch commit, for `position` tokens seen."""
    return position - position % block


class PrefillGraph(nn.Module):
    """(input_ids [B, T], logits_from []) -> (logits [B, T - logits_from, V], *states after the text),
    from a fresh state: logits of tokens logits_from.. only (a generation needs the last one's; the
    lm_head over every token is the largest matmul of a prefill). A quantized state is rounded at
    every mini-batch commit, as in torch: one ONNX Scan over the mini-batches."""

    def __init__(self, model: LanguageModel, specs: list[dict], int8_params: dict):
        super().__init__()
        self.model, self.specs, self.int8_params = model, specs, int8_params
        self.crossing = crossing_params(model, specs)

    def forward(self, input_ids, logits_from):
        logits, state = self.model.prefill(input_ids, logits_from=logits_from)
        seen = input_ids.new_ones(input_ids.shape[1]).sum()  # T as a tensor: any length
        committed = last_commit(seen, self.model.config.mini_batch_size)
        return (logits, *flatten_state(self.specs, self.int8_params, state, committed, self.crossing))


class DecodeGraph(nn.Module):
    """(input_ids [B, 1], position [] int64, *states) -> (logits [B, 1, V], *new states)."""

    def __init__(self, model: LanguageModel, specs: list[dict], int8_params: dict):
        super().__init__()
        self.model, self.specs, self.int8_params = model, specs, int8_params
        self.crossing = crossing_params(model, specs)

    def forward(self, input_ids, position, *states):
        b = self.model.config.mini_batch_size
        committed = last_commit(position, b)  # the states in were last committed here
        layers = [{} for _ in self.model.model.layers]
        parts = {}
        for spec, t in zip(self.specs, states):
            if "part" in spec:  # gathered, decoded below
                parts.setdefault((spec["layer"], spec["tensor"]), []).append(t)
                continue
            if spec["dtype"] == "int8":
                S0, scale_of, rows = self.int8_params[spec["name"]]
                t = onnx_ops.dequantize_state(t, S0, scale_of(committed), rows)
            layers[spec["layer"]][spec["tensor"]] = t
        filled = (torch.arange(b) < position % b).float()  # the open mini-batch's slots in use
        for (layer, name), kept in parts.items():
            fmt, S0, role = self.crossing[layer, name]
            layers[layer][name] = fmt.decode(role, kept, S0, filled)
        logits, state = self.model.prefill(input_ids, State(position, layers), decode=True)
        return (logits, *flatten_state(self.specs, self.int8_params, state, last_commit(position + 1, b),
                                       self.crossing))


def flatten_state(specs: list[dict], int8_params: dict, state: State, committed: torch.Tensor,
                  crossing: dict) -> list[torch.Tensor]:
    """The state tensors in graph order; int8 ones quantized with the scales of their last commit, those kept in
    codes as their parts (`StateFormat.encode`)."""
    out, encoded = [], {}
    for spec in specs:
        t = state.layers[spec["layer"]][spec["tensor"]]
        if "part" in spec:
            key = spec["layer"], spec["tensor"]
            if key not in encoded:
                fmt, S0, role = crossing[key]
                encoded[key] = iter(fmt.encode(role, t, S0))
            t = next(encoded[key])  # (the parts in the order `crossing` names them, as the specs list them)
        elif spec["dtype"] == "int8":
            S0, scale_of, rows = int8_params[spec["name"]]
            t = onnx_ops.quantize_state(t, S0, scale_of(committed), rows)
        out.append(t)
    return out


def _io(name, dtype, shape, role, **extra):
    return {"name": name, "dtype": dtype, "shape": shape, "role": role, **extra}


def graph_io(model: LanguageModel) -> dict:
    """Names, dtypes, shapes and roles of both graphs' inputs and outputs (for the manifest)."""
    V = model.config.vocab_size
    states_in = [_io(f"state.{s['name']}", s["dtype"], ["batch", *s["shape"]], "state", state=s["name"])
                 for s in state_specs(model)]
    states_out = [dict(s, name="new_" + s["name"]) for s in states_in]
    return {
        "prefill": {"file": "prefill.onnx",
                    "inputs": [_io("input_ids", "int64", ["batch", "tokens"], "input_ids"),
                               _io("logits_from", "int64", [], "logits_from",
                                   doc="the first token whose logits are returned (0: all; tokens - 1: the last)")],
                    "outputs": [_io("logits", "float32", ["batch", "tokens - logits_from", V], "logits"),
                                *states_out]},
        "decode": {"file": "decode.onnx",
                   "inputs": [_io("input_ids", "int64", ["batch", 1], "input_ids"),
                              _io("position", "int64", [], "position",
                                  doc="position of the token in its sequence: the tokens before it"),
                              *states_in],
                   "outputs": [_io("logits", "float32", ["batch", 1, V], "logits"), *states_out]},
    }


def _export_graph(module: nn.Module, args: tuple, io: dict, dynamic: list, path: Path, opset: int) -> None:
    names_in = [x["name"] for x in io["inputs"]]
    names_out = [x["name"] for x in io["outputs"]]
    chatter = contextlib.redirect_stderr(io_module.StringIO())  # the exporter's progress lines and warnings
    with chatter, warnings.catch_warnings(), onnx_export():
        warnings.simplefilter("ignore")
        for logger in ("torch.onnx", "torch.export"):  # (the exporter logs what it cannot classify, harmlessly)
            logging.getLogger(logger).setLevel(logging.CRITICAL)
        try:
            program = torch.onnx.export(module.eval(), args, dynamo=True, opset_version=opset,
                                        input_names=names_in, output_names=names_out, dynamic_shapes=tuple(dynamic),
                                        verbose=False, custom_translation_table=onnx_ops.TRANSLATIONS, optimize=True)
        except Exception as exc:  # torch's exporter met something in this model it cannot trace: say so in a line
            first = next((line for line in str(exc).splitlines() if line.strip()), "")[:200]
            raise EdgetttError(f"{path.name}: torch's ONNX exporter failed on this model ({type(exc).__name__}: "
                               f"{first}); nothing was written: an edgettt bug, please report it with the model's "
                               "config.json") from exc
    program.save(str(path), external_data=True)  # any size; `share_weights` gathers the data afterwards

    written = {o.domain: o.version for o in onnx.load(str(path), load_external_data=False).opset_import}
    if written.get("", written.get("ai.onnx")) != opset:  # the exporter may pick another; the manifest must not lie
        raise EdgetttError(f"{path.name}: the exporter wrote opset {written.get('')}, not the {opset} asked for; "
                           f"export with --opset {DEFAULT_OPSET}")


def export_graphs(model: LanguageModel, directory: Path, opset: int = DEFAULT_OPSET, log=lambda line: None,
                  activations: str = DEFAULT_ACTIVATIONS) -> dict:
    """Write prefill.onnx, decode.onnx and their shared weights.bin for `model` into `directory`; returns
    their I/O description."""
    model = exportable_copy(model, activations)
    io = graph_io(model)
    specs = state_specs(model)
    int8_params = int8_state_params(model, specs)
    prefill, decode = PrefillGraph(model, specs, int8_params), DecodeGraph(model, specs, int8_params)
    batch, tokens = torch.export.Dim.DYNAMIC, torch.export.Dim.DYNAMIC
    b = model.config.mini_batch_size
    # example shapes that fix nothing: batch 2, a length that is neither 1 nor a multiple of b
    ids = torch.randint(0, model.config.vocab_size, (2, 2 * b + 3))
    with torch.no_grad(), bar(total=2, desc="export graphs", unit="graph", leave=False) as progress:
        trace_graph(model, "prefill")
        log("  tracing prefill.onnx (any batch, any length)")
        progress.set_postfix_str("prefill.onnx")
        _export_graph(prefill, (ids, torch.tensor(0)), io["prefill"], [{0: batch, 1: tokens}, None],
                      directory / "prefill.onnx", opset)
        progress.update()
        states = prefill(ids, 0)[1:]
        decode_args = (ids[:, :1], torch.tensor(3), *states)
        trace_graph(model, "decode")
        log("  tracing decode.onnx (one token, states in and out)")
        progress.set_postfix_str("decode.onnx")
        dynamic = [{0: batch}, None, tuple({0: batch} for _ in states)]  # *states is one argument
        _export_graph(decode, decode_args, io["decode"], dynamic, directory / "decode.onnx", opset)
        progress.update()
    log(f"  one {WEIGHTS_FILE} for both graphs")
    share_weights(directory, ["prefill.onnx", "decode.onnx"])
    return io


def manifest(model: LanguageModel, name: str, io: dict, opset: int, activations: str = DEFAULT_ACTIVATIONS) -> dict:
    tokenizer = {"type": "bytes"} if getattr(model.tokenizer, "name", None) != "tokenizer.json" else \
        {"type": "tokenizer.json", "file": "tokenizer.json"}
    int8_graphs = int8_activations(model, activations)
    return {
        "edgettt_export": EXPORT_FORMAT, "opset": opset, "onnxruntime_domains": ["", "com.microsoft"],
        "source": {"model": name, "fingerprint": model_fingerprint(model), "family": model.config.family,
                   "form": model.form, "quantization": model.config.quantization, **weight_bits(model),
                   "distilled_ctx": model.config.extra.get("distilled_ctx")},
        # "int8": quantized layers multiply int8-quantized activations (`ExportLinear.activations`)
        # in the graphs `int8_activation_graphs` lists; "float": none does
        "activations": "int8" if int8_graphs else "float", "int8_activation_graphs": int8_graphs,
        "vocab_size": model.config.vocab_size, "mini_batch_size": model.config.mini_batch_size,
        "bos_token_id": model.config.bos_token_id, "eos_token_id": model.config.eos_token_id,
        "tokenizer": tokenizer, "state": state_specs(model), "graphs": io,
        # onnxruntime options the graphs need: without this, its QDQ fusions turn DequantizeLinear +
        # MatMul of int8 weights into a matmul on dynamically quantized activations (relative error
        # of logits 1e-2 instead of 1e-6 on ttt-linear-tiny)
        "session_config": SESSION_CONFIG,
    }


def write_export(model: LanguageModel, directory: Path, name: str, opset: int = DEFAULT_OPSET,
                 log=lambda line: None, activations: str = DEFAULT_ACTIVATIONS) -> dict:
    """Both graphs, their weights, the tokenizer file (if any), onnxruntime-genai's files (`genai`) and
    manifest.json into `directory`; returns the manifest."""
    data = manifest(model, name, export_graphs(model, directory, opset, log, activations), opset, activations)
    if model.tokenizer is not None and data["tokenizer"]["type"] == "tokenizer.json":
        model.tokenizer.save(directory)
    log(f"  {genai.GENAI_GRAPH} and {genai.GENAI_CONFIG} for onnxruntime-genai")
    data["genai"] = genai.write_genai_files(directory, data)
    # what the runner, the page and genai read as data (genai_config.json is theirs to edit: not recorded)
    recorded = {g["file"] for g in data["graphs"].values()} | {WEIGHTS_FILE, genai.GENAI_GRAPH, "tokenizer.json"}
    data["files"] = file_record(directory, [name for name in recorded if (directory / name).is_file()])
    write_manifest(directory, data)
    return data


def export_model(model: LanguageModel, out, name: str, opset: int = DEFAULT_OPSET, force: bool = False,
                 verify_text=None, log=lambda line: None, activations: str = DEFAULT_ACTIVATIONS,
                 web: dict[str, bytes] | None = None) -> dict:
    """Export, verify in onnxruntime against torch (unless `verify_text` is None) and publish `out` (a
    path or a planned `outputs.Output`) atomically: a failed export or verification leaves nothing
    behind. `web`: the browser's files (`web.runtime_files()`), added to the folder. Returns the manifest."""
    out = as_output(out, "export", force)
    with out.write() as tmp:
        data = write_export(model, tmp, name, opset, log, activations)
        if verify_text is not None:
            release_freed_memory()  # what the traces left in the heap, before the verification's sessions
            log(f"  verifying in onnxruntime on {verify_text.name}")
            data["verification"] = verify(model, tmp, verify_text)
            write_manifest(tmp, data)
            if not data["verification"]["passed"]:
                fix = ("export with --activations float (activations='float'): int8 activations move this model's "
                       "logits further than the check allows" if data["activations"] == "int8" else
                       "the graphs compute something other than the model; report it (--no-verify writes them "
                       "unchecked)")
                raise EdgetttError(f"{out.path}: onnxruntime disagrees with torch ({data['verification']['summary']}; "
                                   f"{data['verification']['rule']}); nothing written; {fix}")
        if web is not None:
            data = add_web_files(tmp, data, web)
    return data
