"""Decode in a browser against native ONNX Runtime, on the same export and CPU.

Each folder (an export made with `edgettt export ... --web`) is served on 127.0.0.1 and opened in headless
Chromium (Debian's chromium-headless-shell, through playwright); the page imports the folder's
`edgettt.mjs`, loads the model (timed: manifest, graphs, weights, sessions) and generates; the native side
is `edgettt.runner.Runner` on the same folder. Both generate the same greedy text (repetition penalty
off) from the same prompt. After one warm-up generation each (the browser compiles WebAssembly in tiers),
the two alternate, `--repeats` rounds: decode tokens/s and first-token time, medians, and the ratio
browser / native per round (median). The page gets the threads it can: one, unless the server makes the
page cross-origin isolated (`--isolated` sends COOP/COEP headers: the threads' shared memory needs them).
Native runs with the same thread count and with ONNX Runtime's default (all cores).

    python benchmarks/web_decode.py FOLDER... --tokens 256 --repeats 5 --json out.json --md out.md
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import platform
import statistics
import threading
from pathlib import Path

import onnxruntime as ort
from playwright.sync_api import sync_playwright

from edgettt.runner import Runner, Sampling
from edgettt.web.npm import ORT_WEB

PROMPT = "def main(args):"
GREEDY = Sampling(repetition_penalty=1.0, max_run=0)

GENERATE = """async ([base, prompt, n, threads]) => {
    const { Runner } = await import(base + "/edgettt.mjs");
    globalThis.runners ??= {};
    let loadMs = null;
    if (!globalThis.runners[base]) {
        const t = performance.now();
        globalThis.runners[base] = await Runner.load(base + "/", { threads });
        loadMs = performance.now() - t;
    }
    const runner = globalThis.runners[base];
    let text = "";
    for await (const piece of runner.generate(prompt, { maxNewTokens: n, repetitionPenalty: 1 })) text += piece;
    return { text, loadMs, ...runner.stats };
}"""


class Handler(http.server.SimpleHTTPRequestHandler):
    isolated = False

    def end_headers(self):
        if self.isolated:  # cross-origin isolation: SharedArrayBuffer, so WebAssembly threads
            self.send_header("Cross-Origin-Opener-Policy", "same-origin")
            self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        super().end_headers()

    def log_message(self, *args):
        pass


def serve(root: Path, isolated: bool) -> str:
    handler = functools.partial(type("H", (Handler,), {"isolated": isolated}), directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}"


def native(folder: Path, n: int, threads: int | None) -> dict:
    runner = Runner(folder, threads)
    stats: dict = {}
    text = "".join(runner.generate(PROMPT, n, stats=stats, sampling=GREEDY))
    first_ms = 1e3 * (stats["prefill_seconds"] + stats["decode_seconds"] / max(stats["new_tokens"], 1))
    return {"text": text, "decode_tokens_per_s": stats["decode_tokens_per_s"], "first_token_ms": first_ms}


def page_bytes(folder: Path) -> int:
    """What a visitor downloads: the page, the modules, onnxruntime-web, the manifest, graphs and weights."""
    manifest = json.loads((folder / "manifest.json").read_text())
    names = {"manifest.json", manifest["web"]["weights"], *manifest["web"]["files"],
             *(g["file"] for g in manifest["graphs"].values())}
    return sum((folder / name).stat().st_size for name in names)


def measure(page, url: str, folder: Path, args, threads: int) -> dict:
    warm = page.evaluate(GENERATE, [f"{url}/{folder.name}", PROMPT, args.tokens, threads])
    native(folder, args.tokens, threads)
    rounds = []
    for _ in range(args.repeats):  # browser and native in turns
        web = page.evaluate(GENERATE, [f"{url}/{folder.name}", PROMPT, args.tokens, threads])
        same = native(folder, args.tokens, threads)
        default = native(folder, args.tokens, None)
        assert web["text"] == same["text"] == default["text"], (web["text"], same["text"])
        rounds.append({"web": web["decodeTokensPerS"], "web_first_ms": web["firstTokenMs"],
                       "native": same["decode_tokens_per_s"], "native_default": default["decode_tokens_per_s"],
                       "native_first_ms": same["first_token_ms"]})
    med = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    manifest = json.loads((folder / "manifest.json").read_text())
    return {"folder": folder.name, "model": manifest["source"]["model"],
            "weights": (manifest["source"].get("quantization") or {}).get("variant", "float"),
            "page_mb": page_bytes(folder) / 1e6, "load_ms": warm["loadMs"], "threads": warm["threads"],
            "first_token_ms_cold": warm["firstTokenMs"], **{f"median_{k}": v for k, v in med.items()},
            "web_over_native": statistics.median(r["web"] / r["native"] for r in rounds),
            "web_over_native_default": statistics.median(r["web"] / r["native_default"] for r in rounds),
            "rounds": rounds}


def table(rows: list[dict]) -> str:
    lines = ["| export | weights | page MB | load ms | first token ms (warm) | browser tok/s | native tok/s "
             "(same threads) | browser / native | native tok/s (all cores) | browser / that |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['weights']} | {r['page_mb']:.1f} | {r['load_ms']:.0f} | "
                     f"{r['median_web_first_ms']:.1f} | {r['median_web']:.1f} | {r['median_native']:.1f} | "
                     f"{r['web_over_native']:.2f}x | {r['median_native_default']:.1f} | "
                     f"{r['web_over_native_default']:.2f}x |")
    return "\n".join(lines)


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="+", type=Path, help="exports written with --web, all in one parent folder")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="the page's WebAssembly threads (>1 needs --isolated)")
    ap.add_argument("--isolated", action="store_true", help="serve with COOP/COEP headers (threads in the page)")
    ap.add_argument("--chromium", default="/usr/bin/chromium-headless-shell")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    roots = {f.resolve().parent for f in args.folders}
    if len(roots) != 1:
        ap.error("give folders of one parent folder (it is served)")
    url = serve(roots.pop(), args.isolated)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=args.chromium)
        page = browser.new_page()
        page.goto(f"{url}/{args.folders[0].name}/manifest.json")  # the origin the modules load from
        rows = [measure(page, url, folder.resolve(), args, args.threads) for folder in args.folders]
        chromium = browser.version
        browser.close()
    result = {"benchmark": "web_decode", "cpu": cpu_name(), "cores": os.cpu_count(), "chromium": chromium,
              "onnxruntime_web": ORT_WEB.version, "onnxruntime": ort.__version__, "prompt": PROMPT,
              "tokens": args.tokens, "repeats": args.repeats, "isolated": args.isolated, "rows": rows}
    text = (f"Decode of {args.tokens} tokens after {PROMPT!r}, greedy, the same text in both; medians of "
            f"{args.repeats} rounds in turns; {cpu_name()}, {os.cpu_count()} cores; headless Chromium {chromium}, "
            f"onnxruntime-web {ORT_WEB.version} (WebAssembly), onnxruntime {ort.__version__}.\n\n" + table(rows))
    print(text)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.md:
        args.md.write_text(text + "\n")


if __name__ == "__main__":
    main()
