"""Shared helpers: tiny random configurations, the relative-error measure tests compare by, and checks of
saved models (their file's dtypes, their documented slice numbers)."""

import itertools
import json
import os

# pytest-xdist's workers share the cores: torch's default of a thread a core in each would oversubscribe
# them (CI: two workers on two cores); set before torch starts its thread pool. Measured on a 2-core
# machine, tests/test_shipped_models.py and tests/test_recipe.py under -n 2: 129 s -> 84 s
if (workers := int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))

import pytest
import torch

if not torch.cuda.is_available():  # Triton kernels run in the interpreter; must precede their import
    os.environ.setdefault("TRITON_INTERPRET", "1")
# one launch configuration per kernel (tests/kernels/test_configs.py runs all of them on the GPU)
os.environ.setdefault("EDGETTT_AUTOTUNE", "0")

from edgettt import ModelConfig, random_model

# named tolerances (relative RMS error), as in flash-linear-attention's tests
FP32_EXACT = 1e-5


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """||actual - expected|| / ||expected|| (Frobenius), in float64."""
    a, e = actual.double(), expected.double()
    return ((a - e).norm() / e.norm().clamp_min(1e-30)).item()


def compiled_recording(fn):
    """(`fn` compiled by torch.compile with AOT autograd and no inductor, the CPU's stand-in for it; the list
    dynamo's traced graphs are appended to, to look for the operations a compiled step holds). A step traces
    once a place in the mini-batch where an operation takes the place as an int: past dynamo's default 8
    traces it would run eagerly, unchecked, so the limit is raised as `fast_paths.compile_step` raises it."""
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    graphs = []

    def recording(gm, inputs):
        graphs.append(gm)
        return torch._dynamo.backends.debugging.aot_eager(gm, inputs)

    return torch.compile(fn, backend=recording, dynamic=False), graphs


def cli_ok(*args):
    """`edgettt ARGS` through click's runner, which must succeed; its result."""
    from click.testing import CliRunner

    from edgettt.cli import cli

    result = CliRunner().invoke(cli, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def tiny_config(**overrides) -> ModelConfig:
    base = dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                num_attention_heads=4, mini_batch_size=8)
    base.update(overrides)
    return ModelConfig(**base)


OPTION_NAMES = ("share_qk", "pre_conv", "use_gate", "tie_word_embeddings")
ALL_OPTIONS = [dict(zip(OPTION_NAMES, values)) for values in itertools.product([False, True], repeat=4)]


def option_id(options: dict) -> str:
    return "-".join(name for name, on in options.items() if on) or "plain"


@pytest.fixture
def tiny_model():
    def make(family="linear", seed=0, **overrides):
        return random_model(tiny_config(ttt_layer_type=family, **overrides), seed)

    return make


@pytest.fixture(autouse=True)
def poison_kernel_outputs(monkeypatch):
    """Every kernel output starts as NaN (DESIGN section 8): an element a kernel fails to write stays
    NaN and fails the comparison with the reference."""
    import edgettt.ops.common

    monkeypatch.setattr(edgettt.ops.common, "POISON_OUTPUTS", True)


# The slowest files first: with `pytest -n 2 --dist loadfile --no-loadscope-reorder` (.ci/run) the workers
# take whole files in collection order (xdist's own order, by the number of tests in a file, put the README
# run, one test of 4-5 minutes, last), so the long ones start at once and the short ones fill in around them.
SLOW_FIRST = ("test_readme.py", "test_export.py", "test_runtimes.py", "test_lact.py", "test_stored_dtypes.py",
              "test_decode_token.py", "test_bad_inputs.py", "test_web.py", "test_recipe.py", "test_bench_cuda.py",
              "test_training.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))


def stored_dtypes(path, matrices: bool = True) -> set[str]:
    """The dtypes in a safetensors file (or a model directory's model.safetensors): of its matrices (2 or more
    dimensions), or of the rest."""
    from safetensors import safe_open

    path = os.path.join(path, "model.safetensors") if os.path.isdir(path) else path
    with safe_open(path, "pt") as f:
        return {f.get_slice(k).get_dtype() for k in f.keys() if (len(f.get_slice(k).get_shape()) >= 2) == matrices}


def check_documented_slice(model, name: str, documented: dict) -> dict[int, float]:
    """An eval.json's slice numbers (at the slice's context, and at each of `slice_bits_per_byte_by_ctx`'s)
    measured again on its text, once the text is checked to be the one they were measured on (a changed split
    changes the fingerprint); returns them by context."""
    from edgettt.data import read_text
    from edgettt.evaluation import evaluate

    slice_ = documented["slice"]
    text = read_text(slice_["data"])
    assert documented["text"] == text.fingerprint()
    expected = {slice_["ctx"]: documented["slice_bits_per_byte"],
                **{int(ctx): bits for ctx, bits in documented.get("slice_bits_per_byte_by_ctx", {}).items()}}
    for ctx, bits in expected.items():
        report, _, _ = evaluate(model, name, text, ctx, slice_["max_tokens"])
        assert report["bits_per_byte"] == pytest.approx(bits, abs=2e-3), (name, ctx)
    return expected



def schedules(log: dict) -> list[dict]:
    """A train_log.json's schedules, first first (each nests the one it continued)."""
    chain = []
    while isinstance(log, dict):
        chain.insert(0, log)
        log = log.get("continued_from")
    return chain


def word_tokenizer(path, size: int):
    """A tokenizer.json of `size` tokens ("[UNK]", then "w1", "w2", ...: text "w3 w4" is ids 3, 4) at `path`."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, size)}}
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(path))
    return path


GENAI_PROMPT = "def main(args):"


def genai_tokens(directory, prompt: str, n: int, then: str | None = None, m: int = 0) -> list[int]:
    """Greedy tokens from onnxruntime-genai's own loop (og.Model, og.Tokenizer, og.Generator) on an
    export: `n` after `prompt`, then `m` after appending `then`."""
    import onnxruntime_genai as og  # (the test extras: tests/test_runtimes.py and test_readme.py use it)

    model = og.Model(str(directory))
    tokenizer = og.Tokenizer(model)
    ids = tokenizer.encode(prompt)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + n + m + 64, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(ids)
    out = []
    for count, text in ((n, None), (m, then)):
        if text is not None:
            generator.append_tokens(tokenizer.encode(text))
        for _ in range(count):
            generator.generate_next_token()
            out.append(int(generator.get_next_tokens()[0]))
    return out


def check_genai_generates_what_edgettt_run_generates(directory, tmp_path) -> None:
    """genai's greedy tokens on an export against `edgettt run --repetition-penalty 1`'s (40 of them)."""
    from click.testing import CliRunner

    from edgettt.cli import cli

    stats = tmp_path / "run.json"
    result = CliRunner().invoke(cli, ["run", str(directory), "--prompt", GENAI_PROMPT, "--max-new-tokens", "40",
                                      "--repetition-penalty", "1", "--json", str(stats)])
    assert result.exit_code == 0, result.output
    assert genai_tokens(directory, GENAI_PROMPT, 40) == json.loads(stats.read_text())["tokens"]
    config = json.loads((directory / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "model.onnx"


def small_gated_deltanet():
    """A one-layer Gated DeltaNet with random weights (every option on: short convolutions, the output gate)."""
    from edgettt.families.deltanet.random_init import DEFAULTS, new_config, random_model

    sizes = {**DEFAULTS["gated-deltanet"], "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    return random_model(new_config("gated-deltanet", sizes), seed=0)


def first_blocks(name: str, blocks: int = 2):
    """A function making the shipped model `name` cut to its first `blocks` blocks: the same layers, sizes and
    trained weights, and an export that traces less than half as long (its graphs unroll the blocks: ttt-linear-tiny-
    parallel's 5 take 35 s, 2 take 16 s). The runtimes' checks compare two runtimes on one export, which any
    number of blocks tests."""
    def make():
        import edgettt

        model = edgettt.load(name)
        model.model.layers = model.model.layers[:blocks]
        model.config.num_hidden_layers = blocks
        return model
    return make


SHARED_EXPORTS = {  # name -> (shipped model or a function making one, converted to this form or None, weights
    # format or None, activations)
    # (whole: cut to 2 blocks, the second prompt's 6th token is a near tie, log-probabilities -1.598 / -1.618 in
    # float torch, which int8 activations break one way in genai's loop and the other in the runner)
    "linear": ("ttt-linear-tiny-parallel", None, None, "int8"),
    "mlp": (first_blocks("ttt-mlp-tiny-parallel"), None, None, "int8"),
    "lact-parallel": (first_blocks("lact-w1-tiny"), "parallel", None, "int8"),
    # int4 on float activations: what a browser computes (tests/test_web.py)
    "linear-int4-float": (first_blocks("ttt-linear-tiny-parallel"), None, "int4-rtn-g64", "float"),
    # verified on python-docs-sample (its manifest's "verification"): tests/test_deltanet.py checks it
    "gated-deltanet": (small_gated_deltanet, None, None, "float")}
VERIFIED_EXPORTS = {"gated-deltanet"}


@pytest.fixture(scope="session")
def shared_export(tmp_path_factory, worker_id):
    """shared_export(name) -> an export of `SHARED_EXPORTS[name]`, made once per test run and shared by every
    xdist worker (a file lock: the first asks, the others wait): each export traces its graphs, 20-70 s."""
    from filelock import FileLock

    import edgettt
    from edgettt.data import read_text
    from edgettt.onnx import export_model
    from edgettt.quant.config import QuantConfig, weight_variant

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if worker_id != "master" else base) / "shared-exports"  # the run's, not older runs'
    root.mkdir(exist_ok=True)

    def get(name: str):
        path = root / name
        with FileLock(str(root / f"{name}.lock")):
            if not path.exists():
                source, form, weights, activations = SHARED_EXPORTS[name]
                model = edgettt.load(source) if isinstance(source, str) else source()
                if form:
                    model = edgettt.convert(model, form=form)
                if weights:
                    fmt, method, group = weight_variant(weights)
                    model = edgettt.quantize(model, QuantConfig(fmt, group, method))
                verify_text = read_text("python-docs-sample") if name in VERIFIED_EXPORTS else None
                export_model(model, path, name, activations=activations, verify_text=verify_text)
        return path

    return get
