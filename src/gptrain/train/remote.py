"""Checkpoints mirrored to object storage (checkpoint.remote: s3://, oci://, gs://, file://...).

A committed local checkpoint is copied to REMOTE/step-NNNNNN/, then REMOTE/latest is rewritten
to name it: `latest` is the commit, so a copy cut short is never pointed at. A run that starts
on a machine without the checkpoint (resume_from=auto) fetches the newest remote one into
OUTPUT/checkpoints first, the same all-or-nothing way as local checkpoints. Any filesystem
fsspec knows works; s3 needs s3fs, oci needs ocifs, gs needs gcsfs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from gptrain.errors import UserError, redact
from gptrain.run_layout import LATEST, is_step_name
from gptrain.files import is_plain_name
from gptrain.weights import checksums
from gptrain.weights.dcp import read_metadata
from gptrain.weights.layout import by_step, is_checkpoint_dir, read_state, root_of


def _fs(url: str):
    import fsspec

    if url.startswith("file://") and not url.startswith(("file:///", "file://localhost/")):
        # fsspec would read file://host/dir as a path relative to the current directory
        raise UserError(f"checkpoint.remote={url}: a file:// URL names an absolute local path, "
                        "as in file:///shared/run")
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as e:
        raise UserError(f"checkpoint.remote={url}: {e}") from None
    except ValueError as e:  # unknown protocol
        raise UserError(f"checkpoint.remote={url} is not a storage URL fsspec knows ({e})") from None


def check(url: str, output_dir) -> None:
    """Fail before training if the remote cannot be used at all, or is the run's own output
    folder or inside it (a copy onto its own checkpoints emptied every one of them)."""
    from pathlib import Path

    fs, root = _fs(url)
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        here, out = Path(root).resolve(), Path(output_dir).resolve()
        if here == out or here.is_relative_to(out):
            raise UserError(f"checkpoint.remote={url} is inside the run's own output folder {out}: a copy "
                            "there would overwrite the checkpoints it copies; name a folder outside it")
    try:
        fs.makedirs(root, exist_ok=True)
    except Exception as e:  # credentials, permissions, network: each backend has its own types
        raise UserError(f"cannot write to checkpoint.remote={url}: {type(e).__name__}: {e}") from None


def latest_name(url: str) -> str | None:
    fs, root = _fs(url)
    pointer = f"{root}/{LATEST}"
    if not fs.exists(pointer):
        return None
    name = fs.cat_file(pointer).decode(errors="replace").strip()
    if name and not (is_step_name(name) and is_plain_name(name)):  # never a path elsewhere
        raise UserError(f"{url}/latest names {name[:100]!r}, which is not a checkpoint of this run "
                        "(step-N); fix or remove it")
    return name or None


def upload(local: Path, url: str, keep_last: int | None) -> None:
    """Copy one committed checkpoint directory, then point REMOTE/latest at it."""
    fs, root = _fs(url)
    dest = f"{root}/{local.name}"
    if fs.exists(dest):
        fs.rm(dest, recursive=True)
    fs.makedirs(dest, exist_ok=True)
    for f in sorted(local.rglob("*")):
        if f.is_file():
            fs.put_file(str(f), f"{dest}/{f.relative_to(local).as_posix()}")
    fs.pipe_file(f"{root}/{LATEST}", local.name.encode())
    if keep_last:
        steps = by_step(p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)
                       if is_step_name(p.rstrip("/").rsplit("/", 1)[-1]))
        for name in steps[:-keep_last]:
            fs.rm(f"{root}/{name}", recursive=True)


def fetch_newest(url: str, output_dir: Path, local: Path | None, say) -> Path | None:
    """The newest remote checkpoint newer than the local one (`local`) that passes the checks a
    resume makes, fetched into OUTPUT/checkpoints: the one REMOTE/latest names, else each older
    remote step in turn, newest first (a damaged copy is passed by, `say` told why); None when
    none newer passes and there is a local one (the run resumes from it). With neither, the
    first refusal is the UserError: a run never starts over on top of a remote it could not load."""
    latest = latest_name(url)
    if latest is None:
        return None
    fs, root = _fs(url)
    names = {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(root, detail=False)}
    older = [n for n in by_step(n for n in names if is_step_name(n) and is_plain_name(n)) if n < latest]
    refused = []
    for name in [latest, *reversed(older)]:
        if local is not None and name <= local.name:
            return None
        say(f"fetching checkpoint {name} from {url}")
        try:
            return download(url, name, output_dir)
        except UserError as e:
            refused.append(str(e))
            say(f"warning: {e}; trying the remote checkpoint before it")
    if refused and local is None:
        more = f" (and {len(refused) - 1} older remote one(s) refused too)" if len(refused) > 1 else ""
        raise UserError(refused[0] + more + "; no remote checkpoint passes: resume from another with "
                        "--checkpoint.resume_from, or start again with --checkpoint.resume_from=none")
    return None


def download(url: str, name: str, output_dir: Path) -> Path:
    """REMOTE/name into OUTPUT/checkpoints/name (appears whole or not at all)."""
    fs, root = _fs(url)
    ckpt_root = root_of(output_dir)
    final, tmp = ckpt_root / name, ckpt_root / f".tmp-remote-{name}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    src = f"{root}/{name}"
    for path in fs.find(src):
        rel = path[len(src.rstrip("/")) + 1:] if path.startswith(src) else path.rsplit("/", 1)[-1]
        if not all(is_plain_name(part) for part in rel.split("/")):
            shutil.rmtree(tmp)
            raise UserError(f"{url}/{name} holds a file named {rel!r} that reaches outside the "
                            "checkpoint; it was not written by gptrain")
        target = tmp / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(path, str(target))
    if not is_checkpoint_dir(tmp):
        shutil.rmtree(tmp)
        raise UserError(f"{url}/{name} is not a complete gptrain checkpoint")
    try:  # the checks a resume makes, before it becomes the local latest: a refused one is not kept
        read_state(tmp)
        read_metadata(tmp)
        if checksums.verify(tmp) == checksums.UNVERIFIED:
            checksums.admit(redact(f"{url}/{name}"), "remote checkpoint")  # (named in run.json: no credential)
    except UserError as e:
        shutil.rmtree(tmp)
        raise UserError(f"{url}/{name} was refused and not kept: {e}".replace(str(tmp), f"{url}/{name}")) from None
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    (ckpt_root / LATEST).write_text(name)
    return final
