"""Exports that run in a browser (`edgettt export MODEL OUT --web`).

The folder is an export (its graphs, weights, manifest) plus what a static server needs to run it in a
browser: `index.html` (a page: prompt, streaming text, tokens/s), `edgettt.mjs` (the runner module, the
twin of `edgettt.runner`, importable by any page) and onnxruntime-web's WebAssembly build at a pinned
version (`npm.ORT_WEB`; the tokenizers library too when the model has a tokenizer.json). The manifest
gains a `web` section: the weights file the page fetches once for both graphs, and the vendored versions.

    runtime = web.runtime_files()                  # before any work: downloads on first use
    web.add_web_files(directory, manifest, runtime)   # into an export being written
    web.copy_export(export_dir, out, runtime)          # an existing export, as a browser folder

Plain Python (no torch): the files are copied, not traced again.
"""

from __future__ import annotations

import shutil
from importlib import resources
from pathlib import Path

from edgettt.errors import EdgetttError
from edgettt.onnx_files import WEIGHTS_FILE
from edgettt.outputs import DIRECTORY_FILES, as_output
from edgettt.runner import load_manifest, write_manifest
from edgettt.web.npm import ORT_WEB, TOKENIZERS_JS

PAGE_FILES = ("index.html", "edgettt.mjs")  # from this package


def runtime_files(tokenizer_json: bool = True) -> dict[str, bytes]:
    """The vendored JavaScript a folder needs, {file name: bytes}; downloaded once, then from the cache."""
    files = {name: resources.files(__package__).joinpath(name).read_bytes() for name in PAGE_FILES}
    files.update(ORT_WEB.files_bytes())
    if tokenizer_json:
        files.update(TOKENIZERS_JS.files_bytes())
    return files


def add_web_files(directory: Path, manifest: dict, runtime: dict[str, bytes]) -> dict:
    """The page, the runner module and onnxruntime-web into the export in `directory`; the manifest's `web`
    section written. Returns the manifest."""
    needs_tokenizers = manifest["tokenizer"]["type"] == "tokenizer.json"
    written = [name for name in runtime if needs_tokenizers or not name.startswith("tokenizers.")]
    for name in written:
        (directory / name).write_bytes(runtime[name])
    manifest["web"] = {"weights": WEIGHTS_FILE, "onnxruntime_web": ORT_WEB.version, "files": written,
                       **({"tokenizers_js": TOKENIZERS_JS.version} if needs_tokenizers else {})}
    if "decode" in manifest.get("int8_activation_graphs", []):
        manifest["web"]["note"] = ("decode.onnx multiplies int8 activations (MatMulNBits accuracy level 4), a native "
                                   "CPU path: the browser's WebAssembly multiplies in float, so the page's text can "
                                   "part from `edgettt run`'s after some tokens; export with --activations float for "
                                   "the same arithmetic in both")
    write_manifest(directory, manifest)
    return manifest


def copy_export(export_dir, out, runtime: dict[str, bytes], force: bool = False) -> dict:
    """The export in `export_dir` copied to `out` (a path or a planned `outputs.Output`) with the browser's
    files; the export is read, not changed. Returns the new manifest."""
    source = Path(export_dir)
    manifest = load_manifest(source)  # checked: every file it names is there
    files = [file for file in sorted(source.iterdir()) if file.name in EXPORT_FILES]
    for file in files:  # the folder is for serving: nothing from outside the export goes into it
        if file.resolve().parent != source.resolve() or not file.is_file():
            raise EdgetttError(f"{file}: {'a link to ' + str(file.resolve()) if file.is_symlink() else 'not a file'}, "
                               "outside the export's own files; copy the file itself into the export, or export the "
                               "model again")
    out = as_output(out, "export", force, inputs=[source])
    with out.write() as tmp:
        for file in files:
            shutil.copyfile(file, tmp / file.name)
        manifest.pop("web", None)
        return add_web_files(tmp, manifest, runtime)


# an export's own files (what `copy_export` takes over); the browser's are written anew
EXPORT_FILES = DIRECTORY_FILES["export"] - set(PAGE_FILES) - {name for p in (ORT_WEB, TOKENIZERS_JS)
                                                              for name in p.files.values()}
