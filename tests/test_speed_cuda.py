"""`edgettt speed --device cuda`: the same-size transformer baseline (CPU), and the CUDA-graph decode
(GPU-marked): replaying the captured steps leaves the state that stepping eagerly leaves."""

import pytest
import torch

from conftest import rel_err


def test_the_transformer_baseline_decodes_as_it_prefills():
    from edgettt.llama import Llama, LlamaConfig

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


def test_speed_on_cuda_is_refused_in_one_line_without_a_gpu_or_with_an_export(tmp_path):
    from click.testing import CliRunner

    from edgettt.cli import cli

    result = CliRunner().invoke(cli, ["speed", "llama:125m"])
    assert result.exit_code == 1 and "--device cuda" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(cli, ["speed", "llama:9m", "--device", "cuda"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    for option in (["--compile"], ["--activations", "int8"]):  # CUDA options without --device cuda
        result = CliRunner().invoke(cli, ["speed", "ttt-linear-tiny-parallel", *option])
        assert result.exit_code == 1 and "--device cuda" in result.output and "Traceback" not in result.output


def test_quantized_weights_are_told_apart_without_loading_the_model(tmp_path):
    """`speed --compile` refuses models with quantized weights (their compiled steps would run them
    dequantized), which it tells from config.json alone; a quantized state alone compiles."""
    import edgettt
    from edgettt.quant import QuantConfig
    from edgettt.speed import has_quantized_weights

    model = edgettt.load("ttt-linear-tiny-parallel")
    edgettt.save(edgettt.quantize(model, QuantConfig("int4")), tmp_path / "q")
    edgettt.save(edgettt.quantize(model, QuantConfig("none", state="int8")), tmp_path / "state-only")
    assert has_quantized_weights(str(tmp_path / "q"))
    assert not has_quantized_weights(str(tmp_path / "state-only"))
    assert not has_quantized_weights("ttt-linear-tiny-parallel")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("form,compiled", [("ttt", False), ("exact", False), ("parallel", False), ("llama", False),
                                           ("parallel", True), ("ttt", True), ("llama", True)])
def test_graph_replays_leave_the_state_eager_steps_leave(tiny_model, form, compiled):
    """Also with the step compiled (`speed --compile`: traced and captured with edgettt's kernels off)."""
    import contextlib

    from edgettt import convert
    from edgettt.kernels import kernels_off
    from edgettt.llama import Llama, LlamaConfig
    from edgettt.speed import _copy_state, capture_steps, compile_step

    if form == "llama":
        with torch.device("cuda"):
            model = Llama(LlamaConfig(64, 2, 4, 128, 100))
    else:
        model = tiny_model("linear", seed=2, mini_batch_size=8)
        model = (model if form == "ttt" else convert(model, form)).cuda()
    model = model.to(torch.bfloat16).eval()
    ids = torch.randint(0, 61, (2, 40), device="cuda")  # (the tiny models' vocabulary: 61)
    with torch.no_grad():
        state = model.init_state(2, 40) if form == "llama" else None
        _, state = model.prefill(ids[:, :13], state)
        eager = _copy_state(state)
        for t in range(13, 40):
            _, eager = model.step(ids[:, t], eager)
        if compiled:
            compile_step(model)
        with kernels_off() if compiled else contextlib.nullcontext():
            token, graphs = capture_steps(model, state, 13, batch=2)
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
    from edgettt.speed import footer

    meta = {"device": "cuda", "gpu": "H200", "torch": "2", "triton": "3", "dtype": "bfloat16", "decode": "graphs",
            "peak": "allocated", "repetitions": 3, "batch": 1}
    assert "compiled" not in footer(meta) and "int8 activations" not in footer(meta)
    text = footer({**meta, "compile": True, "activations": "int8"})
    assert "decode steps compiled (torch.compile)" in text and "int8 activations" in text
