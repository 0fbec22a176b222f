"""A lab script's result written where its command line asks: the JSON and the markdown table."""

from __future__ import annotations

import json


def write(result: dict, markdown: str, json_path: str | None, markdown_path: str | None) -> None:
    """`result` as JSON at `json_path` and `markdown` at `markdown_path` (each only when given)."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=2)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(markdown)
