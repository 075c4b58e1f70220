"""The one exception type for mistakes a user can make.

The CLI prints its message on one line and exits with code 2. Internal bugs raise
anything else and keep their traceback.
"""


import re

from gptrain.locations import is_url


class Interrupted(Exception):
    """A wait cut short by a stop request (gptrain/stop.py): the caller saves what it has and exits."""


class InfraError(Exception):
    """Storage, network or another machine failed, not the user: one line, exit 1, and a job's
    --max-restarts applies (a restart may well succeed). The message names what failed, with
    any credential masked."""

_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)([^\s'\"<>]*)")


# a URL's `;name=value` parameters (RFC 3986 path parameters: `/x;token=...`, `;jsessionid=`)
_PARAM = re.compile(r";([^;=/?#]*)=([^;/?#]*)")
# what in such a name says the value is a credential (any case, - and _ ignored, anywhere in the
# name: access_token, api_key, X-Amz-Signature, sig, password, passwd, pwd, credential, auth...)
CREDENTIAL_WORDS = ("token", "key", "secret", "pass", "pwd", "sig", "credential", "auth", "session", "cookie")


def _credential_param(name: str) -> bool:
    from urllib.parse import unquote

    name = unquote(name).lower().replace("-", "").replace("_", "")  # ;%74oken= is ;token=
    return any(word in name for word in CREDENTIAL_WORDS)


def _scrub_params(url: str) -> str:
    """`url` with the value of each credential `;name=value` replaced by ***, and a fragment
    that holds a credential (`#access_token=...`) by `#***`."""
    url = _PARAM.sub(lambda m: f";{m.group(1)}=***" if _credential_param(m.group(1)) else m.group(0), url)
    head, hash_, fragment = url.partition("#")
    return head + "#***" if hash_ and _credential_fragment(fragment) else url


# a fragment's `name=value` pairs (`#access_token=...&token_type=bearer`: OAuth's implicit grant)
_FRAGMENT_PAIR = re.compile(r"(?:^|[&;#/?])([^&;#/?=]*)=")


def _credential_fragment(fragment: str) -> bool:
    return any(_credential_param(name) for name in _FRAGMENT_PAIR.findall(fragment))


def scrub_credentials(text: str) -> str:
    """`text` with whatever can carry a credential in each URL in it (a user part such as
    `user:secret@`, a query string such as a presigned signature, a `;token=` parameter) replaced
    by ***."""
    def scrub(m: re.Match) -> str:
        authority, slash, path = m.group(2).partition("/")
        if "@" in authority:
            authority = "***@" + authority.rpartition("@")[2]
        url = _scrub_params(authority + slash + path)
        return m.group(1) + (url.split("?", 1)[0] + "?***" if "?" in url else url)

    return _URL.sub(scrub, text)


SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)$", re.S)


def has_credentials(url: str) -> bool:
    """Whether `url` holds a credential: a password or token in its user part (any scheme, any
    case: HTTPS://u:p@, git+ssh://u:p@, scp-form u:p@host:path, https://TOKEN@), a query string
    (?access_token=, ?X-Amz-Signature=: any query) or a path parameter named as a credential
    (`;token=`, `;X-Amz-Signature=`: CREDENTIAL_WORDS; `;` is a plain character in a file or
    object name) or in its fragment (`#access_token=`); in any link of an fsspec chain (simplecache::https://u:p@host/x)."""
    if "::" in url:
        return any(has_credentials(link) for link in url.split("::"))
    m = SCHEME.match(url)
    if m and any(_credential_param(p.group(1)) for p in _PARAM.finditer(url)):
        return True
    if m and "#" in url and _credential_fragment(url.partition("#")[2]):
        return True  # `#access_token=`: a token in the fragment is recorded with the URL as well
    if m:
        scheme, authority, rest = m.group(1).lower(), m.group(2), m.group(3)
        user = authority.rpartition("@")[0] if "@" in authority else None
        if user is not None and (":" in user or not scheme.endswith("ssh")):
            return True  # a password, or a bare token as the user of a non-ssh URL
        return "?" in rest  # query strings carry tokens (a presigned signature, ?token=)
    head = url.split("/", 1)[0]  # scp-form [user@]host:path: the part before any slash
    return "@" in head and ":" in head.rpartition("@")[0]


def names_a_credential(text: str) -> bool:
    """Whether a URL written in `text` (a program's argument, an environment value) carries a
    credential that it names as one: a user part with a password (or a bare token, but for ssh),
    or a query, path parameter or fragment whose name says credential (`?access_token=`,
    `;sig=`, `#token=`: CREDENTIAL_WORDS). A plain query (`?page=2`) is not one."""
    for m in _URL.finditer(text):
        scheme, rest = m.group(1)[:-3].lower(), m.group(2)
        authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
        user = authority.rpartition("@")[0] if "@" in authority else None
        if user is not None and (":" in user or not scheme.endswith("ssh")):
            return True
        if any(_credential_param(p.group(1)) for p in _PARAM.finditer(rest)):
            return True
        query = rest.partition("?")[2].partition("#")[0]
        if any(_credential_param(name) for name in re.findall(r"(?:^|&)([^&=]*)=", query)):
            return True
        if "#" in rest and _credential_fragment(rest.partition("#")[2]):
            return True
    return False


def redact(url) -> str:
    """A URL safe to show: one holding a credential with its user part, query string and
    credential parameters replaced by ***; any other as it is."""
    if not isinstance(url, str):
        return repr(url)
    if not has_credentials(url):
        return url
    if "::" in url:
        return "::".join(redact(link) for link in url.split("::"))
    url = _scrub_params(url)
    if not has_credentials(url):
        return url
    m = SCHEME.match(url)
    if m:
        authority, rest = m.group(2), m.group(3)
        host = ("***@" + authority.rpartition("@")[2]) if "@" in authority else authority
        path, query = rest.split("?", 1)[0], "?***" if "?" in rest else ""
        if "?" not in rest and "#***" in rest:
            path, query = rest.split("#", 1)[0], "#***"
        return f"{m.group(1)}://{host}{path}{query}"
    head, slash, tail = url.partition("/")
    if "@" in head:
        head = "***@" + head.rpartition("@")[2]
    return head + slash + tail


def refuse_credentials(url, what: str, names_only: bool = False) -> None:
    """One UserError when the data or checkpoint URL `url` (the setting `what`) holds a
    credential: it would be recorded. The URL is not echoed; the credential belongs in the
    environment, where fsspec reads it. A local path is never taken for a scp-form URL unless
    `names_only` (the value is a URL or a name, as after `hf:`)."""
    if isinstance(url, str) and (is_url(url) or names_only) and has_credentials(url):
        raise UserError(f"{what} {redact(url)!r} must not hold credentials (a password, token or signed "
                        "query would be recorded with the job, its config.toml or the dataset): drop them and "
                        "give them through the environment (AWS_* for s3://, FSSPEC_HTTPS='{\"headers\": {...}}' "
                        "for https://; --secret NAME=VALUE in a job), see docs/object-storage.md")


class UserError(Exception):
    """Bad input from the user: the message names the input and the fix. A URL in the message
    never shows its credentials (scrub_credentials): the message reaches terminals, job
    records and the console."""

    def __init__(self, *args):
        super().__init__(*(scrub_credentials(a) if isinstance(a, str) else a for a in args))


class BadName(UserError):
    """A malformed name (of a job, a dataset, a checkpoint): the console answers 400."""


class NotFound(UserError):
    """A well-formed name that names nothing (no such job, checkpoint, rank): the console answers 404."""


def closest(name: str, options) -> str:
    """' (did you mean X?)' for the closest option, or '' when nothing is close."""
    import difflib

    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def disk_full(error: BaseException, path=None) -> UserError | None:
    """A one-line UserError for a full disk or an exhausted quota while writing `path` (else the
    file the OS named), or None when `error` is something else. Looks through the exceptions
    that `error` was raised from: torch's zip writer, for one, turns ENOSPC into a RuntimeError."""
    import errno

    seen = 0
    while error is not None and seen < 8:
        code = error.errno if isinstance(error, OSError) else None
        for rust_code in (errno.ENOSPC, errno.EDQUOT):  # safetensors puts the OS error in its text
            if code is None and f"(os error {rust_code})" in str(error):
                code = rust_code
        if code in (errno.ENOSPC, errno.EDQUOT):
            # what the caller was writing; else the OS's names (for a copy, filename2 is the target)
            where = path or getattr(error, "filename2", None) or getattr(error, "filename", None) or "a file"
            what = "no space left on device" if code == errno.ENOSPC else "disk quota exceeded"
            return UserError(f"{what} writing {where}: free space on that disk and retry")
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


# What a collective says when another rank of the job is gone (gloo's TCP pair, NCCL).
_PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "remote process exited")
LOST_PEER = "lost another rank of the job"  # what lost_peer's line says (jobs/logs.py: never a cause)


def lost_peer(error: BaseException) -> InfraError | None:
    """A one-line InfraError for a collective that failed because another rank of the job died
    (its process, its host or the network between): the survivors' torch traceback says nothing
    the user can act on, the dead rank's own log does. None for anything else."""
    import os

    text = str(error) if isinstance(error, RuntimeError) else ""
    if not any(word in text for word in _PEER_GONE) or not ("gloo" in text or "NCCL" in text):
        return None
    what = text.split("] ", 1)[-1].split(". This is typically", 1)[0].splitlines()[0].strip()
    rank = os.environ.get("RANK", "?")
    return InfraError(f"rank {rank} {LOST_PEER} ({what}): a worker, its host or the network "
                      "between them failed; `gptrain inspect NAME` says which rank ended first and how. A job "
                      "restarts from its latest checkpoint while it has restarts left (--max-restarts, "
                      "0 by default)")
