"""Named datasets: files under $GPTRAIN_HOME/datasets/NAME, registered in gptrain.db.

A dataset is one of three kinds, recorded with it:
  prepared      made by `gptrain data prepare` / `import` (meta.json + token files, with sha256s),
                or nanoGPT's folder (train.bin, val.bin, meta.pkl), stored as one (data/nanogpt_dir.py)
  save_to_disk  a Hugging Face `save_to_disk` folder, kept as it is: a script calls
                `datasets.load_from_disk(os.environ["GPTRAIN_DATASET_DIR"])`, and the built-in
                trainer imports it once (data/hf_import.py, cached); when it holds token ids
                (input_ids), the tokenizer they came from is recorded when named at push (else
                the job that reads them names it)
  files         any other folder, kept as it is
The last two get a manifest (MANIFEST: each file's size and sha256) beside their files.
push copies and verifies into a hidden directory (removed again on any failure, a full disk
included; after a SIGKILL, by the next gptrain command: atomic.sweep_leftovers), renames it into
place, then registers it; rm unregisters first, then deletes. A
name is usable exactly when it is registered and its files are complete.
"""

from __future__ import annotations

import json
import os
import stat
import shutil
import time
from pathlib import Path

from gptrain import db
from gptrain.data.formats import is_prepared_dir, read_meta, sha256_file, verify
from gptrain.errors import UserError, disk_full, redact
from gptrain.files import shown, within
from gptrain.home import check_name, home
from gptrain.locations import is_url


MANIFEST = ".gptrain-manifest.json"
KINDS = ("prepared", "save_to_disk", "files")


def datasets_dir() -> Path:
    return home() / "datasets"


def path_of(name: str) -> Path:
    """The folder of the dataset `name` on this machine's disk (one in object storage: one line)."""
    check_name(name, "dataset")
    db.recover_once("datasets", _recover)
    row = db.fetch_one("SELECT path FROM datasets WHERE name = ?", (name,))
    if row is None:
        raise UserError(f"no dataset named {name!r}; see `gptrain data list`")
    if is_url(row["path"]):
        raise UserError(f"dataset {name!r} is kept in object storage ({redact(row['path'])}), not in a folder here: "
                        "jobs and --data.path stream it by its name")
    if not is_complete(row["path"]):
        raise UserError(f"dataset {name!r} is registered but its files in {row['path']} are gone; "
                        f"`gptrain data rm {name}` and push it again")
    return Path(row["path"])


def location_of(name: str) -> str:
    """Where the dataset `name` is: its folder here, or its URL in object storage once available
    (data/object_store.py); what a job's GPTRAIN_DATASET_DIR and --data.path get."""
    from gptrain.data.object_store import url_of

    return url_of(name) or str(path_of(name))


def is_path(ref: str) -> bool:
    """Whether a dataset reference is written as a path (it has a '/', or starts with . or ~)."""
    return "/" in ref or ref.startswith((".", "~"))


def resolve(ref: str) -> Path:
    """What a dataset reference means, by one rule: written as a path (see is_path), it is that
    file or directory; a bare word is the pushed dataset of that name, and only when no dataset
    has that name, a file or directory of that name in the current directory. So a pushed name is
    never shadowed by a folder beside you (write ./NAME for the folder)."""
    import sys

    p = Path(ref).expanduser()
    if is_path(ref):
        if not p.exists():
            raise UserError(f"dataset path {ref} does not exist")
        return p
    if registered(ref):
        if p.exists():
            print(f"note: {ref!r} is the pushed dataset; for the {'directory' if p.is_dir() else 'file'} "
                  f"here, write ./{ref}", file=sys.stderr)
        return path_of(ref)
    if p.exists():
        return p
    raise UserError(f"no dataset named {ref!r} and no file or directory ./{ref}; see `gptrain data list`")


def registered(name: str) -> bool:
    from gptrain.home import NAME_RE

    if not NAME_RE.fullmatch(name) or not db.db_path().is_file():
        return False
    db.recover_once("datasets", _recover)
    return db.fetch_one("SELECT 1 FROM datasets WHERE name = ?", (name,)) is not None


def _recover(made: float) -> None:
    """Each complete dataset folder that predates this database (db.recover_once) registered
    again: its kind, tokenizer and tokens from its meta.json or manifest. Hidden folders (a push
    or rm under way) and folders made since are not touched."""
    from gptrain.home import NAME_RE

    try:
        folders = sorted(datasets_dir().iterdir())
    except OSError:
        return
    for d in folders:
        try:
            if not NAME_RE.fullmatch(d.name) or d.is_symlink() or not is_complete(d) or d.stat().st_mtime >= made:
                continue
            if (d / MANIFEST).is_file():
                info = json.loads((d / MANIFEST).read_text())
                kind, tok = str(info.get("kind", "files")), info.get("tokenizer")
                tokenizer, tokens = ((tok.get("path") if tok.get("name") == "hf" else tok.get("name")) or "-"
                                     if isinstance(tok, dict) else "-"), 0
            else:
                meta = read_meta(d)
                kind, tokenizer = "prepared", meta["tokenizer_name"]
                tokens = sum(split["tokens"] for split in meta["splits"].values())
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        except (OSError, UserError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not a dataset gptrain can read: left as it is
        with db.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO datasets (name, path, tokenizer, tokens, bytes, created, kind) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)", (d.name, str(d), str(tokenizer), int(tokens), size,
                                                          d.stat().st_mtime, kind))


def kind_of(path) -> str:
    """'prepared', 'save_to_disk' or 'files' for a folder (a nanoGPT folder is pushed as prepared)."""
    from gptrain.data.hf_import import is_hf_saved
    from gptrain.data.nanogpt_dir import is_nanogpt_dir

    if is_prepared_dir(path) or is_nanogpt_dir(path):
        return "prepared"
    return "save_to_disk" if is_hf_saved(path) else "files"


def is_complete(path) -> bool:
    return is_prepared_dir(path) or (Path(path) / MANIFEST).is_file()


def push(name: str, src: str, tokenizer: str = "") -> Path:
    """Copy a dataset folder of any kind into the store; checksums verified; all or nothing.
    `tokenizer` names the tokenizer of a save_to_disk folder's token ids (asked for when it has
    input_ids) or of a nanoGPT folder without meta.pkl (GPT-2 by default)."""
    from gptrain.data import nanogpt_dir

    check_name(name, "dataset")
    src_dir = Path(src).expanduser()
    if not src_dir.is_dir():
        raise UserError(f"{src} is not a directory; push a dataset folder (prepared, save_to_disk or any files)")
    _check_links(src_dir)
    kind = kind_of(src_dir)
    if kind == "save_to_disk":  # scripts load_from_disk it: its metadata may only name its own files
        from gptrain.data.hf_import import check_saved

        check_saved(src_dir)
    nanogpt = nanogpt_dir.is_nanogpt_dir(src_dir)
    if kind == "prepared" and not nanogpt:
        verify(src_dir)
    tok_spec = _ids_tokenizer(src_dir, tokenizer, datasets_dir() / name) if kind == "save_to_disk" else None
    if tokenizer and nanogpt and (src_dir / nanogpt_dir.META_PKL).exists():
        raise UserError(f"{src} has nanoGPT's meta.pkl: its character vocabulary is the tokenizer; drop --tokenizer")
    if tokenizer and (kind == "files" or (kind == "prepared" and not nanogpt)):
        raise UserError(f"--tokenizer is for a save_to_disk folder of token ids or a nanoGPT folder; {src} is "
                        f"{'a prepared dataset (its meta.json names its tokenizer)' if kind == 'prepared' else 'neither'}")
    dest = datasets_dir() / name
    if dest.exists():
        raise UserError(f"dataset {name!r} already exists; `gptrain data rm {name}` first or pick another name")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{name}.push-{os.getpid()}"
    try:
        if nanogpt:
            meta = nanogpt_dir.to_prepared(src_dir, tmp, tokenizer)  # the one reading of such a folder
            verify(tmp)
            left = sorted(p.name for p in src_dir.iterdir() if not (tmp / p.name).exists())
            if left:
                import sys

                print(f"note: nanoGPT's folder: kept {', '.join(sorted(p.name for p in tmp.iterdir() if p.name != 'meta.json'))}; "
                      f"left out {', '.join(left[:5])}{' ...' if len(left) > 5 else ''}", file=sys.stderr)
            tokenizer, tokens = meta["tokenizer_name"], sum(s["tokens"] for s in meta["splits"].values())
        elif kind == "prepared":
            meta = read_meta(src_dir)
            tmp.mkdir()
            names = [f["name"] for split in meta["splits"].values() for f in split["files"]]
            extra = ["meta.pkl"] if (src_dir / "meta.pkl").is_file() else []  # nanoGPT's, kept as is
            for fname in ["meta.json", *names, *extra]:
                shutil.copy2(src_dir / fname, tmp / fname)
            verify(tmp)  # what landed is what was prepared
            tokenizer, tokens = meta["tokenizer_name"], sum(s["tokens"] for s in meta["splits"].values())
        else:
            manifest, links = _manifest(src_dir)
            shutil.copytree(src_dir, tmp, symlinks=True, ignore=shutil.ignore_patterns(MANIFEST))
            links = _relink(src_dir, tmp, links)
            _check_manifest(tmp, manifest, links, checksums=True)  # what landed is what was there
            (tmp / MANIFEST).write_text(json.dumps({"kind": kind, "files": manifest, "links": links,
                                                    **({"tokenizer": tok_spec} if tok_spec else {})}, indent=1))
            tokenizer, tokens = (tok_spec["path"] if tok_spec["name"] == "hf" else tok_spec["name"]) if tok_spec else "-", 0
        with db.transaction() as conn:
            if conn.execute("SELECT 1 FROM datasets WHERE name = ?", (name,)).fetchone():
                raise UserError(f"dataset {name!r} already exists; `gptrain data rm {name}` first")
            os.rename(tmp, dest)
            size = sum(f.stat().st_size for f in dest.rglob("*") if f.is_file())
            conn.execute("INSERT INTO datasets (name, path, tokenizer, tokens, bytes, created, kind) "
                         "VALUES (?, ?, ?, ?, ?, ?, ?)", (name, str(dest), tokenizer, tokens,
                                                          size, time.time(), kind))
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = disk_full(e, dest)
        if full is not None:
            raise full from None
        if isinstance(e, (shutil.Error, OSError)) and not isinstance(e, UserError):
            raise UserError(f"cannot copy {src}: {str(e).splitlines()[0][:200]}") from None
        raise
    return dest


def _ids_tokenizer(folder: Path, tokenizer: str, dest: Path) -> dict | None:
    """The spec of the tokenizer a save_to_disk folder's token ids came from: the one named, the
    one saved in the folder itself (save_pretrained beside save_to_disk; loaded from its stored
    copy at `dest`), or None: a folder without input_ids (its text needs none), or ids whose
    tokenizer nobody named (the hosted tutorial's push): a job that reads them names it then
    (--model_name_or_path, --data.tokenizer), never assumed (train/model_init.resolve_data)."""
    from gptrain import tokenizers

    if not tokenizer:
        if has_token_ids(folder) and any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
            tokenizers.HFTokenizer(str(folder))  # it loads (its own code never runs)
            return {"name": "hf", "path": str(dest.resolve())}
        return None
    if tokenizer == "char":
        raise UserError("--tokenizer char names no vocabulary; for token ids give gpt2, byte or a tokenizer directory")
    return tokenizers.by_name(tokenizer).spec()


def has_token_ids(folder: Path) -> bool:
    """Whether a save_to_disk folder (one Dataset, or a DatasetDict's split folders) has an
    input_ids column, from its dataset_info.json files (read as JSON, nothing loaded)."""
    from gptrain.files import read_json

    infos = [folder / "dataset_info.json", *sorted(folder.glob("*/dataset_info.json"))]
    features = [read_json(p, "dataset info").get("features") for p in infos if p.is_file() and not p.is_symlink()]
    return any(isinstance(f, dict) and "input_ids" in f for f in features)


def recorded_tokenizer(path) -> dict | None:
    """The tokenizer spec recorded at push for a stored save_to_disk folder's ids (None: none)."""
    from gptrain.files import read_json
    from gptrain.tokenizers import check_spec

    manifest = Path(path) / MANIFEST
    spec = read_json(manifest, "dataset manifest").get("tokenizer") if manifest.is_file() else None
    return None if spec is None else check_spec(spec, f"{manifest}'s tokenizer")


def _walk(folder: Path) -> tuple[list[Path], list[Path]]:
    """Every plain file and every link under folder, links not followed (a linked folder is a
    link, its files are where it points)."""
    files, links = [], []
    for root, dirs, names in os.walk(folder):
        for n in dirs + names:
            p = Path(root) / n
            if p.is_symlink():
                links.append(p)
            elif n in names and p.name != MANIFEST:
                if not stat.S_ISREG(p.lstat().st_mode):  # a pipe would block the push, a device never end
                    raise UserError(f"{shown(p)} is not a plain file (a named pipe, socket or device); a "
                                    "dataset holds files: move it out of the folder and push again")
                files.append(p)
    return sorted(files), sorted(links)


def _check_links(folder: Path) -> None:
    """A pushed folder's links may only point at something inside it (they are copied as
    links); one pointing outside or at nothing is refused, naming it."""
    for link in _walk(folder)[1]:
        if not (link.exists() and within(link, folder)):
            raise UserError(f"{shown(link)} is a link to {'a path outside ' + shown(folder) if link.exists() else 'nothing'}: "
                            "links in a pushed folder may only point inside it; copy what it points to into the folder")


def _relink(src: Path, dest: Path, links: list[dict]) -> list[dict]:
    """The copied links pointed as their originals do, relative, so they stay inside dest (an
    absolute link into src would point back at src)."""
    out = []
    for entry in links:
        target = Path(os.path.realpath(src / entry["name"])).relative_to(Path(os.path.realpath(src)))
        link = dest / entry["name"]
        link.unlink()
        link.symlink_to(os.path.relpath(dest / target, link.parent))
        out.append({"name": entry["name"], "target": os.readlink(link)})
    return out


def _manifest(folder: Path) -> tuple[list[dict], list[dict]]:
    files, links = _walk(folder)
    if not files:
        raise UserError(f"{folder} holds no files; nothing to push")
    return ([{"name": str(p.relative_to(folder)), "bytes": p.stat().st_size, "sha256": sha256_file(p)}
             for p in files], [{"name": str(p.relative_to(folder))} for p in links])


def _check_manifest(folder: Path, manifest: list[dict], links: list[dict], checksums: bool) -> None:
    """Every file and link the manifest names, as it names it, and nothing else."""
    for f in manifest:
        p = folder / f["name"]
        if p.is_symlink() or not p.is_file() or p.stat().st_size != f["bytes"]:
            raise UserError(f"dataset file {shown(p)} is missing or has the wrong size; push the dataset again")
        if checksums and sha256_file(p) != f["sha256"]:
            raise UserError(f"dataset file {shown(p)} fails its sha256 check: it is corrupted; push the dataset again")
    for entry in links:
        p = folder / entry["name"]
        if not p.is_symlink() or os.readlink(p) != entry["target"] or not within(p, folder):
            raise UserError(f"dataset link {shown(p)} is missing or points elsewhere; push the dataset again")
    files, found = _walk(folder)
    extra = {str(p.relative_to(folder)) for p in files + found} - {f["name"] for f in manifest + links}
    if extra:
        raise UserError(f"dataset file {shown(folder / min(extra))} is not in its manifest: it was "
                        "added after the push or pushed through a link; push the dataset again")


def verify_any(path, checksums: bool = True) -> dict:
    """Check a stored dataset of any kind; {'kind', 'files': [...]} (meta.json's for prepared)."""
    path = Path(path)
    if is_prepared_dir(path):
        verify(path, checksums)
        return {"kind": "prepared", "meta": read_meta(path)}
    from gptrain.files import read_json

    info = read_json(path / MANIFEST, "dataset manifest")
    files, links = info.get("files"), info.get("links", [])
    if not all(isinstance(entries, list) and all(
            isinstance(f, dict) and isinstance(f.get("name"), str) and ".." not in Path(f["name"]).parts
            and not Path(f["name"]).is_absolute() for f in entries) for entries in (files, links)) or \
            not all(isinstance(f.get("target"), str) for f in links):
        raise UserError(f"dataset manifest {path / MANIFEST} is corrupt; push the dataset again")
    _check_manifest(path, files, links, checksums)
    return {"kind": info.get("kind", "files"), "files": files}


def list_all() -> list[dict]:
    """Every registered dataset: name, path, tokenizer, tokens, bytes, created."""
    db.recover_once("datasets", _recover)
    return db.fetch_all("SELECT * FROM datasets ORDER BY name")


def remove(name: str) -> None:
    """Unregister `name` and delete its folder; a dataset in object storage is unregistered only
    (its objects are left where they are: the store is the user's)."""
    check_name(name, "dataset")
    row = db.fetch_one("SELECT path FROM datasets WHERE name = ?", (name,))
    if row is not None and (is_url(row["path"]) or not is_complete(row["path"])):
        # in object storage, or its folder gone or damaged (removed by hand): the name is freed;
        # what is left of the folder goes too, never anything outside the datasets folder
        with db.transaction() as conn:
            conn.execute("DELETE FROM datasets WHERE name = ?", (name,))
        left = Path(row["path"])
        if not is_url(row["path"]) and left.is_dir() and not left.is_symlink() and left.parent == datasets_dir():
            shutil.rmtree(left, ignore_errors=True)
        return
    p = path_of(name)
    with db.transaction() as conn:
        conn.execute("DELETE FROM datasets WHERE name = ?", (name,))
        trash = p.parent / f".{name}.rm-{os.getpid()}"
        os.rename(p, trash)  # the name disappears at once; the bytes go after
    shutil.rmtree(trash)
