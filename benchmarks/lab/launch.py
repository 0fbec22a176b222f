"""Launch settings the lab times against the kernels' own choices."""

import contextlib

from edgettt.ops.linear_attention import decode_token


@contextlib.contextmanager
def fixed_token_warps(warps: int):
    """Within: every decode token kernel launched with `warps`, not `decode_token.token_warps`' choice (for
    CUDA graphs, those captured within)."""
    chosen = decode_token.token_warps
    decode_token.token_warps = lambda block_d, commit, int8: warps
    try:
        yield
    finally:
        decode_token.token_warps = chosen
