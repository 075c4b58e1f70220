"""A job's code: a snapshot of a directory or of a git repository in jobs/NAME/code (the
workers' working directory on every scheduler), and the job's extra packages.

    gptrain run NAME [--code DIR | --repository-url URL [--ref REF] | --source NAME]
                [--requirements FILE] -- train.py ARGS

A directory is copied as git sees it (`git ls-files --cached --others --exclude-standard` in a
work tree, else its top .gitignore), never its .git, at most GPTRAIN_CODE_MAX_MB (200) MiB. A
repository is cloned (`git clone -- URL`, never through a shell; no ext:: transport, no prompt)
and its commit recorded. --requirements installs into a virtualenv layered on gptrain's
(its packages stay importable), built once per file content under $GPTRAIN_HOME/venvs.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from gptrain.errors import UserError, has_credentials, redact
from gptrain.home import home
from gptrain.locations import is_url
from gptrain.jobs import folder
from gptrain.jobs.folder import code_dir

DEFAULT_MAX_MB = 200
REF = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._/+@-]*")
TRANSPORT = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*::")  # git's "<transport>::<address>" (ext:: runs commands)
GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "/bin/false", "SSH_ASKPASS": "/bin/false",
           "GIT_SSH_COMMAND": "ssh -oBatchMode=yes"}


def max_bytes() -> int:
    raw = os.environ.get("GPTRAIN_CODE_MAX_MB", str(DEFAULT_MAX_MB))
    try:
        return int(float(raw) * (1 << 20))
    except ValueError:
        raise UserError(f"GPTRAIN_CODE_MAX_MB={raw!r} is not a number of MiB") from None


def check_url(url: str) -> str:
    """A repository URL git may be handed (as one argument after --): no option, no command
    transport, no line breaks, and no credential in it: a password or token in its user part
    (any scheme, any case: HTTPS://u:p@, git+ssh://u:p@, scp-form u:p@host:path, https://TOKEN@)
    or its query string (?access_token=, ?token=). A refused URL is never echoed (it may hold
    one); it is described through `redact`."""
    if not isinstance(url, str) or not url or url.startswith("-") or any(c in url for c in "\n\r\0 \t"):
        raise UserError(f"repository URL {redact(url)!r} is not a URL or path (no blanks, not starting with -)")
    if TRANSPORT.match(url):
        raise UserError(f"repository URL {redact(url)!r} uses a git transport helper (x::...); use https://, "
                        "ssh://, git@host:path, file:// or a local path")
    if has_credentials(url):
        raise UserError(f"repository URL {redact(url)!r} must not hold credentials (a password or "
                        "token would be recorded): drop it and use a git credential helper or an SSH "
                        "key (--secret NAME=VALUE for the job's own use)")
    return url


def check_ref(ref: str | None) -> str | None:
    if ref is not None and not REF.fullmatch(ref):
        raise UserError(f"--ref {ref!r} is not a branch, tag or commit name (letters, digits, . _ / + @ -, "
                        "not starting with - or .)")
    return ref


def resolve_source(spec) -> None:
    """--source NAME: the repository (and ref, unless given) recorded by `gptrain source add`."""
    if not spec.source:
        return
    from gptrain.home import check_name
    from gptrain.jobs import store

    check_name(spec.source, "source")
    if spec.repository_url:
        raise UserError("give --source or --repository-url, not both")
    row = store.get_source(spec.source)
    spec.repository_url, spec.ref = row["url"], spec.ref or row["ref"]


@contextmanager
def staged(spec):
    """The job's code snapshot, made beside its job folder before anything is recorded (a user
    error leaves nothing behind; a SIGKILL's leftover goes with the next gptrain command,
    atomic.sweep_leftovers); `place` moves it in once the job is recorded."""
    resolve_source(spec)
    if spec.repository_url and spec.code:
        raise UserError("give --code or --repository-url (--source), not both")
    check_ref(spec.ref)
    if spec.ref and not spec.repository_url:
        raise UserError("--ref needs --repository-url or --source")
    if spec.repository_url:
        check_url(spec.repository_url)
    if spec.requirements_file and not spec.repository_url:
        raise UserError("a requirements path inside the repository needs --repository-url or --source")
    if not (spec.code or spec.repository_url):
        if spec.requirements:
            spec.python = job_python(spec.requirements)
        yield None
        return
    stage = folder.jobs_root() / f".{spec.name}.code-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        if spec.repository_url:
            spec.commit = clone(spec.repository_url, spec.ref, stage / "repo")
            copy_tree(stage / "repo", stage / "code", f"repository {spec.repository_url}")
            shutil.rmtree(stage / "repo")
        else:
            src = Path(spec.code).expanduser()
            if not src.is_dir():
                raise UserError(f"--code {spec.code}: no such directory")
            spec.code = str(src.resolve())
            copy_tree(src.resolve(), stage / "code", f"code directory {spec.code}")
        spec.code = spec.code or spec.repository_url
        entry_in_snapshot(spec, stage / "code")
        if spec.requirements_file:
            spec.requirements = read_in_snapshot(stage / "code", spec.requirements_file)
        if spec.requirements:
            spec.python = job_python(spec.requirements)
        yield stage / "code"
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def read_in_snapshot(root: Path, name: str, what: str = "--requirements") -> str:
    """A text file of the cloned repository, named relative to its top: never an absolute path,
    a `..`, or a link that leads outside the repository."""
    from gptrain.files import within

    rel = Path(name)
    if rel.is_absolute() or ".." in rel.parts or not name.strip():
        raise UserError(f"{what} {name}: with a repository, name a file inside it, relative to its top "
                        "(e.g. requirements.txt)")
    path = root / rel
    if not path.is_file() or not within(path, root):
        raise UserError(f"{what} {name}: no such file in the repository"
                        f"{' (a link out of it)' if path.exists() and not within(path, root) else ''}")
    if path.stat().st_size > 1 << 20:
        raise UserError(f"{what} {name}: over 1 MiB, not a requirements file")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise UserError(f"{what} {name}: not a text file") from None


def place(snapshot: Path | None, jdir: Path) -> None:
    if snapshot is not None:
        os.replace(snapshot, code_dir(jdir))


def entry_in_snapshot(spec, root: Path) -> None:
    """The script (or program file) named relative to the snapshot's top, where workers start."""
    attr = "script" if spec.entry == "script" else "command" if spec.entry == "command" else None
    value = getattr(spec, attr) if attr else None
    if value is None:
        return
    p = Path(value)
    if p.is_absolute() or not (root / p).exists():
        local = (Path.cwd() / p).resolve()
        top = Path(spec.code).resolve() if Path(spec.code).is_dir() else None
        if top is not None and local.is_relative_to(top) and (root / local.relative_to(top)).exists():
            p = local.relative_to(top)
        elif attr == "command" and not p.is_absolute() and "/" not in value:
            return  # a program on PATH (bash, accelerate, ...)
        elif p.is_absolute():
            return  # outside the snapshot: run where it is
        else:
            raise UserError(f"{value} is not in the job's code ({spec.code}): name it relative to "
                            "the top of that directory or repository")
    setattr(spec, attr, str(p) if attr == "script" else f"./{p}")


def list_files(root: Path) -> list[str]:
    """The files of `root` to snapshot, relative to it: git's view in a work tree (tracked and
    untracked, ignored ones left out), else a walk honouring its top .gitignore; never .git."""
    r = subprocess.run(["git", "-C", str(root), "rev-parse", "--is-inside-work-tree"],
                       capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    if r.returncode == 0 and r.stdout.strip() == "true":
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True).stdout
        names = [n for n in out.decode(errors="surrogateescape").split("\0") if n]
    else:
        names = _walk(root, _gitignore(root))
    return [n for n in names if ".git" not in Path(n).parts and
            ((root / n).is_file() or (root / n).is_symlink())]


def copy_tree(src: Path, dst: Path, what: str) -> None:
    names = list_files(src)
    inside = home().resolve()
    if inside.is_relative_to(src):  # $GPTRAIN_HOME under the code directory: not part of the code
        names = [n for n in names if not (src / n).resolve().is_relative_to(inside)]
    total = sum((src / n).lstat().st_size for n in names)
    if total > max_bytes():
        raise UserError(f"{what} holds {total / (1 << 20):.0f} MiB, more than the {max_bytes() >> 20} MiB "
                        "a job's code may: list data and checkpoints in .gitignore, or raise GPTRAIN_CODE_MAX_MB")
    dst.mkdir(parents=True)
    for n in names:
        (dst / n).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src / n, dst / n, follow_symlinks=False)


def _gitignore(root: Path) -> list[tuple[str, bool, bool, bool]]:
    """(pattern, negated, directories only, anchored) from root/.gitignore."""
    rules = []
    path = root / ".gitignore"
    for line in (path.read_text(errors="replace").splitlines() if path.is_file() else []):
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        neg = line.startswith("!")
        line = line[1:] if neg else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        rules.append((line.lstrip("/"), neg, dir_only, anchored))
    return rules


def _ignored(rel: str, is_dir: bool, rules) -> bool:
    hit = False
    for pattern, neg, dir_only, anchored in rules:
        if dir_only and not is_dir:
            continue
        target = rel if anchored else rel.rsplit("/", 1)[-1]
        if fnmatch.fnmatchcase(target, pattern):
            hit = not neg
    return hit


def _walk(root: Path, rules) -> list[str]:
    names = []
    for d, dirs, files in os.walk(root):
        rel = os.path.relpath(d, root)
        rel = "" if rel == "." else rel + "/"
        dirs[:] = [x for x in dirs if x != ".git" and not _ignored(rel + x, True, rules)]
        names += [rel + f for f in files if not _ignored(rel + f, False, rules)]
    return names


def clone(url: str, ref: str | None, dest: Path) -> str:
    """git clone URL (at REF) into dest; the commit checked out."""
    env = {**os.environ, **GIT_ENV}
    base = ["git", "-c", "protocol.ext.allow=never", "-c", "core.hooksPath=/dev/null"]

    def git(*args, cwd=None):
        r = subprocess.run([*base, *args], capture_output=True, text=True, env=env, cwd=cwd)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["git failed"])[-1]
            raise UserError(f"cannot clone {url}{f' at {ref}' if ref else ''}: {last}")
        return r.stdout.strip()

    git("clone", "--quiet", "--no-checkout", "--", url, str(dest))
    commit = None
    for name in ([f"origin/{ref}", ref] if ref else ["HEAD"]):
        r = subprocess.run([*base, "rev-parse", "--verify", "--quiet", f"{name}^{{commit}}"],
                           capture_output=True, text=True, env=env, cwd=dest)
        if r.returncode == 0:
            commit = r.stdout.strip()
            break
    if commit is None:
        raise UserError(f"cannot clone {url} at {ref}: no such branch, tag or commit")
    git("checkout", "--quiet", "--detach", commit, cwd=dest)
    return commit


# ---- --requirements: a virtualenv per requirements file, layered on gptrain's -----------------

def job_python(requirements: str) -> str:
    """The interpreter of the virtualenv holding `requirements` (built once, cached by the
    text's hash and gptrain's interpreter; concurrent submits wait on a lock)."""
    from gptrain.atomic import build_once

    digest = hashlib.sha256(f"{sys.executable}\n{requirements}".encode()).hexdigest()[:16]
    out = home() / "venvs" / digest
    build_once(out, lambda o: _build_venv(o, requirements), done=".ready")
    _torchrun(out)
    return str(out / "bin" / "python")


def _torchrun(venv: Path) -> None:
    """The virtualenv's own `torchrun` (first on the workers' PATH): a program that calls torchrun
    itself starts its workers with the job's interpreter, and so with the job's packages."""
    script = venv / "bin" / "torchrun"
    if not script.exists():
        from gptrain.atomic import write_text_atomic

        write_text_atomic(script, f"#!{venv / 'bin' / 'python'}\nimport sys\n"
                                  "from torch.distributed.run import main\nsys.exit(main())\n")
        script.chmod(0o755)


def _build_venv(out: Path, requirements: str) -> None:
    import site
    import sysconfig

    shutil.rmtree(out, ignore_errors=True)  # a build that died half-way
    try:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(out)],
                       check=True, capture_output=True)
        py = out / "bin" / "python"
        target = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
        ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                              *site.getsitepackages()])
        Path(target, "_gptrain_base.pth").write_text("\n".join(ours) + "\n")  # gptrain's packages too
        (out / "requirements.txt").write_text(requirements)
        r = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--quiet",
                            "--disable-pip-version-check", "-r", str(out / "requirements.txt")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise UserError(f"cannot install the job's requirements: {last}")
        (out / ".ready").write_text("")
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)
        raise


def add_source(name: str, url: str, ref: str | None = None) -> str:
    """Record a named repository (`gptrain source add`): its name, URL and default ref checked,
    a local path made absolute; the URL as kept."""
    from gptrain.home import check_name
    from gptrain.jobs import store

    check_name(name, "source")
    url = check_url(url)
    if not is_url(url) and ":" not in url.split("/", 1)[0]:  # a local path: kept absolute
        url = os.path.abspath(os.path.expanduser(url))
    store.add_source(name, url, check_ref(ref))
    return url


def sources() -> list[dict]:
    """The named repositories (name, url with any credential masked, ref)."""
    from gptrain.jobs import store

    return [{**s, "url": redact(s["url"])} for s in store.list_sources()]


def remove_source(name: str) -> None:
    from gptrain.jobs import store

    store.remove_source(name)
