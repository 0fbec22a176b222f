"""The one exception type edgettt raises for bad input.

Its message is a single line that names the file, says what is wrong and what to do; the CLI
prints it as `error: ...` and exits non-zero without a traceback.
"""


class EdgetttError(Exception):
    """Bad input or a refused operation, explained in one line (line breaks that a message takes from
    the input it quotes are written as \\n and \\r)."""

    def __init__(self, message: str = ""):
        super().__init__(str(message).replace("\r", "\\r").replace("\n", "\\n"))


