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


def disk_full(error: BaseException, path=None) -> UserError | None:
    """A one-line UserError for a full disk or an exhausted quota while writing `path` (or the
    file the OS named), or None when `error` is something else."""
    import errno

    code = getattr(error, "errno", None) if isinstance(error, OSError) else None
    for rust_code in (errno.ENOSPC, errno.EDQUOT):  # safetensors reports the OS error in its text
        if code is None and f"(os error {rust_code})" in str(error):
            code = rust_code
    if code not in (errno.ENOSPC, errno.EDQUOT):
        return None
    where = getattr(error, "filename", None) or path or "a file"
    what = "no space left on device" if code == errno.ENOSPC else "disk quota exceeded"
    return UserError(f"{what} writing {where}: free space on that disk and retry")
