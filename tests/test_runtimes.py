"""An export beyond edgettt's own loop: onnxruntime-genai opens it and generates what `edgettt run`
generates, and the runner keeps a state (saved, loaded, snapshot and restored, shared as a cached
prefix, held through a chat). The exports are shared by both halves: each one traces its graphs."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from conftest import GENAI_PROMPT, check_genai_generates_what_edgettt_run_generates, genai_tokens
from safetensors.numpy import load_file, save_file

from edgettt.cli import cli
from edgettt.metrics import logit_error
from edgettt.runner import Runner, Sampling

pytest.importorskip("onnxruntime_genai")  # in the test extras: CI runs these

GREEDY = Sampling(repetition_penalty=1.0, max_run=0)  # what `run --repetition-penalty 1` picks with
PROMPT = GENAI_PROMPT


@pytest.fixture(scope="module")
def exports(shared_export):
    """Three of the four the genai check names: TTT-Linear's parallel form in float, TTT-MLP's, LaCT's
    parallel form (the int4 export is the README's, checked in tests/test_readme.py); shared with
    tests/test_web.py (an export traces its graphs: 20-70 s)."""
    return {name: shared_export(name) for name in ("linear", "mlp", "lact-parallel")}


def run(*args, **kwargs):
    return CliRunner().invoke(cli, [str(a) for a in args], **kwargs)


@pytest.mark.parametrize("name", ["linear", "mlp", "lact-parallel"])
def test_genai_generates_what_edgettt_run_generates(exports, name, tmp_path):
    check_genai_generates_what_edgettt_run_generates(exports[name], tmp_path)


@pytest.mark.parametrize("name", ["linear", "mlp", "lact-parallel"])
def test_genai_continues_a_text_as_the_runner_continues_its_state(exports, name):
    """A second prompt appended in genai (its graph's Loop of decode steps from a later position) gives
    the tokens the runner gives continuing its own state."""
    runner = Runner(exports[name])
    first = {}
    list(runner.generate(PROMPT, 24, sampling=GREEDY, stats=first))
    second = {}
    list(runner.generate("\n    return", 12, sampling=GREEDY, stats=second, resume=True))
    assert genai_tokens(exports[name], PROMPT, 24, "\n    return", 12) == first["tokens"] + second["tokens"]


# ---- a state you can keep


def test_a_saved_state_continues_as_the_whole_text_in_one_go(exports, tmp_path):
    """Prompt A with no new tokens, saved; loaded, prompt B: the tokens of A+B in one go, and the logits
    of B's tokens to 1e-6 (relative, Frobenius)."""
    directory, A, B = exports["linear"], "def main(args):\n    ", "return args."
    state = tmp_path / "a.st"
    assert run("run", directory, "--prompt", A, "--max-new-tokens", 0, "--save-state", state).exit_code == 0
    out = {}
    for key, args in (("split", ("--load-state", state, "--prompt", B)), ("whole", ("--prompt", A + B))):
        result = run("run", directory, *args, "--max-new-tokens", 24, "--json", tmp_path / f"{key}.json")
        assert result.exit_code == 0, result.output
        out[key] = json.loads((tmp_path / f"{key}.json").read_text())["tokens"]
    assert out["split"] == out["whole"]

    runner = Runner(directory)
    runner.load_state(state)
    a, b = runner.tokenizer.encode(A), runner.tokenizer.encode(B)
    split, _ = runner.decode_tokens(np.array([b]), runner.current.position, runner.current.states)
    whole, _ = runner.run_prefill(np.array([a + b]))
    assert logit_error(torch.from_numpy(whole[:, len(a):]), torch.from_numpy(split))["rel_error"] < 1e-6


def test_snapshot_and_restore_inside_a_generation_rewind_exactly(exports):
    runner = Runner(exports["mlp"])
    whole = {}
    stream = runner.generate(PROMPT, 30, sampling=GREEDY, stats=whole)
    for _ in range(10):
        next(stream)
    snapshot = runner.snapshot()  # the 10th token picked, not yet read
    list(stream)  # the generation goes on to its 30th token
    for _ in range(2):  # rewound, the same 21 tokens (the 10th again) and bit-equal logits, twice
        runner.restore(snapshot)
        assert np.array_equal(runner.current.logits, snapshot.logits)
        again = {}
        list(runner.generate("", 21, sampling=GREEDY, stats=again, resume=True))
        assert again["tokens"] == whole["tokens"][9:]
        assert runner.current.position == whole["position"]


def test_a_cached_prefix_is_read_once_and_gives_what_a_fresh_prompt_gives(exports):
    runner = Runner(exports["linear"])
    prefix = "import os\nimport sys\n\n"
    runner.cache_prefix(prefix)
    for tail in ("def main(", "class Config"):
        cached, fresh = {}, {}
        list(runner.generate(prefix + tail, 16, sampling=GREEDY, stats=cached))
        assert cached["prompt_tokens"] == len(prefix + tail)  # the prompt as given ...
        assert cached["read_tokens"] == len(tail)  # ... of which only the tail was read
        list(Runner(exports["linear"]).generate(prefix + tail, 16, sampling=GREEDY, stats=fresh))
        assert cached["tokens"] == fresh["tokens"]


def rss_mb() -> float:
    with open(f"/proc/{os.getpid()}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="resident memory read from /proc")
def test_a_chat_of_fifty_turns_holds_constant_memory(exports, tmp_path):
    runner = Runner(exports["linear"])
    sizes, resident = [], []
    for turn in range(50):
        list(runner.generate(f"line {turn}: print(x)\n", 12, sampling=GREEDY, stop=("\n",), resume=True))
        sizes.append(runner.current.nbytes())
        resident.append(rss_mb())
    assert len(set(sizes)) == 1 and len(runner.current.recent) <= 64  # the state and the history: fixed sizes
    assert resident[-1] - resident[9] < 4, resident  # (turns 10..50: no growth beyond allocator noise)
    assert runner.current.position > 50 * 12  # all fifty turns are in the one state

    lines = "".join(f"turn {i}\n" for i in range(50))
    result = run("run", exports["linear"], "--chat", "--max-new-tokens", 8, "--json", tmp_path / "chat.json",
                 input=lines)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "chat.json").read_text())["turns"] == 50


def _saved(exports, tmp_path, name="linear") -> Path:
    state = tmp_path / f"{name}.st"
    assert run("run", exports[name], "--prompt", "ab", "--max-new-tokens", 2, "--save-state", state).exit_code == 0
    return state


def _rewrite(path, change):
    tensors = load_file(str(path))
    with open(path, "rb") as f:
        meta = json.loads(f.read(int.from_bytes(f.read(8), "little")))["__metadata__"]
    tensors, meta = change(tensors, meta)
    save_file(tensors, str(path), metadata=meta)


BAD_STATES = {  # name: (how the file is spoilt, what the one-line error says)
    "another export": (lambda p, e, t: _saved(e, t, "mlp"), "saved from another model"),
    "truncated": (lambda p, e, t: p.write_bytes(p.read_bytes()[:-100]) and p, "may be truncated"),
    "other dtype": (lambda p, e, t: _rewrite(p, lambda ts, m: ({k: (v.astype(np.float16) if k == "state.0.S1" else v)
                                                                 for k, v in ts.items()}, m)) or p, "float16"),
    "other shape": (lambda p, e, t: _rewrite(p, lambda ts, m: ({k: (v[:, :2] if k == "state.0.A1" else v)
                                                                 for k, v in ts.items()}, m)) or p, "[1, 2, 65, 64]"),
    "not a state": (lambda p, e, t: p.write_text("hello") and p, "not a readable state file"),
}


@pytest.mark.parametrize("case", BAD_STATES)
def test_a_bad_state_file_is_one_line_and_writes_nothing(exports, tmp_path, case):
    spoil, said = BAD_STATES[case]
    state = spoil(_saved(exports, tmp_path), exports, tmp_path)
    out = tmp_path / "out.st"
    result = run("run", exports["linear"], "--load-state", state, "--prompt", "x", "--save-state", out)
    assert result.exit_code == 1 and said in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not out.exists() and not [p for p in tmp_path.iterdir() if "partial" in p.name]


def test_a_chat_line_that_is_not_text_is_one_line_and_writes_nothing(exports, tmp_path):
    out = tmp_path / "chat.st"
    result = run("run", exports["linear"], "--chat", "--save-state", out, input=b"hello\n\xff\xfe broken\n")
    assert result.exit_code == 1 and "stdin line 2: not UTF-8 text" in result.output, result.output
    assert "Traceback" not in result.output and not out.exists()


def test_run_needs_a_prompt_a_state_or_a_chat_and_takes_samplers_as_settings(exports):
    result = run("run", exports["linear"])
    assert result.exit_code == 2 and "--prompt" in result.output
    result = run("run", exports["linear"], "--prompt", "x", "--top-k", 3)
    assert result.exit_code == 2 and "No such option" in result.output
    result = run("run", exports["linear"], "--prompt", "x", "--sampling", "top-q=3")
    assert result.exit_code == 2 and re.search(r"KEY one of top-k, top-p, seed", result.output)


def test_bench_times_an_export_through_genai_beside_the_runner(exports, tmp_path):
    """`edgettt bench EXPORT genai:EXPORT`: the same folder by edgettt's runner and by onnxruntime-genai."""
    out = tmp_path / "bench.json"
    result = run("bench", exports["linear"], f"genai:{exports['linear']}", "--pp", 8, "--tg", 4, "-r", 1,
                 "--json", out)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert {(r["path"].startswith("genai:"), r["engine"]) for r in rows} == {(False, "onnxruntime"),
                                                                            (True, "onnxruntime-genai")}
    assert all(r["tokens_per_s"] > 0 for r in rows)
    result = run("bench", f"genai:{tmp_path}", "--pp", 8, "--tg", 4, "-r", 1)
    assert result.exit_code == 1 and "no genai_config.json" in result.output
