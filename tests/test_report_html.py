"""The report's HTML page: self-contained, and drawn by a real headless browser (skipped without one)."""

import json
import shutil
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import cli_ok
from PIL import Image

from edgettt.cli import cli

BROWSER = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    cli_ok("create", root / "ttt", "--set", "hidden_size=32", "--set", "intermediate_size=64", "--set", "mini_batch_size=8")
    cli_ok("convert", root / "ttt", root / "par", "--form", "parallel", "--no-report")
    cli_ok("report", root / "par", "--weights", "int8,int4-rtn-g32", "--state", "fp16", "--ctx", 64,
        "--max-tokens", 400, "--data", "python-docs-sample", "--calib-data", "python-docs-sample", root / "r")
    return root / "r"


def test_the_page_is_self_contained_and_holds_every_variant(report_dir):
    page = (report_dir / "report.html").read_text()
    rows = json.loads((report_dir / "report.json").read_text())["rows"]
    assert page.count("data:image/png;base64,") == 3
    assert "http://" not in page and "https://" not in page and "<script" not in page  # readable offline
    for row in rows:
        assert row["variant"] in page


@pytest.mark.skipif(BROWSER is None, reason="no headless Chromium installed (apt-get install chromium)")
def test_a_headless_browser_draws_the_tables_and_plots(report_dir, tmp_path):
    shot = tmp_path / "shot.png"
    subprocess.run([BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    "--disable-component-update", "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}",
                    "--window-size=1200,2400", f"--screenshot={shot}", (report_dir / "report.html").as_uri()],
                   check=True, capture_output=True, timeout=120)
    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert image.shape[:2] == (2400, 1200)
    coloured = (image.max(-1) - image.min(-1)) > 60  # saturated pixels: the plots' markers and the swatches
    rows_drawn = np.nonzero(coloured.any(1))[0]
    assert coloured.sum() > 2000, "no plot was drawn"
    assert rows_drawn.max() - rows_drawn.min() > 600, "the colours sit in one band: are both plots there?"
    dark = image.max(-1) < 100  # text
    assert dark[:300].sum() > 2000, "no title or table text at the top of the page"


def test_report_on_the_default_created_model_falls_back_per_layer_or_refuses_up_front(tmp_path):
    """`edgettt create`'s default width gives intermediate 176, which no int4 group divides."""
    cli_ok("create", tmp_path / "m")
    common = ["--weights", "int4-rtn", "--state", "fp16", "--ctx", 64, "--max-tokens", 300, "--data",
              "python-docs-sample", "--calib-data", "python-docs-sample", "--skip", "o_proj"]
    cli_ok("report", tmp_path / "m", *common, tmp_path / "r")
    rows = {r["variant"]: r for r in json.loads((tmp_path / "r" / "report.json").read_text())["rows"]}
    assert rows["w-int4-rtn-g64 s-fp32"]["fallback_layers"] == 2  # down_proj of both layers, in int8
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "m"), *map(str, common), "--fallback", "refuse",
                                      str(tmp_path / "r2")])
    assert result.exit_code == 1 and "down_proj (K=176)" in result.output and not (tmp_path / "r2").exists()
    assert "reference logits" not in result.output  # refused before any work


def test_report_keeps_the_variants_that_finished_when_one_fails(report_dir, tmp_path, monkeypatch):
    import edgettt.quant.weight_formats
    from edgettt.errors import EdgetttError

    def broken():
        raise EdgetttError("bitsandbytes cannot load a backend (test); reinstall it for this machine")

    monkeypatch.setattr(edgettt.quant.weight_formats, "bitsandbytes", broken)
    par = report_dir.parent / "par"
    result = CliRunner().invoke(cli, ["report", str(par), "--weights", "nf4,int8", "--state", "fp16", "--ctx", "64",
                                      "--max-tokens", "300", "--data", "python-docs-sample", "--calib-data",
                                      "python-docs-sample", str(tmp_path / "r")])
    assert result.exit_code == 1 and "1 variants failed (w-nf4-b64 s-fp32: bitsandbytes cannot" in result.output
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [r["variant"] for r in data["rows"]] == ["float (converted)", "w-int8 s-fp32", "w-float s-fp16"]
    assert data["failed"][0]["variant"] == "w-nf4-b64 s-fp32"


def test_points_that_would_cover_each_other_are_moved_apart():
    """The size plot: two variants of one size and KLD (int8 and bnb-int8) are drawn side by side, far
    enough apart for both markers to show; points apart stay where they are."""
    from edgettt.reporting import dodged

    xs = dodged([3.97, 3.97, 2.52, 13.75], [1.7e-4, 1.7e-4, 2.6e-2, 1.5e-3])
    span = 13.75 - 2.52
    assert abs(xs[0] - xs[1]) >= 0.02 * span and abs((xs[0] + xs[1]) / 2 - 3.97) < 1e-9
    assert xs[2:] == [2.52, 13.75]
    assert dodged([], []) == []
