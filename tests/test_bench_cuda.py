"""`edgettt bench --device cuda`: the same-size transformer baseline (CPU), and the CUDA-graph decode
(GPU-marked): replaying the captured steps leaves the state that stepping eagerly leaves."""

import pytest
import torch
from conftest import compiled_recording, rel_err

from edgettt.errors import EdgetttError


def test_the_transformer_baseline_decodes_as_it_prefills():
    from edgettt.benchmark.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    model = Llama(LlamaConfig(64, 2, 4, 128, 100)).eval()
    ids = torch.randint(0, 100, (2, 12))
    with torch.no_grad():
        full, _ = model.prefill(ids, model.init_state(2, 12))
        logits, state = model.prefill(ids[:, :5], model.init_state(2, 12))
        outs = [logits]
        for t in range(5, 12):
            step, state = model.step(ids[:, t], state)
            outs.append(step[:, None])
    assert rel_err(torch.cat(outs, 1), full) < 1e-5 and int(state.pos) == 12


def test_the_transformer_baseline_takes_the_fast_paths_as_a_model_of_no_family():
    """`edgettt.prepare` takes the Llama (`bench llama:<preset>`), which no family registers: its layers keep
    torch's kernels, and no layer decodes a token in one operation."""
    from edgettt.benchmark.llama import Llama, LlamaConfig
    from edgettt.fast_paths import FastPaths, prepare
    from edgettt.fast_paths.layers import use_compiled_decode, use_kernels

    model = Llama(LlamaConfig(64, 2, 4, 128, 100))
    classes = [type(m) for m in model.modules()]
    assert use_kernels(model) == 0 and use_compiled_decode(model) == 0
    prepare(model, FastPaths(compile=False, dtype=torch.float32), device="cpu")
    assert [type(m) for m in model.modules()] == classes


def test_speed_on_cuda_is_refused_in_one_line_without_a_gpu_or_with_an_export(tmp_path):
    from click.testing import CliRunner

    from edgettt.cli import cli

    result = CliRunner().invoke(cli, ["bench", "llama:125m"])
    assert result.exit_code == 1 and "--device cuda" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["bench", "llama:9m", "--device", "cuda"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    from edgettt.benchmark import CudaOptions, run, tests

    for options in (CudaOptions(compile=False), CudaOptions(activations="int8"), CudaOptions(graph_prefill=False)):
        with pytest.raises(EdgetttError, match="--device cuda"):  # no cuda
            run(["ttt-linear-tiny-parallel"], tests([8], [2], [0]), 1, cuda=options)


@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_a_compiled_step_multiplies_quantized_weights_through_the_formats_op(weights):
    """A compiled decode step (`bench --device cuda`) with int8 / int4 weights: each quantized layer is one
    `edgettt::<fmt>_linear` in the traced graph (on CUDA the kernel, here the reference), and the compiled step
    (AOT-traced with the op's fake, as inductor does) gives the eager step's logits and state."""
    import edgettt
    from edgettt.benchmark import copy_state
    from edgettt.quant import QuantConfig, QuantLinear

    model = edgettt.quantize(edgettt.load("ttt-linear-tiny-parallel"), QuantConfig(weights, 64))
    op = getattr(torch.ops.edgettt, f"{weights}_linear").default
    ids = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, state = model.prefill(ids[:, :20])
        compiled_state = copy_state(state)
        step, graphs = compiled_recording(model.step)  # AOT autograd runs the ops' fake implementations
        for t in range(20, 24):
            want, state = model.step(ids[:, t], state)
            got, compiled_state = step(ids[:, t], compiled_state)
            assert rel_err(got, want) < 1e-5
    torch._dynamo.reset()
    calls = sum(node.target in (op, op.overloadpacket) for gm in graphs for node in gm.graph.nodes)
    layers = sum(isinstance(m, QuantLinear) for m in model.modules())
    assert graphs and calls == layers * len(graphs)
    for a, b in zip(state.layers, compiled_state.layers):
        for name in a:
            assert rel_err(b[name].float(), a[name].float()) < 1e-5, name


@pytest.mark.parametrize("arch,form,state_format", [("linear", "parallel", "fp32"), ("linear", "parallel", "int12"),
                                                    ("mlp", "parallel", "int12"), ("linear", "exact", "int12"),
                                                    ("linear", "parallel", "int12-kv8"), ("linear", "ttt", "fp32")])
def test_a_compiled_step_leaves_its_results_in_the_states_own_tensors(tiny_model, monkeypatch, arch, form,
                                                                      state_format):
    """`compile_step`: the step and the copy of its results into the state's tensors are one compiled
    function (`step_in_place`: on CUDA the copies fuse into the kernels), leaving what eager steps leave,
    across a mini-batch's commit (here with AOT autograd's tracing, without inductor: the CPU proxy)."""
    import functools

    from edgettt import convert
    from edgettt.benchmark import copy_state
    from edgettt.fast_paths import compile_step
    from edgettt.quant import apply_state_format

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    model = tiny_model(arch, seed=2, mini_batch_size=8)
    model = (model if form == "ttt" else convert(model, form)).eval()
    if state_format != "fp32":
        apply_state_format(model, state_format)
    ids = torch.randint(0, 61, (2, 24), generator=torch.Generator().manual_seed(1))
    # the int8 state rounds S to its grid: a last-bit difference of the compiled arithmetic can move an
    # element one step (measured 1.02e-5 with torch 2.11 on the GPU machine's CPU, under 1e-5 with 2.13)
    tolerance = 1e-5 if state_format == "fp32" else 1e-4
    with torch.no_grad():
        _, state = model.prefill(ids[:, :13])
        eager = copy_state(state)
        tensors = [dict(layer) for layer in state.layers]
        compile_step(model)
        for t in range(13, 24):
            want, eager = model.step(ids[:, t], eager)
            got = model.step_in_place(ids[:, t], state, t)
            assert rel_err(got, want) < tolerance
    torch._dynamo.reset()
    for kept, layer, stepped in zip(tensors, state.layers, eager.layers):
        for name in stepped:
            assert layer[name] is kept[name], name  # the same tensors, updated in place
            assert rel_err(layer[name].float(), stepped[name].float()) < tolerance, name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("form,compiled", [("ttt", False), ("exact", False), ("parallel", False), ("llama", False),
                                           ("parallel", True), ("ttt", True), ("llama", True),
                                           ("parallel:int4", True), ("parallel:int8", True), ("parallel/int12", True),
                                           ("parallel+rows", True), ("parallel:int4+rows", True), ("llama+rows", True),
                                           ("parallel+token", True), ("parallel+rows+token", True), ("exact+token", True),
                                           ("parallel:int4+token+fused", True), ("parallel:int4+rows+fused", True),
                                           ("parallel/int12-kv8+token", True)])
def test_graph_replays_leave_the_state_eager_steps_leave(tiny_model, form, compiled):
    """The layers with their kernels (`use_kernels`); also with the step compiled (`bench --device cuda`:
    `use_compiled_decode`), and with batch-1 weight products as products and sums (`+rows`:
    `use_row_products`, one sequence) and with each layer's token in one kernel (`+token`) and with int4
    products fused with their norms, activation and residual adds (`+fused`: `use_fused_products`)."""
    from edgettt import convert
    from edgettt.benchmark import capture_steps, copy_state
    from edgettt.fast_paths import compile_step, use_compiled_decode, use_kernels
    from edgettt.fast_paths.fused_products import use_fused_products
    from edgettt.fast_paths.row_products import use_row_products
    from edgettt.benchmark.llama import Llama, LlamaConfig

    form, *extras = form.split("+")
    rows = "rows" in extras
    batch = 1 if rows else 2
    if form == "llama":
        with torch.device("cuda"):
            model = Llama(LlamaConfig(64, 2, 4, 128, 100))
    else:
        model = tiny_model("linear", seed=2, mini_batch_size=8)
        form, _, weights = form.partition(":")  # FORM:WEIGHTS or FORM/STATE (compiled_decode.py's FORM-STATE)
        form, _, state_format = form.partition("/")
        model = model if form == "ttt" else convert(model, form)
        if state_format:
            from edgettt.quant import apply_state_format

            apply_state_format(model, state_format)
        if weights:  # through the formats' kernels as ops in the compiled graph
            from edgettt import quantize
            from edgettt.quant import QuantConfig

            model = quantize(model, QuantConfig(weights, 32))
        model = model.cuda()
    model = model.to(torch.bfloat16).eval()
    use_kernels(model)
    ids = torch.randint(0, 61, (batch, 40), device="cuda")  # (the tiny models' vocabulary: 61)
    with torch.no_grad():
        state = model.init_state(batch, 40) if form == "llama" else None
        _, state = model.prefill(ids[:, :13], state)
        eager = copy_state(state)
        for t in range(13, 40):
            _, eager = model.step(ids[:, t], eager)
        if compiled:  # (the eager steps above: the layers with their kernels, not yet compiled's forms)
            assert use_compiled_decode(model, "token" in extras) > 0 or "token" not in extras
            if rows:
                use_row_products(model)
            if "fused" in extras:
                assert use_fused_products(model) > 0
            compile_step(model)
        token, graphs = capture_steps(model, state, 13, batch=batch)
        for t in range(13, 40):
            token.copy_(ids[:, t])
            graphs[t % len(graphs)].replay()
    torch.cuda.synchronize()
    if form == "llama":
        pairs = list(zip(state.keys + state.values, eager.keys + eager.values))
    else:
        pairs = [(a[name], b[name]) for a, b in zip(state.layers, eager.layers) for name in a]
    for graphed, stepped in pairs:
        assert rel_err(graphed.float(), stepped.float()) < 1e-2


def test_the_cuda_table_says_how_the_models_ran():
    from edgettt.benchmark import footer

    meta = {"device": "cuda", "gpu": "H200", "torch": "2", "triton": "3", "dtype": "bfloat16", "decode": "graphs",
            "peak": "allocated", "repetitions": 3, "batch": 1}
    assert "compiled" not in footer(meta) and "int8 activations" not in footer(meta) and "prefill:" not in footer(meta)
    text = footer({**meta, "compile": True, "activations": "int8", "row_products": True, "token_kernel": True,
                   "graph_prefill": True, "fused_products": True})
    assert "decode steps compiled (torch.compile)" in text and "int8 activations" in text and "reductions" in text
    assert "token in one kernel" in text and "prefill: a CUDA graph replay" in text and "int4 products with" in text
    assert "int4 products" not in footer({**meta, "compile": True})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("form", ["ttt", "exact", "parallel", "parallel:int4", "parallel/int12", "llama"])
def test_a_captured_prefill_replays_to_the_eager_prefills_state(tiny_model, form):
    """`bench --device cuda`: the prefill recorded once (`capture_prefill`) and replayed on new ids leaves
    the state an eager prefill of those ids leaves (the transformer: its cache, made outside the graph)."""
    from edgettt import convert
    from edgettt.benchmark import capture_prefill
    from edgettt.benchmark.llama import Llama, LlamaConfig
    from edgettt.fast_paths import use_kernels

    if form == "llama":
        with torch.device("cuda"):
            model = Llama(LlamaConfig(64, 2, 4, 128, 100))
    else:
        form, _, weights = form.partition(":")
        form, _, state_format = form.partition("/")
        model = tiny_model("linear", seed=2, mini_batch_size=8)
        model = model if form == "ttt" else convert(model, form)
        if state_format:
            from edgettt.quant import apply_state_format

            apply_state_format(model, state_format)
        if weights:
            from edgettt import quantize
            from edgettt.quant import QuantConfig

            model = quantize(model, QuantConfig(weights, 32))
    model = model.cuda().to(torch.bfloat16).eval()
    use_kernels(model)  # as `bench --device cuda` runs it (plain torch's int12 commits ask the host each step)
    ids = torch.randint(0, 61, (2, 40), device="cuda")  # (the tiny models' vocabulary: 61)
    with torch.no_grad():
        model.prefill(ids, model.init_state(2, 40) if form == "llama" else None)  # kernels autotune
        captured = capture_prefill(model, ids)
        ids.copy_(torch.randint(0, 61, (2, 40), device="cuda"))
        _, eager = model.prefill(ids, model.init_state(2, 40) if form == "llama" else None)
        captured.replay()
    torch.cuda.synchronize()
    if form == "llama":
        pairs = list(zip(captured.state.keys + captured.state.values, eager.keys + eager.values))
    else:
        pairs = [(a[name], b[name]) for a, b in zip(captured.state.layers, eager.layers) for name in a]
    for replayed, prefilled in pairs:
        assert rel_err(replayed.float(), prefilled.float()) < 1e-3


def test_a_prefill_token_is_twice_the_linear_parameters_in_flops_and_the_table_shows_each_rows_limit():
    """`benchmark.cuda.linear_parameters` (float and quantized layers alike; the head counted or not) and the CUDA
    table's last column: a decode row against the copy bandwidth, a prefill row against the dense bf16 rate."""
    import edgettt
    from edgettt.benchmark import dense_bf16_flops, linear_parameters, table
    from edgettt.quant import QuantConfig

    model = edgettt.load("ttt-linear-tiny-parallel")
    c = model.config
    head = c.vocab_size * c.hidden_size
    assert linear_parameters(model) - linear_parameters(model, head=False) == head
    per_layer = sum(m.weight.numel() for m in model.model.layers[0].modules() if isinstance(m, torch.nn.Linear))
    assert linear_parameters(model, head=False) == c.num_hidden_layers * per_layer
    assert linear_parameters(edgettt.quantize(model, QuantConfig("int4", 64))) == linear_parameters(model)
    assert dense_bf16_flops("NVIDIA H200") == dense_bf16_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert dense_bf16_flops("NVIDIA A100-SXM4-80GB") is None
    row = {"path": "m", "engine": "torch cuda", "bytes": 1e6, "tokens_per_s": 10.0, "min": 9.0, "max": 11.0,
           "vs_first": 1.0, "peak_rss_mb": 5.0}
    rows = [{**row, "test": "pp512", "fraction_of_dense_bf16": 0.218},
            {**row, "test": "tg128@d0", "fraction_of_copy": 0.094}, {**row, "test": "pp8"}]
    lines = table({"meta": {"device": "cuda"}, "rows": rows}).splitlines()
    assert "of limit" in lines[0] and lines[2].endswith(" 21.8% bf16 |") and lines[3].endswith(" 9.4% copy |")
    assert lines[4].endswith("| |")


@pytest.mark.parametrize("state_format", ["fp32", "int12"])
def test_a_steps_state_bytes_are_its_tensors_as_held(tiny_model, state_format):
    """`benchmark.cuda.state_bytes` (the bytes behind the decode rows' copy fraction) counts the state as the step holds
    it, every sequence's: for the float state what the stored format says too; for the int12 format more (its
    S is held on its grid in the model's float type, where the stored format keeps 1.5 bytes a value)."""
    from edgettt import convert
    from edgettt.benchmark import state_bytes
    from edgettt.quant import apply_state_format

    model = convert(tiny_model("linear", seed=2, mini_batch_size=8), "parallel").eval()
    if state_format != "fp32":
        apply_state_format(model, state_format)
    with torch.no_grad():
        _, state = model.prefill(torch.randint(0, 61, (3, 13), generator=torch.Generator().manual_seed(1)))
    held = sum(t.numel() * t.element_size() for layer in state.layers for t in layer.values())
    assert state_bytes(state) == held
    assert (held == 3 * model.decode_state_bytes()) == (state_format == "fp32")
    assert held >= 3 * model.decode_state_bytes()
