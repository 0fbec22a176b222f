"""`edgettt export` and `edgettt run`: every export variant through onnxruntime against torch, the
runner against torch's greedy decoding, the runner without torch, and the refusals."""

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from click.testing import CliRunner

import edgettt
from edgettt.cli import cli
from edgettt.families.base import FusableInputs


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """A TTT-Linear and a TTT-MLP (all backbone options) model in the parallel form, and a calibration.
    One layer each: every export here traces the graphs again (tens of seconds on a CI core); several
    layers go through ONNX in tests/test_readme.py (the shipped 4-layer model, float and int4) and
    tests/test_bad_inputs.py (2 layers)."""
    root = tmp_path_factory.mktemp("export")
    common = ("--set", "hidden_size=32", "--set", "intermediate_size=64", "--set", "num_hidden_layers=1", "--set", "mini_batch_size=8")
    assert run("create", root / "ttt-linear", *common).exit_code == 0
    assert run("create", root / "ttt-mlp", "--family", "mlp", "--set", "share_qk=true", "--set", "pre_conv=true", "--set", "use_gate=true",
               *common).exit_code == 0
    for family in ("linear", "mlp"):
        assert run("convert", root / f"ttt-{family}", root / family, "--form", "parallel", "--no-report").exit_code == 0
    assert run("convert", root / "ttt-linear", root / "linear-decay", "--form", "parallel", "--decay", "0.8",
               "--no-report").exit_code == 0
    result = run("calibrate", root / "mlp", "--data", "python-docs-sample", "--ctx", "64", "--samples", "2",
                 root / "cal.st")
    assert result.exit_code == 0, result.output
    return root


VARIANTS = {  # name: (family, quantize arguments, export arguments, ONNX ops the graphs must contain)
    "linear-fp32": ("linear", None, (), {"MatMul", "SimplifiedLayerNormalization", "RotaryEmbedding"}),
    "mlp-fp32": ("mlp", None, (), {"MatMul"}),
    "mlp-int4-gptq-int8-state": ("mlp", ("--weights", "int4-gptq-g32",
                                         "--state", "int8"), (), {"MatMulNBits", "QuantizeLinear", "Scan"}),
    # a mix chosen for a budget (quantize --target): layers in different groups (down_proj reads 64: g64, the
    # rest g32), lm_head in 4 bits gathered by the tied embedding
    "mlp-mixed": ("mlp", ("--target", "kld=1"), (), {"MatMulNBits", "GatherBlockQuantized"}),
    "mlp-int8-two-level-state": ("mlp", ("--weights", "int8", "--state", "int12"), ("--activations", "float"),
                                 {"MatMulNBits", "Scan", "Round"}),  # (the state rounded in the graphs, S across in codes)
    # the open mini-batch's keys (rotated) and values rounded to int8 inside the graphs; S, K and V cross the
    # graphs in their codes (test_a_state_kept_in_codes_crosses_the_graphs_in_them)
    "linear-int12-kv8-state": ("linear", ("--weights", "int8", "--state", "int12-kv8"), ("--activations", "float"),
                               {"MatMulNBits", "Round"}),
    # int6: a 4-bit and a 2-bit MatMulNBits added (and two GatherBlockQuantized for the tied embedding's rows)
    "linear-int6-head": ("linear", ("--weights", "int6-rtn-g32", "--lm-head", "same"), (),
                         {"MatMulNBits", "GatherBlockQuantized"}),
    "linear-bnb-int8": ("linear", ("--weights", "bnb-int8",), (), {"MatMulNBits"}),
    # the 4-bit default: int4 layers, an int8 lm_head whose rows the embedding gathers
    "linear-int4-default-head": ("linear", ("--weights", "int4-rtn-g32"), (), {"MatMulNBits", "GatherBlockQuantized"}),
    "linear-nf4-int8-tensor-state": ("linear", ("--weights", "nf4-b32", "--state", "int8-tensor"),
                                     (), {"MatMulBnb4", "DequantizeLinear"}),
    # a decayed parallel form: the prefill's lag weights (Exp of the lags times log gamma), and the int12
    # state's commits with the decay in the Scan; int8 weights on int8 activations (the int4 variants' lm_head is
    # int8 as well)
    "linear-decay-int8-state": ("linear-decay", ("--weights", "int8", "--state", "int12"), (),
                                {"Scan", "Round", "Exp", "DynamicQuantizeMatMul"}),
}


@pytest.fixture(scope="module")
def exported(root):
    """Export every variant once: {name: (model dir, export dir)}."""
    out = {}
    for name, (family, qargs, xargs, _) in VARIANTS.items():
        model_dir = root / family
        if qargs:
            model_dir = root / f"q-{name}"
            calib = ("--calib", root / "cal.st") if family == "mlp" else ()
            result = run("quantize", root / family, model_dir, *qargs, *calib)
            assert result.exit_code == 0, result.output
        result = run("export", model_dir, root / f"x-{name}", *xargs)
        assert result.exit_code == 0, (name, result.output)
        assert "verified in onnxruntime" in result.output
        out[name] = (model_dir, root / f"x-{name}")
    return out


def op_types(path) -> set[str]:
    model = onnx.load(str(path))
    ops = {n.op_type for n in model.graph.node}
    for node in model.graph.node:  # the Scan body
        for attr in node.attribute:
            if attr.g is not None:
                ops |= {n.op_type for n in attr.g.node}
    return ops | {n.op_type for f in model.functions for n in f.node}


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_matches_torch_in_onnxruntime(exported, name):
    _, directory = exported[name]
    manifest = json.loads((directory / "manifest.json").read_text())
    check = manifest["verification"]
    assert check["passed"], check["summary"]
    # int8 activations: MatMulNBits' accuracy level 4, on by default for int4 / int8 / LLM.int8 layers
    # (beside 4-bit weights, an int8 lm_head: MatMulNBits too)
    assert manifest["activations"] == ("int8" if name in ("mlp-int4-gptq-int8-state", "linear-decay-int8-state",
                                                          "linear-bnb-int8",
                                                          "linear-nf4-int8-tensor-state", "linear-int4-default-head",
                                                          "mlp-mixed")
                                       else "float")
    levels = {a.i for n in onnx.load(str(directory / "decode.onnx"), load_external_data=False).graph.node
              if n.op_type == "MatMulNBits" for a in n.attribute if a.name == "accuracy_level"}
    assert levels <= ({4} if manifest["activations"] == "int8" else {0})
    # int8 activations in a prefill: DynamicQuantizeMatMul for the stacked q/k/v and gate/up of int4 / int8 layers
    int8_rows = name in ("mlp-int4-gptq-int8-state", "linear-decay-int8-state", "linear-int4-default-head", "mlp-mixed")
    assert ("DynamicQuantizeMatMul" in op_types(directory / "prefill.onnx")) == int8_rows
    assert "DynamicQuantizeMatMul" not in op_types(directory / "decode.onnx")
    # the prefill graph's int8 layers (LLM.int8, an int8 lm_head beside 4-bit weights) take int8 activations too
    assert ("prefill" in manifest["int8_activation_graphs"]) == (
        int8_rows or name in ("linear-bnb-int8", "linear-nf4-int8-tensor-state"))
    kld_limit = 5e-3 if manifest["activations"] == "int8" else 1e-4
    if manifest["source"]["quantization"]:
        assert check["prefill_vs_torch"]["kld_mean"] <= kld_limit and check["decode_vs_prefill"]["kld_mean"] <= kld_limit
    else:
        assert check["prefill_vs_torch"]["rel_error"] < 1e-4 and check["decode_vs_prefill"]["rel_error"] < 1e-4
    ops = op_types(directory / "prefill.onnx") | op_types(directory / "decode.onnx")
    assert VARIANTS[name][3] <= ops, ops
    # onnxruntime-genai's files where the state is float (genai binds float state tensors), checked too
    genai = {"model.onnx", "genai_config.json", "tokenizer.json", "tokenizer_config.json"}
    float_state = all(s["dtype"] == "float32" for s in manifest["state"])
    assert manifest["genai"]["written"] == float_state, manifest["genai"]
    assert float_state or "genai binds float32" in manifest["genai"]["why"]
    assert (check["genai_vs_runner"] is not None) == float_state
    assert {p.name for p in directory.iterdir()} == {"manifest.json", "prefill.onnx", "decode.onnx", "weights.bin"} | (
        genai if float_state else set())


def test_both_graphs_read_one_copy_of_the_weights(exported):
    """weights.bin holds each weight once (the tied head's bytes serve MatMulNBits and
    GatherBlockQuantized alike), and each graph reads the model's weights from it."""
    for name in ("linear-fp32", "linear-int6-head"):
        model_dir, directory = exported[name]
        data = (directory / "weights.bin").read_bytes()
        weights = edgettt.load(model_dir).weights().values()
        big = sum(t.numel() * t.element_size() for t in weights if t.numel() * t.element_size() >= 1024)
        ranges = {}
        for graph in ("prefill.onnx", "decode.onnx"):
            model = onnx.load(str(directory / graph), load_external_data=False)
            entries = [{e.key: e.value for e in t.external_data} for t in model.graph.initializer]
            ranges[graph] = {(int(e["offset"]), int(e["length"])) for e in entries if e}
            assert sum(length for _, length in ranges[graph]) >= 0.95 * big, (name, graph)
        every = ranges["prefill.onnx"] | ranges["decode.onnx"]
        assert len({data[o:o + n] for o, n in every}) == len(every)  # no content twice


@pytest.mark.parametrize("name", ["linear-int12-kv8-state", "mlp-int8-two-level-state"])
def test_a_state_kept_in_codes_crosses_the_graphs_in_them(exported, name):
    """int12 and int12-kv8: every decode-state tensor the format keeps in codes is graph inputs and outputs in those
    codes (S: c8 int8, c4 two a byte, a float32 step a row; int12-kv8's K and V: int8 codes, a float16 step a slot),
    so the state an application holds between steps is the model's own byte count (the variants' verification,
    decode against prefill, is test_every_variant_matches_torch_in_onnxruntime's)."""
    model_dir, directory = exported[name]
    manifest = json.loads((directory / "manifest.json").read_text())
    parts = {(s["tensor"], s.get("part"), s["dtype"]) for s in manifest["state"]}
    assert {("S1", "c8", "int8"), ("S1", "c4", "uint8"), ("S1", "step", "float32")} <= parts
    open_slots = ({("K1", "codes", "int8"), ("K1", "step", "float16"), ("V1", "codes", "int8"), ("V1", "step", "float16")}
                  if name == "linear-int12-kv8-state" else {("K1", None, "float16"), ("V1", None, "float16")})
    assert open_slots <= parts
    held = sum(np.prod(s["shape"]) * np.dtype(s["dtype"]).itemsize for s in manifest["state"])
    assert held == edgettt.load(model_dir).decode_state_bytes()
    graph = onnx.load(str(directory / "decode.onnx"), load_external_data=False).graph
    assert "state.0.S1.c8" in {i.name for i in graph.input}


def test_int4_weights_are_the_models_own_bytes(exported):
    model_dir, directory = exported["mlp-int4-gptq-int8-state"]
    model = edgettt.load(model_dir)
    graph = onnx.load(str(directory / "decode.onnx")).graph
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    mm = [n for n in graph.node if n.op_type == "MatMulNBits" and {a.name: a.i for a in n.attribute}["bits"] == 4]
    # the projections of one input (q/k/v, gate/up) are one node over their stacked rows (the int8 lm_head
    # is MatMulNBits' 8-bit layout, not its bytes)
    stacked, alone = [], {n: m for n, m in model.named_modules()
                          if type(m).__name__ == "QuantLinear" and m.format.name == "int4"}
    for name, module in model.named_modules():
        if isinstance(module, FusableInputs):
            names = [f"{name}.{p}" for p in module.input_projection_names()]
            stacked.append(b"".join(alone.pop(n).qweight.numpy().tobytes() for n in names))
    packed = stacked + [m.qweight.numpy().tobytes() for m in alone.values()]
    assert len(mm) == len(packed) == len(set(packed))
    for node in mm:
        assert inits[node.input[1]].tobytes() in packed  # no re-quantization


@pytest.mark.parametrize("name", ["linear-fp32", "mlp-fp32"])
def test_runner_generates_what_torch_greedy_decoding_generates(exported, name):
    from edgettt.runner import Runner, Sampling

    model_dir, directory = exported[name]
    model = edgettt.load(model_dir)
    prompt = "def main():\n    return"
    stats = {}
    plain_greedy = Sampling(repetition_penalty=1.0, max_run=0)
    text = "".join(Runner(directory).generate(prompt, max_new_tokens=24, stats=stats, sampling=plain_greedy))
    ids = torch.tensor([model.tokenizer.encode(prompt)])
    with torch.no_grad():
        logits, state = model.prefill(ids)
        token, expected = logits[0, -1].argmax(), []
        for _ in range(24):
            expected.append(int(token))
            logits, state = model.step(token[None], state)
            token = logits[0].argmax()
    assert stats["tokens"] == expected
    assert text == model.tokenizer.decode(expected)


def test_the_runner_needs_neither_torch_nor_anything_beside_the_manifest(exported):
    _, directory = exported["mlp-int4-gptq-int8-state"]
    code = ("import sys; sys.modules['torch'] = None\n"  # `import torch` now fails
            "from edgettt.cli import main\n"
            f"sys.argv = ['edgettt', 'run', {str(directory)!r}, '--prompt', 'import os', '--max-new-tokens', '8']\n"
            "main()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("import os") and "tokens/s" in result.stderr and "peak memory" in result.stderr
    blocked = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None; import edgettt.runner; "
                              "import edgettt; edgettt.load"], capture_output=True, text=True)
    assert "import of torch halted" in blocked.stderr  # the check is real: torch was blocked


def test_an_exporter_failure_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    """torch's exporter failing on a model (a bug, not bad input) ends in one line naming the graph, exit 1,
    and no output directory."""
    assert run("create", tmp_path / "t", "--set", "hidden_size=16", "--set", "intermediate_size=32", "--set", "num_hidden_layers=1",
               "--set", "num_attention_heads=2").exit_code == 0
    assert run("convert", tmp_path / "t", tmp_path / "p", "--form", "parallel", "--no-report").exit_code == 0

    def fails(*args, **kwargs):
        raise RuntimeError("Failed to export the model with torch.export.\nstep 1/3 ...\n(a long trace)")
    monkeypatch.setattr(torch.onnx, "export", fails)
    result = run("export", tmp_path / "p", tmp_path / "x")
    assert result.exit_code == 1 and not isinstance(result.exception, RuntimeError)
    assert "prefill.onnx: torch's ONNX exporter failed on this model (RuntimeError: Failed to export" in result.output
    assert "step 1/3" not in result.output and not (tmp_path / "x").exists()


def test_export_refusals(root, exported, tmp_path):
    result = run("export", root / "ttt-linear", tmp_path / "o")  # an original TTT checkpoint: said from its config
    assert result.exit_code == 1 and f"{root / 'ttt-linear'}: form 'ttt'" in result.output
    assert "--form parallel" in result.output and not (tmp_path / "o").exists()
    _, directory = exported["linear-fp32"]
    result = run("export", root / "linear", directory)
    assert result.exit_code == 1 and "--force" in result.output


def test_runner_names_an_operator_onnxruntime_lacks(exported, tmp_path):
    import shutil

    from edgettt.runner import Runner

    _, directory = exported["linear-nf4-int8-tensor-state"]
    broken = tmp_path / "broken"
    shutil.copytree(directory, broken)
    model = onnx.load(str(broken / "prefill.onnx"))
    next(n for n in model.graph.node if n.op_type == "MatMulBnb4").op_type = "MatMulBnb9"
    onnx.save(model, str(broken / "prefill.onnx"))
    manifest = json.loads((broken / "manifest.json").read_text())
    with pytest.raises(edgettt.EdgetttError, match="prefill.onnx.*(not the ones the export wrote|cut short or replaced)"):
        Runner(broken)  # the edit, found by the manifest's record of the files; without the record, ONNX Runtime:
    del manifest["files"]["prefill.onnx"]
    (broken / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(edgettt.EdgetttError, match="MatMulBnb9.*|onnxruntime .* cannot load"):
        Runner(broken)
    result = run("run", broken, "--prompt", "x")
    assert result.exit_code == 1 and "onnxruntime" in result.output and "MatMulBnb9" in result.output


def test_run_warns_beyond_the_context_the_model_was_distilled_at(exported, tmp_path):
    import shutil

    _, directory = exported["linear-fp32"]
    assert json.loads((directory / "manifest.json").read_text())["source"]["distilled_ctx"] is None
    distilled = tmp_path / "distilled"
    shutil.copytree(directory, distilled)
    manifest = json.loads((distilled / "manifest.json").read_text())
    manifest["source"]["distilled_ctx"] = 8
    (distilled / "manifest.json").write_text(json.dumps(manifest))
    beyond = run("run", distilled, "--prompt", "abc", "--max-new-tokens", "6")  # 3 + 6 tokens > 8
    within = run("run", distilled, "--prompt", "abc", "--max-new-tokens", "5")
    plain = run("run", directory, "--prompt", "abc", "--max-new-tokens", "6")
    assert beyond.exit_code == within.exit_code == plain.exit_code == 0
    assert "distilled at 8 tokens; at 9" in beyond.output
    assert "distilled at" not in within.output and "distilled at" not in plain.output


def test_decode_graph_takes_int8_state(exported):
    _, directory = exported["mlp-int4-gptq-int8-state"]
    manifest = json.loads((directory / "manifest.json").read_text())
    dtypes = {s["name"]: s["dtype"] for s in manifest["state"]}
    assert dtypes["0.S1"] == "int8" and dtypes["0.S2"] == "int8" and dtypes["0.A1"] == "float32"
    from edgettt.runner import Runner

    _, states = Runner(directory).run_prefill(np.array([[1, 2, 3, 4, 5, 6, 7, 8, 9]]))
    assert states["0.S1"].dtype == np.int8


def test_report_gains_onnx_rows(root, tmp_path):
    result = run("report", root / "linear", "--weights", "int4-rtn-g32", "--state", "fp32",
                 "--calib-data", "python-docs-sample", "--data", "python-docs-sample", "--ctx", "64",
                 "--max-tokens", "256", "--onnx", tmp_path / "r")
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "r" / "report.json").read_text())["rows"]
    assert [r["weights"] for r in rows] == ["float", "int4"]
    for r in rows:
        assert r["onnx_decode_mb"] > 0 and r["ort_prefill_tokens_per_s"] > 0 and r["ort_decode_tokens_per_s"] > 0
    assert rows[1]["onnx_decode_mb"] < rows[0]["onnx_decode_mb"]
    assert "ORT decode tok/s" in result.output
    # an original checkpoint: --onnx converts it to the parallel form, the one an export takes
    result = run("report", root / "ttt-linear", "--weights", "int4-rtn-g32", "--state", "fp32", "--calib-data",
                 "python-docs-sample", "--data", "python-docs-sample", "--ctx", "64", "--max-tokens", "128", "--onnx",
                 tmp_path / "r2")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "r2" / "report.json").read_text())["form"] == "parallel"


def test_run_stops_at_a_stop_string(exported, tmp_path):
    _, directory = exported["linear-fp32"]
    from edgettt.runner import Runner

    full = "".join(Runner(directory).generate("ab", max_new_tokens=12))
    stop = full[3:5]
    assert stop and full.find(stop) == 3
    result = run("run", directory, "--prompt", "ab", "--max-new-tokens", 12, "--stop", stop)
    assert result.exit_code == 0 and result.stdout.rstrip("\n") == "ab" + full[:5]


def test_speed_times_exports_in_turns_with_their_sizes_and_nodes(exported, tmp_path):
    """`edgettt bench` on two exports (ONNX Runtime): every test of every export each repetition, the
    exports in turns; sizes, decode nodes and peak memory per export; the first export's ratio to
    itself is 1; the nf4 export's decode graph is smaller than the float one's."""
    from edgettt.benchmark import count_nodes

    float_dir, int4_dir = exported["linear-fp32"][1], exported["linear-nf4-int8-tensor-state"][1]
    result = run("bench", float_dir, int4_dir, "--pp", "8", "--tg", "4", "--depth", "0,9", "-r", "2",
                 "--threads", "1", "--json", tmp_path / "s.json", "--markdown", tmp_path / "s.md")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "s.json").read_text())
    rows = {(r["path"], r["test"]): r for r in data["rows"]}
    assert set(rows) == {(str(d), t) for d in (float_dir, int4_dir) for t in ("pp8", "tg4@d0", "tg4@d9")}
    assert [o[1] for o in data["order"][:2]] == [str(float_dir), str(int4_dir)]  # in turns
    assert len(data["order"]) == 2 * 2 * 3
    for (path, test), r in rows.items():
        assert r["engine"] == "onnxruntime" and r["min"] <= r["tokens_per_s"] <= r["max"] and r["peak_rss_mb"] > 10
        assert r["vs_first"] == 1.0 if path == str(float_dir) else r["vs_first"] > 0
    graph = onnx.load(str(float_dir / "decode.onnx"))
    functions = {(f.domain, f.name): f for f in graph.functions}
    assert rows[(str(float_dir), "pp8")]["decode_nodes"] == count_nodes(graph.graph, functions) >= len(graph.graph.node)
    scanned = onnx.load(str(int4_dir / "prefill.onnx")).graph  # the int8 state's commits: a Scan with a body
    assert count_nodes(scanned) > len(scanned.node)
    assert rows[(str(int4_dir), "pp8")]["decode_onnx_bytes"] < rows[(str(float_dir), "pp8")]["decode_onnx_bytes"]
    assert "| tg4@d9 |" in (tmp_path / "s.md").read_text() and "tokens/s" in result.output


@pytest.mark.parametrize("engine_kind", ["onnxruntime", "torch"])
def test_speed_runs_every_sequence_of_a_batch_on_the_cpu_engines(exported, engine_kind):
    """`bench --batch 2` on the CPU: the prefill and each decode step take both sequences (the logits of
    the timed decode have two rows, and they differ: the sequences' random tokens differ)."""
    from edgettt.benchmark.onnx_engine import OnnxEngine
    from edgettt.benchmark.plan import Test
    from edgettt.benchmark.torch_engine import TorchEngine
    from edgettt.benchmark.worker import time_test

    directory = exported["linear-fp32"][1]
    engine = OnnxEngine(str(directory), 1) if engine_kind == "onnxruntime" else TorchEngine(str(exported["linear-fp32"][0]), 1)
    seen = []
    if engine_kind == "onnxruntime":
        real = engine.runner.decode_tokens
        engine.runner.decode_tokens = lambda ids, start, states: seen.append(real(ids, start, states)[0])
    else:
        real = engine.model.step
        engine.model.step = lambda ids, state: seen.append(real(ids, state)) or seen[-1]
    assert time_test(engine, Test("tg", 3, 9), np.random.default_rng(0), batch=2) > 0
    logits = [np.asarray(s[0] if isinstance(s, tuple) else s) for s in seen]
    assert all(x.shape[0] == 2 for x in logits) and len(logits) == (1 if engine_kind == "onnxruntime" else 3)
    assert not np.allclose(logits[-1][0], logits[-1][1])


def test_only_the_onnx_export_takes_the_export_ops():
    """The norms' and rotary's export-only forms (fused ONNX nodes) are taken inside edgettt's ONNX
    export only: torch.compile's trace does not count as exporting (on CUDA it had taken them, and a
    compiled bf16 decode step then failed on their float32 statistics)."""
    from edgettt.ops import exporting, onnx_export

    flag = torch.compile(lambda x: x + float(exporting()), backend="eager")
    assert flag(torch.zeros(2)).tolist() == [0.0, 0.0] and not exporting()
    with onnx_export():
        assert exporting()
    assert not exporting()


def test_eval_measures_the_export_itself(exported, tmp_path):
    """`eval EXPORT --ref MODEL`: perplexity and KLD of the deployed files, run by ONNX Runtime; a float
    export gives its model's numbers, a quantized one its own drift."""
    args = ("--data", "python-docs-sample", "--ctx", "64", "--max-tokens", "256")
    for name in ("linear-fp32", "mlp-int4-gptq-int8-state"):
        model_dir, directory = exported[name]
        result = run("eval", directory, "--ref", model_dir, *args, "--json", tmp_path / f"{name}.json")
        assert result.exit_code == 0, result.output
        assert "an export run by ONNX Runtime" in result.output
        report = json.loads((tmp_path / f"{name}.json").read_text())
        drift = report["drift"]
        assert report["model"]["runtime"] == "onnxruntime" and report["model"]["size_mb"] > 0
        if name == "linear-fp32":
            assert drift["kld_mean"] < 1e-6 and abs(drift["ppl_ratio"] - 1) < 1e-4
        else:  # the export of a quantized model against that same quantized model in torch: a small gap
            assert drift["kld_mean"] < 1e-2


def test_info_takes_an_export(exported):
    _, directory = exported["linear-fp32"]
    facts = json.loads(run("info", directory, "--json", "-").output)
    on_disk = sum(f.stat().st_size for f in directory.iterdir() if f.suffix in (".onnx", ".bin"))
    assert facts["export"] and facts["form"] == "parallel" and facts["weights_bytes"] == on_disk
    assert facts["decode_state_bytes_per_sequence"] > 0
    assert "an export of" in run("info", directory).output


@pytest.mark.parametrize("activations, fix", [("int8", "--activations float"), ("float", "--no-verify")])
def test_a_failed_verification_names_what_to_do(root, tmp_path, monkeypatch, activations, fix):
    """A verification that fails leaves nothing behind and says what to do: with int8 activations, export
    with float ones."""
    assert run("quantize", root / "linear", tmp_path / "q", "--weights", "int4-rtn-g32").exit_code == 0
    failed = {"passed": False, "summary": "prefill vs torch: KLD 1e-01", "rule": "KLD mean <= 0.005"}
    monkeypatch.setattr("edgettt.onnx.verify", lambda *args, **kwargs: failed)

    def write_without_tracing(model, directory, name, opset, log, activations):  # (the variants test the graphs)
        (directory / "prefill.onnx").write_bytes(b"")
        return {"activations": activations}
    monkeypatch.setattr("edgettt.onnx.write_export", write_without_tracing)
    result = run("export", tmp_path / "q", tmp_path / "x", "--activations", activations)
    assert result.exit_code == 1 and fix in result.output and "nothing written" in result.output
    assert not (tmp_path / "x").exists()
