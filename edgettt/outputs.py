"""Writing outputs so that nothing is lost (README, "Bad input and outputs").

Every file or directory a command writes goes through here, in two steps:

    out = Output.plan("m-q4", "model", force, inputs=[model_dir, calib_file])   # before any work
    with out.write() as tmp:       # tmp: the directory (or file) to fill
        ...
    # on success tmp is at "m-q4"; on failure nothing changed

`plan` refuses, before any work: an output that is, contains or lies inside one of the command's
inputs; an existing output without `force`; with `force`, anything edgettt did not write (a path is
replaced only when it is a model directory, export, report or file of the kind the command writes);
a parent that is a file or cannot be written. It also cleans up what an earlier, killed run of the
same output left behind.

`write` builds the output inside a private staging directory beside the final path
(`.NAME.edgettt-partial-PID-RANDOM`, made with mkdtemp: an unpredictable name, created exclusively,
mode 0700, so no planted symlink is followed), then publishes it with one rename: a file with
rename(2) over the old one; a directory by exchanging it with the old one atomically (Linux
renameat2 RENAME_EXCHANGE), or, where that is unavailable, two renames with the old output parked in
the staging directory, which the next run puts back if a crash came between them. At every instant
either the old or the new output is at the final path, or the next run restores the old one.

Plain Python only: no torch (the edge runner imports the errors beside it).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from edgettt.errors import EdgetttError

STAGING_TAG = ".edgettt-partial-"
PUBLISHED = "output"  # the output's name inside the staging directory
PARKED = "previous"  # the old output, parked there between the two renames of the fallback

# What each kind of output holds: the files edgettt writes there, and how to recognise one.
DIRECTORY_FILES = {
    "model": {"config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "convert_report.json",
              "MODEL_CARD.md", "eval.json", "train_log.json", "model.safetensors.index.json"},
    "export": {"manifest.json", "prefill.onnx", "decode.onnx", "weights.bin", "tokenizer.json", "model.onnx",
               "genai_config.json", "tokenizer_config.json",
               # with --web: the page, its runner module, onnxruntime-web and the tokenizers library
               "index.html", "edgettt.mjs", "ort.wasm.min.mjs", "ort-wasm-simd-threaded.mjs",
               "ort-wasm-simd-threaded.wasm", "tokenizers.min.mjs", "tokenizers.LICENSE"},
    "report": {"report.json", "report.csv", "report.md", "report.html", "accuracy_vs_size.png",
               "kld_by_position.png", "state_vs_kld.png"},
    "compare": {"compare.json", "compare.md", "compare.html", "bits_per_byte.png", "weights_kld.png", "state_kld.png",
                "cpu_decode.png"},
    # a training schedule paused by recipes/train_tiny.py --pause-after, to go on from with --resume
    "resume": {"model.safetensors", "exp_avg.safetensors", "exp_avg_sq.safetensors", "position.safetensors",
               "best.safetensors", "progress.json"},
}
FILE_PATTERNS = {"model": re.compile(r"model-\d{5}-of-\d{5}\.safetensors")}  # Hugging Face shards
SUBDIRECTORIES = {"report": ("exports", "export")}  # report/exports/* are exports (`report --onnx --keep-exports`)
FILE_KINDS = {"json", "markdown", "calibration", "logits", "state"}
KIND_NAMES = {"model": "an edgettt or TTT model directory", "export": "an edgettt export directory",
              "report": "an edgettt report directory", "json": "a JSON file", "markdown": "a text file",
              "calibration": "an edgettt calibration file", "logits": "an edgettt reference-logits file",
              "state": "an edgettt state file", "resume": "a paused training schedule",
              "compare": "an edgettt compare directory"}


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None


def _safetensors_metadata(path: Path) -> dict | None:
    """The metadata of a safetensors file, read from its header alone (no tensors, no torch)."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 0 < size <= 100 * 2**20:
                return None
            header = json.loads(f.read(size))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta if isinstance(meta, dict) else {}


def _is_text(path: Path) -> bool:
    try:
        data = path.read_bytes()
        data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return b"\0" not in data


def recognise(path: Path, kind: str) -> bool:
    """Whether `path` is an output of `kind` as edgettt writes it (and so may be replaced with --force)."""
    if path.is_symlink():
        return False
    if kind in DIRECTORY_FILES:
        if not path.is_dir():
            return False
        entries = list(path.iterdir())
        sub, sub_kind = SUBDIRECTORIES.get(kind, (None, None))
        for e in entries:
            if e.name == sub and e.is_dir() and not e.is_symlink():
                if not all(recognise(x, sub_kind) for x in e.iterdir()):
                    return False
            elif not e.is_file() or e.is_symlink() or not (
                    e.name in DIRECTORY_FILES[kind] or (kind in FILE_PATTERNS and FILE_PATTERNS[kind].fullmatch(e.name))):
                return False  # something edgettt did not put there
        if kind == "model":
            config = _read_json(path / "config.json")
            return isinstance(config, dict) and config.get("model_type") in ("ttt", "edgettt-linear-attention")
        if kind == "export":
            manifest = _read_json(path / "manifest.json")
            return isinstance(manifest, dict) and "edgettt_export" in manifest
        if kind == "compare":
            compared = _read_json(path / "compare.json")
            return isinstance(compared, dict) and "models" in compared
        if kind == "resume":
            progress = _read_json(path / "progress.json")
            return isinstance(progress, dict) and "step" in progress
        report = _read_json(path / "report.json")
        return isinstance(report, dict) and "rows" in report
    if not path.is_file():
        return False
    if kind == "json":
        return _read_json(path) is not None
    if kind == "markdown":
        return _is_text(path)
    meta = _safetensors_metadata(path)
    if meta is None:
        return False
    if kind == "calibration":
        return meta.get("edgettt_calibration") == "1"
    if kind == "state":
        return meta.get("format") == "edgettt-state"  # (`state_file.STATE_FORMAT`)
    return {"text", "model", "ctx"} <= set(meta)  # logits


def _relation(out: Path, other: Path) -> str | None:
    """How the resolved `out` overlaps `other`: 'is', 'is inside' or 'contains'; None if apart."""
    if out == other:
        return "is"
    if other in out.parents:
        return "is inside"
    if out in other.parents:
        return "contains"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _usual_permissions(path: Path) -> None:
    """Some writers (safetensors) make private files; an output should look like any file the user makes."""
    umask = os.umask(0)
    os.umask(umask)
    for item in [path, *(path.iterdir() if path.is_dir() else [])]:
        os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~umask)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


@dataclass
class Output:
    """An output path checked before the work; `write()` fills and publishes it."""

    path: Path
    kind: str
    force: bool = False
    api: bool = False  # errors name force=True (the Python API) rather than --force (the command line)
    created_parents: list[Path] = field(default_factory=list)
    published: bool = False  # written once already: a later `write()` replaces it (a partial result)

    @property
    def is_dir(self) -> bool:
        return self.kind in DIRECTORY_FILES

    @classmethod
    def plan(cls, path, kind: str, force: bool = False, inputs=(), option: str | None = None,
             api: bool = False) -> "Output":
        """Check `path` as an output of `kind` against the command's `inputs` (paths; None and names
        that are not paths are skipped). Raises EdgetttError with a one-line reason."""
        if kind not in DIRECTORY_FILES and kind not in FILE_KINDS:
            raise ValueError(f"unknown output kind {kind!r}")
        out = cls(Path(path), kind, force, api)
        label = f"{option} {path}" if option else str(path)
        out._check_against_inputs(inputs, label)
        out.cleanup_leftovers()
        out._check_existing(label)
        out._check_parent(label)
        return out

    def _check_against_inputs(self, inputs, label: str) -> None:
        target = self.path.resolve()
        for given in inputs:
            if given is None or not Path(given).exists():
                continue
            relation = _relation(target, Path(given).resolve())
            if relation:
                raise EdgetttError(f"{label}: the output {relation} the input {given}; writing there would destroy "
                                   "it; choose an output path outside every input")

    def _check_existing(self, label: str) -> None:
        path = self.path
        if not (path.exists() or path.is_symlink()):
            return
        if not self.force:
            raise EdgetttError(f"{label}: already exists; pass {self._force_word} to replace it, or choose another "
                               "name")
        if not recognise(path, self.kind):
            raise EdgetttError(f"{label}: exists and is not {KIND_NAMES[self.kind]} that edgettt wrote (or holds "
                               f"other files); refusing to replace it even with {self._force_word}; choose another name")

    @property
    def _force_word(self) -> str:
        return "force=True" if self.api else "--force"

    def _missing_parents(self) -> tuple[Path, list[Path]]:
        """The nearest folder above the output that exists, and the folders below it still to make (top first)."""
        missing, existing = [], self.path.absolute().parent
        while not existing.exists():
            missing.append(existing)
            existing = existing.parent
        return existing, missing[::-1]

    def _check_parent(self, label: str) -> None:
        existing, missing = self._missing_parents()
        broken = next((folder for folder in missing if folder.is_symlink()), None)
        if broken is not None:
            raise EdgetttError(f"{label}: {broken} is a broken symlink; choose an output in an existing folder")
        if not existing.is_dir():
            raise EdgetttError(f"{label}: {existing} is a file, not a folder; choose an output in a folder")
        try:
            probe = tempfile.mkdtemp(prefix=".edgettt-probe-", dir=existing)
            os.rmdir(probe)
        except OSError as exc:
            raise EdgetttError(f"{label}: cannot write in {existing} ({exc.strerror}); choose a writable folder") \
                from None

    def _staging_dirs(self) -> list[Path]:
        parent = self.path.absolute().parent
        if not parent.is_dir():
            return []
        prefix = f".{self.path.name}{STAGING_TAG}"
        return [p for p in parent.iterdir() if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink()]

    def cleanup_leftovers(self) -> list[Path]:
        """Remove the staging directories of killed runs of this output (their process is gone);
        where a crash came between the two renames of a replacement, put the old output back first."""
        removed = []
        prefix = f".{self.path.name}{STAGING_TAG}"
        for staging in self._staging_dirs():
            pid = staging.name[len(prefix):].split("-")[0]
            if not pid.isdigit() or _pid_alive(int(pid)):
                continue  # another run's, still working
            parked = staging / PARKED
            if parked.exists() and not (self.path.exists() or self.path.is_symlink()):
                os.rename(parked, self.path)
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
        return removed

    @contextlib.contextmanager
    def write(self):
        """Yield the temporary directory (or file path) to fill; publish it when the block succeeds."""
        self._make_parents()
        staging = None
        try:
            staging = Path(tempfile.mkdtemp(prefix=f".{self.path.name}{STAGING_TAG}{os.getpid()}-",
                                            dir=self.path.absolute().parent))
            tmp = staging / PUBLISHED
            if self.is_dir:
                tmp.mkdir()
            yield tmp
            if not tmp.exists():
                raise EdgetttError(f"{self.path}: nothing was written")
            _usual_permissions(tmp)
            self._publish(tmp, staging)
            self.published = True
        except BaseException:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            self._remove_created_parents()
            raise
        shutil.rmtree(staging, ignore_errors=True)

    def _make_parents(self) -> None:
        for folder in self._missing_parents()[1]:
            folder.mkdir()
            self.created_parents.append(folder)

    def _remove_created_parents(self) -> None:
        for folder in reversed(self.created_parents):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if still empty

    def _publish(self, tmp: Path, staging: Path) -> None:
        final = self.path
        exists = final.exists() or final.is_symlink()
        # (an output this plan already published, a command's partial result, it replaces as with force)
        if exists and not ((self.force or self.published) and recognise(final, self.kind)):  # appeared or changed
            raise EdgetttError(f"{final}: appeared or changed while this run worked; nothing replaced, run again")
        if not self.is_dir or not exists:
            os.replace(tmp, final)  # a file over the old one; a directory where there was none
            return
        if _exchange(tmp, final):
            return  # tmp now holds the old output; the caller removes the staging directory
        os.rename(final, staging / PARKED)  # a crash here: the next run's cleanup_leftovers restores it
        os.rename(tmp, final)


STDOUT = "-"  # a JSON output's path for standard output (`--json -`)


def plan_outputs(*specs, inputs=()) -> list[Output]:
    """Plan several outputs of one command: each as `Output.plan(path, kind, force, inputs, option)`,
    and no two of them the same path or one inside another. Specs with path None are skipped
    (the returned list keeps their place as None); a JSON output's "-" is `STDOUT`."""
    planned = []
    for path, kind, force, option in specs:
        if path is None or (kind == "json" and str(path) == STDOUT):
            planned.append(None if path is None else STDOUT)
        else:
            planned.append(Output.plan(path, kind, force, inputs, option))
    real = [(o, s[3]) for o, s in zip(planned, specs) if isinstance(o, Output)]
    for i, (a, a_opt) in enumerate(real):
        for b, b_opt in real[i + 1:]:
            relation = _relation(a.path.resolve(), b.path.resolve())
            if relation:
                raise EdgetttError(f"{a_opt or ''} {a.path}: the output {relation} the output {b_opt or ''} "
                                   f"{b.path}; give each output its own path".strip())
    return planned


def write_json(out, data) -> None:
    """`data` as indented JSON to a planned output, or to standard output for `STDOUT`."""
    text = json.dumps(data, indent=2) + "\n"
    if out == STDOUT:
        sys.stdout.write(text)
        return
    with out.write() as tmp:
        tmp.write_text(text)


def as_output(target, kind: str, force: bool = False, inputs=()) -> Output:
    """An `Output` as given, or a path planned as one (the Python API's callers pass paths)."""
    return target if isinstance(target, Output) else Output.plan(target, kind, force, inputs, api=True)
