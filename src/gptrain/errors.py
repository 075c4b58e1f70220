"""The one exception type for mistakes a user can make.

The CLI prints its message on one line and exits with code 2. Internal bugs raise
anything else and keep their traceback.
"""


class UserError(Exception):
    """Bad input from the user: the message names the input and the fix."""


def closest(name: str, options) -> str:
    """' (did you mean X?)' for the closest option, or '' when nothing is close."""
    import difflib

    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""
