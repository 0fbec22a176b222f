"""The browser as an edge device (`edgettt export ... --web`): the page in headless Chromium (Debian's
chromium-headless-shell, driven by playwright; .ci/run installs it), served by a local http.server,
generates the text `edgettt run` generates; bad input is a message on the page, never an uncaught
exception; the vendored onnxruntime-web is checked against its published hash."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading
import urllib.parse
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import GENAI_PROMPT

from edgettt import web
from edgettt.cli import cli
from edgettt.errors import EdgetttError
from edgettt.outputs import recognise
from edgettt.web.npm import ORT_WEB, NpmPackage

CHROMIUM = shutil.which("chromium-headless-shell") or shutil.which("chromium")
NEW_TOKENS = 40


def run(*args, **kwargs):
    return CliRunner().invoke(cli, [str(a) for a in args], **kwargs)


@pytest.fixture(scope="module")
def site(tmp_path_factory, shared_export):
    """A folder of browser folders (made from the shared exports) and a local server of it on 127.0.0.1."""
    root = tmp_path_factory.mktemp("site")
    runtime = web.runtime_files()
    for name in ("linear", "linear-int4-float", "lact-parallel", "gated-deltanet"):
        web.copy_export(shared_export(name), root / name, runtime)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("no chromium-headless-shell: .ci/run installs it (apt-get install chromium-headless-shell)")
        pytest.skip("no headless Chromium here (apt-get install chromium-headless-shell)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    """A fresh page whose uncaught exceptions and console errors are kept in `page.problems`."""
    page = browser.new_page()
    page.problems = []
    page.on("pageerror", lambda exc: page.problems.append(f"uncaught: {exc}"))
    page.on("console", lambda m: m.type == "error" and page.problems.append(f"console: {m.text}"))
    yield page
    page.close()


def open_page(page, url: str, **query) -> dict:
    """The page's contract: generate with the query's settings, wait for data-done, read the elements."""
    page.goto(f"{url}/index.html?{urllib.parse.urlencode(query, quote_via=urllib.parse.quote)}"
              if query else f"{url}/index.html")
    page.wait_for_selector("#output[data-done='1']", timeout=120_000)
    return {key: page.inner_text(f"#{key}") for key in ("output", "error", "speed")}


def run_text(folder: Path, prompt: str, n: int) -> str:
    """What `edgettt run` prints after the prompt, greedy with the repetition penalty off."""
    result = run("run", folder, "--prompt", prompt, "--max-new-tokens", n, "--repetition-penalty", 1)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(prompt) and result.stdout.endswith("\n")
    return result.stdout[len(prompt):-1]


@pytest.mark.parametrize("name", ["linear", "linear-int4-float", "lact-parallel", "gated-deltanet"])
def test_the_page_generates_what_edgettt_run_generates(site, page, name):
    root, url = site
    shown = open_page(page, f"{url}/{name}", prompt=GENAI_PROMPT, max_new_tokens=NEW_TOKENS, temperature=0,
                      repetition_penalty=1, autostart=1)
    assert shown["error"] == "" and page.problems == []
    assert shown["output"] == run_text(root / name, GENAI_PROMPT, NEW_TOKENS)
    assert float(shown["speed"]) > 0


def test_the_screenshot_shows_the_text(site, page, tmp_path):
    """The continuation is drawn: the output box's pixels are not all its background."""
    import matplotlib.image

    root, url = site
    shown = open_page(page, f"{url}/linear", prompt=GENAI_PROMPT, max_new_tokens=NEW_TOKENS, temperature=0,
                      repetition_penalty=1, autostart=1)
    assert len(shown["output"].strip()) > 10
    page.locator("#output").screenshot(path=tmp_path / "output.png")
    pixels = matplotlib.image.imread(tmp_path / "output.png")[..., :3]
    dark = (pixels.mean(axis=-1) < 0.5).mean()  # text is dark on a light box
    assert 0.005 < dark < 0.5, dark


def test_the_runner_module_is_importable_by_another_page(site, page):
    """A page of the user's imports edgettt.mjs and drives the Runner itself: the same text as the page's."""
    root, url = site
    page.goto(f"{url}/linear/manifest.json")  # any page of the origin
    got = page.evaluate("""async ([base, prompt, n]) => {
        const { Runner } = await import(base + "/edgettt.mjs");
        const runner = await Runner.load(base + "/");
        let text = "";
        for await (const piece of runner.generate(prompt, { maxNewTokens: n, repetitionPenalty: 1 })) text += piece;
        return { text, stats: runner.stats };
    }""", [f"{url}/linear", GENAI_PROMPT, NEW_TOKENS])
    assert got["text"] == run_text(root / "linear", GENAI_PROMPT, NEW_TOKENS)
    assert got["stats"]["newTokens"] == NEW_TOKENS and got["stats"]["promptTokens"] == len(GENAI_PROMPT)
    assert page.problems == []


@pytest.mark.parametrize("query, message", [
    ({"prompt": "", "autostart": 1}, "the prompt is empty"),
    ("prompt=%E0%A4%A&autostart=1", "prompt is not text"),
    ({"prompt": "x", "max_new_tokens": "-3", "autostart": 1}, "max_new_tokens must be a whole number"),
    ({"prompt": "x", "temperature": "hot", "autostart": 1}, "temperature must be a number")])
def test_bad_input_is_a_message_on_the_page(site, page, query, message):
    root, url = site
    query = query if isinstance(query, str) else urllib.parse.urlencode(query)
    page.goto(f"{url}/linear/index.html?{query}")
    page.wait_for_selector("#output[data-done='1']", timeout=120_000)
    assert message in page.inner_text("#error") and page.inner_text("#output") == ""
    assert page.problems == []


def test_a_folder_with_a_graph_missing_is_a_message_on_the_page(site, page):
    root, url = site
    broken = root / "broken"
    shutil.copytree(root / "linear", broken)
    (broken / "decode.onnx").unlink()
    page.goto(f"{url}/broken/index.html?prompt=x&autostart=1")
    page.wait_for_selector("#output[data-done='1']", timeout=60_000)
    assert "decode.onnx: the decode graph is missing from the folder" in page.inner_text("#error")
    # the failed fetch is the browser's own network line; no exception escapes
    assert [p for p in page.problems if "404" not in p] == []


def test_export_web_of_an_export_copies_it_and_the_folder_is_an_export(site, shared_export, tmp_path):
    """`export EXPORT OUT --web` copies without tracing; OUT runs in `edgettt run`, is replaced only with
    --force, and never written inside its input."""
    source = shared_export("linear")
    out = tmp_path / "w"
    result = run("export", source, out, "--web")
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["web"]["onnxruntime_web"] == ORT_WEB.version and manifest["web"]["weights"] == "weights.bin"
    assert {"index.html", "edgettt.mjs", "ort-wasm-simd-threaded.wasm"} <= {p.name for p in out.iterdir()}
    assert not (out / "tokenizers.min.mjs").exists()  # a byte-level model needs no tokenizer library
    assert (out / "prefill.onnx").read_bytes() == (source / "prefill.onnx").read_bytes()
    assert recognise(out, "export")
    assert run_text(out, "ab", 4) == run_text(source, "ab", 4)
    assert run("export", source, out, "--web").exit_code == 1
    assert run("export", source, out, "--web", "--force").exit_code == 0
    inside = run("export", source, source / "w", "--web")
    assert inside.exit_code == 1 and "inside the input" in inside.output
    plain = run("export", source, tmp_path / "p")
    assert plain.exit_code == 1 and "add --web" in plain.output and not (tmp_path / "p").exists()


def test_an_int8_activation_export_says_the_page_multiplies_in_float(shared_export, tmp_path):
    source = shared_export("linear")
    manifest = json.loads((source / "manifest.json").read_text())
    manifest["int8_activation_graphs"] = ["decode"]
    written = web.add_web_files(tmp_path, manifest, {"index.html": b"x"})
    assert "multiplies in float" in written["web"]["note"]


def test_the_vendored_runtime_is_checked_against_its_published_hash(tmp_path, monkeypatch):
    """A cached tarball that is not the published one is not used; with no registry to reach, the error is
    one line that says where to put the tarball; nothing is written."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9")  # nothing listens there
    (tmp_path / "edgettt" / "npm").mkdir(parents=True)
    (tmp_path / "edgettt" / "npm" / ORT_WEB.tarball_name).write_bytes(b"not the package")
    with pytest.raises(EdgetttError) as caught:
        ORT_WEB.files_bytes()
    assert "cannot be downloaded" in str(caught.value) and "npm pack onnxruntime-web@" in str(caught.value)
    assert "\n" not in str(caught.value)
    fake = NpmPackage("x", "1", "sha512-AAAA", {})
    assert not fake._matches(b"anything")


def test_export_web_without_the_network_says_so_before_any_work(shared_export, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("npm_config_registry", "http://127.0.0.1:9")
    result = run("export", "ttt-linear-tiny-parallel", tmp_path / "w", "--web")
    assert result.exit_code == 1 and "cannot be downloaded" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "w").exists() and "exporting" not in result.output
