"""The one exception type edgettt raises for bad input.

Its message is a single line that names the file, says what is wrong and what to do; the CLI
prints it as `error: ...` and exits non-zero without a traceback.
"""


class EdgetttError(Exception):
    """Bad input or a refused operation, explained in one line."""


def refuse_lact(model, name: str, operation: str) -> None:
    """One line for an operation that is not built for LaCT models yet (`model.config.family`)."""
    if getattr(model.config, "family", None) == "lact":
        raise EdgetttError(f"{name}: {operation} is not available for LaCT models yet (info, eval, convert, "
                           "speed, weight quantization, its report and the export of the parallel form are); use a TTT-Linear or TTT-MLP model for it")
