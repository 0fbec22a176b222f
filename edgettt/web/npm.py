"""JavaScript packages vendored into a browser folder: pinned versions from the npm registry, checked
against their published integrity hash, downloaded once into a cache.

    files = ORT_WEB.files()     # {name in the folder: bytes}

The registry is npm's own (or `npm_config_registry`, as npm reads it); the cache is
$XDG_CACHE_HOME/edgettt/npm (~/.cache/edgettt/npm). A machine without the network can be given the
tarball by hand: `npm pack onnxruntime-web@1.31.1` into that folder. Files are read out of the
tarball by name; nothing in it is extracted to disk.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import tarfile
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from edgettt.errors import EdgetttError
from edgettt.progress import bar

REGISTRY = "https://registry.npmjs.org"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "edgettt" / "npm"


@dataclass(frozen=True)
class NpmPackage:
    name: str
    version: str
    integrity: str  # the registry's dist.integrity: sha512 of the tarball, base64
    files: dict  # path inside the package -> name in the browser folder

    @property
    def tarball_name(self) -> str:  # as `npm pack` names it
        return f"{self.name.lstrip('@').replace('/', '-')}-{self.version}.tgz"

    def url(self) -> str:
        registry = os.environ.get("npm_config_registry") or REGISTRY
        return f"{registry.rstrip('/')}/{self.name}/-/{self.name.split('/')[-1]}-{self.version}.tgz"

    def files_bytes(self) -> dict[str, bytes]:
        """{name in the folder: bytes} of `files`, from the checked tarball."""
        data = self.tarball()
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            out = {}
            for inside, name in self.files.items():
                member = tar.getmember(f"package/{inside}")
                if not member.isfile():
                    raise EdgetttError(f"{self.name} {self.version}: {inside} is not a file in its package")
                out[name] = tar.extractfile(member).read()
        return out

    def tarball(self) -> bytes:
        """The package's tarball from the cache, or downloaded into it; its hash checked either way."""
        cached = cache_dir() / self.tarball_name
        if cached.is_file():
            data = cached.read_bytes()
            if self._matches(data):
                return data
        data = self._download()
        if not self._matches(data):
            raise EdgetttError(f"{self.name} {self.version} from {self.url()}: its sha512 is not the published one; "
                               "the download was altered or cut short: try again")
        cached.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=cached.parent, prefix=f".{self.tarball_name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, cached)
        return data

    def _matches(self, data: bytes) -> bool:
        algorithm, _, digest = self.integrity.partition("-")
        return base64.b64encode(hashlib.new(algorithm, data).digest()).decode() == digest

    def _download(self) -> bytes:
        url = self.url()
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                total = int(response.headers.get("Content-Length") or 0) or None
                chunks = []
                with bar(total=total, desc=f"{self.name} {self.version}", unit="B", leave=False) as progress:
                    while chunk := response.read(1 << 20):
                        chunks.append(chunk)
                        progress.update(len(chunk))
                return b"".join(chunks)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", None) or exc
            raise EdgetttError(f"{self.name} {self.version}: cannot be downloaded from {url} ({reason}); connect "
                               f"once (it is kept in {cache_dir()}), or put `npm pack {self.name}@{self.version}`'s "
                               "tarball there") from None


ORT_WEB = NpmPackage(
    "onnxruntime-web", "1.31.1",
    "sha512-5GeH+bWQ+HxM10z7erGlsWqryrwMbSvm/1tkIsKTT48g0fI19VXVVC435t4t7VsPdSQeS7NmuZPXrQ73k82URw==",
    # the WebAssembly build alone (the module, its loader and the SIMD + threads binary); the licence is in
    # the module's banner
    {"dist/ort.wasm.min.mjs": "ort.wasm.min.mjs", "dist/ort-wasm-simd-threaded.mjs": "ort-wasm-simd-threaded.mjs",
     "dist/ort-wasm-simd-threaded.wasm": "ort-wasm-simd-threaded.wasm"})

TOKENIZERS_JS = NpmPackage(
    "@huggingface/tokenizers", "0.2.0",
    "sha512-LidMHe1FpcSYH4vcSjXooda34pC0M8m1gmDOv7SQi6Iv+ib1zX7J3sHBCC9/3FPCkn2k1b55FneVqMRxrr99pg==",
    {"dist/tokenizers.min.mjs": "tokenizers.min.mjs", "LICENSE": "tokenizers.LICENSE"})
