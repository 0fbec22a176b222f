"""The one exception type edgettt raises for bad input.

Its message is a single line that names the file, says what is wrong and what to do; the CLI
prints it as `error: ...` and exits non-zero without a traceback.
"""


class EdgetttError(Exception):
    """Bad input or a refused operation, explained in one line."""


