"""A shipped model's eval.json: held-out bits per byte on the whole python-docs test part and on the slice that
tests/test_shipped_models.py measures again, at each length, with the `edgettt eval` commands that give them.

    python recipes/eval_card.py MODEL OUT.json [--ctx 512,2048,8192] [--ref ORIGINAL] --note TEXT [--force]

MODEL: a model directory or a shipped name. With --ref (a parallel form's original): the original's numbers,
the ratio to them and the mean KLD against it at each length. The first length is the headline
(`test_bits_per_byte`, `slice_bits_per_byte`). OUT is written atomically and replaced only with --force.
"""

import argparse
import sys

import edgettt
from edgettt import EdgetttError
from edgettt.data import read_text
from edgettt.outputs import Output, write_json

TEXT = "python-docs:test"
WHOLE_TOKENS, SLICE_TOKENS = 100_000, 8192  # the whole test part (46,550 bytes); the slice the tests re-measure


def by_ctx(evaluations, key) -> dict[str, float]:
    return {str(e.report["ctx"]): key(e.report) for e in evaluations}


def card(model, name: str, ctx: list[int], note: str, ref=None, ref_name: str | None = None) -> dict:
    """eval.json's fields, measured."""
    whole = edgettt.evaluate(model, TEXT, ctx, WHOLE_TOKENS, ref=ref, name=name)
    slice_ = edgettt.evaluate(model, TEXT, ctx, SLICE_TOKENS, name=name)
    bits = lambda r: r["bits_per_byte"]  # noqa: E731
    first = str(ctx[0])
    out = {"test_bits_per_byte": bits(whole[0].report)}
    if len(ctx) > 1:
        out["test_bits_per_byte_by_ctx"] = by_ctx(whole, bits)
    if ref is not None:  # (the drift holds the original's own numbers on the same windows)
        original = by_ctx(whole, lambda r: bits(r["drift"]["ref"]))
        out["original_test_bits_per_byte_by_ctx"] = original
        out["ratio_to_original_by_ctx"] = {n: b / original[n] for n, b in by_ctx(whole, bits).items()}
        out["kld_mean_by_ctx"] = by_ctx(whole, lambda r: r["drift"]["kld_mean"])
    slices = by_ctx(slice_, bits)
    out["slice_bits_per_byte"] = slices.pop(first)
    if slices:
        out["slice_bits_per_byte_by_ctx"] = slices
    lengths = ",".join(map(str, ctx))
    against = f" --ref {ref_name}" if ref is not None else ""
    out |= {"slice": {"data": TEXT, "ctx": ctx[0], "max_tokens": SLICE_TOKENS},
            "text": read_text(TEXT).fingerprint(), "held_out": True,
            "commands": {"whole": f"edgettt eval {name}{against} --data {TEXT} --ctx {lengths} --max-tokens {WHOLE_TOKENS}",
                         "slice": f"edgettt eval {name} --data {TEXT} --ctx {lengths} --max-tokens {SLICE_TOKENS}"},
            "note": note}
    return out


def lengths(text: str) -> list[int]:
    """--ctx's window lengths, the headline first."""
    try:
        return [int(n) for n in text.split(",")]
    except ValueError:
        raise EdgetttError(f"--ctx {text}: give window lengths as numbers, e.g. 512,2048,8192") from None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--ctx", default="512", help="Window lengths, the headline first (default 512).")
    ap.add_argument("--ref", default=None, help="The original a parallel form was converted from.")
    ap.add_argument("--note", required=True, help="How the model was trained and what the test part is to it.")
    ap.add_argument("--force", action="store_true")
    args = ap.parse_args(argv)
    try:
        ctx = lengths(args.ctx)
        out = Output.plan(args.out, "json", args.force, inputs=[args.model], option="OUT")
        ref = edgettt.load(args.ref) if args.ref else None
        write_json(out, card(edgettt.load(args.model), args.model, ctx, args.note, ref, args.ref))
    except EdgetttError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
