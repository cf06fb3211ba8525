"""The one exception type that the CLI turns into a one-line error and exit code 2."""


class UserError(Exception):
    """Bad input from the user (data, flags, checkpoints). The CLI prints it without a traceback."""
