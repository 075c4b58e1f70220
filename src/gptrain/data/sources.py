"""Where documents come from: local files/folders/globs, fsspec URLs, Hugging Face datasets.

Every source yields documents, and every document is a stream of text pieces of bounded size,
so a corpus is never held in memory whole. Pieces are cut only after a newline that is followed
by a non-space character: GPT-2's pre-tokenizer splits there anyway, so tokenizing piece by
piece gives the same ids as tokenizing the whole document.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from gptrain.data.hf_import import is_hf_saved, load_saved
from gptrain.errors import UserError, refuse_credentials
from gptrain.locations import is_url

TEXT_EXTS = (".txt", ".md")
RECORD_EXTS = (".jsonl", ".json", ".parquet")
PIECE_CHARS = 1 << 20


@dataclass
class Source:
    kind: str          # "file" (local path or URL) or "hf"
    location: str
    split: str | None = None  # "train"/"val" when the source has its own split
    size: int = 0


@dataclass
class ReadStats:
    replaced_chars: int = 0  # invalid UTF-8 sequences replaced by U+FFFD
    files: list = field(default_factory=list)


def expand(sources: list[str], hf_config: str | None) -> list[Source]:
    """Turn what the user typed into a list of concrete sources, or a clear error."""
    out: list[Source] = []
    for s in sources:
        if s.startswith("hf:"):  # explicitly a Hugging Face dataset: a hub name or a local dataset dir
            refuse_credentials(s[3:], "source", names_only=True)  # a hub name never holds user@ or a query
            out.append(Source("hf", s[3:]))
            continue
        if is_url(s):
            refuse_credentials(s, "source")
            out.append(Source("file", s))
            continue
        p = Path(s).expanduser()
        if p.is_dir() and is_hf_saved(p):  # save_to_disk output: its .json files are metadata
            out.append(Source("hf", str(p)))
            continue
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in TEXT_EXTS + RECORD_EXTS
                           and not any(part.startswith(".") for part in f.relative_to(p).parts))  # hidden: not text
            if not files:
                raise UserError(f"folder {s} holds no .txt/.md/.jsonl/.json/.parquet files")
            out += [Source("file", str(f), size=f.stat().st_size) for f in files]
        elif p.is_file():
            out.append(Source("file", str(p), size=p.stat().st_size))
        elif any(c in s for c in "*?["):
            files = sorted(f for f in glob.glob(os.path.expanduser(s), recursive=True) if os.path.isfile(f))
            if not files:
                raise UserError(f"pattern {s} matches no files")
            out += [Source("file", f, size=os.path.getsize(f)) for f in files]
        elif os.path.lexists(p):  # (a pipe read as a Hub name retried for 25 s)
            raise UserError(f"source {s} is not a file or a folder (a pipe, a device or a dangling link): "
                            "give a text file, a folder of them, a URL or a Hugging Face dataset name")
        elif s.startswith(("/", ".", "~")) or Path(s).suffix.lower() in TEXT_EXTS + RECORD_EXTS or (
                "/" in s and Path(s.split("/")[0]).is_dir()):  # (a folder here: a path with a typo, not org/name)
            raise UserError(f"source {s} does not exist; give an existing file, folder, glob, URL "
                            "or a Hugging Face dataset name")
        else:
            out.append(Source("hf", s))
    for src in out:
        if src.kind == "file":
            check_file_kind(src.location)
    if any(src.kind == "hf" for src in out) and len(out) > 1:
        raise UserError("a Hugging Face dataset must be the only source of a prepare call")
    return out


def check_file_kind(location: str) -> None:
    """A text or record file gptrain reads (by its suffix), else one line saying which are."""
    if not location.lower().endswith(TEXT_EXTS + RECORD_EXTS):
        raise UserError(f"cannot read {location}: supported files are .txt .md .jsonl .json .parquet")


def _open_binary(location: str):
    if is_url(location):
        import fsspec

        from gptrain.data.remote_read import failure, timeouts

        try:
            return _Remote(fsspec.open(location, "rb", **timeouts(location)).open(), location)
        except ImportError as e:
            raise UserError(f"reading {location.split('://')[0]}:// URLs needs more packages "
                            f"(pip install 'gptrain[remote]'): {e}") from None
        except Exception as e:  # fsspec backends raise many types
            raise UserError(f"cannot open {location}: {failure(e)}") from None
    try:
        return open(location, "rb")
    except OSError as e:
        raise UserError(f"cannot read {location}: {e.strerror}") from None


class _Remote:
    """A URL's open stream whose reads fail in one line: a server that sent its headers and went
    silent mid-body is fsspec's FSTimeoutError after the fetch timeout (remote_read.timeouts),
    said as "no answer within N s", not a traceback. Anything else is the stream's own."""

    def __init__(self, stream, location: str):
        self.stream, self.location = stream, location

    def read(self, *size):
        from gptrain.data.remote_read import failure
        from gptrain.errors import redact

        try:
            return self.stream.read(*size)
        except Exception as e:  # (fsspec's and aiohttp's many types)
            raise UserError(f"cannot read {redact(self.location)}: {failure(e)}") from None

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stream.close()


def _pieces(stream, location: str, stats: ReadStats):
    """Decode a byte stream to text pieces of ~PIECE_CHARS, replacing (and counting) bad UTF-8."""
    head = stream.read(8192)
    if b"\0" in head:
        raise UserError(f"{location} looks like a binary file (it contains NUL bytes); "
                        "give text files")

    def count(err):
        stats.replaced_chars += 1
        return "\ufffd", err.end

    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="gptrain-count")  # (a leading BOM is no text)
    codecs.register_error("gptrain-count", count)
    carry = decoder.decode(head)
    while True:
        block = stream.read(PIECE_CHARS)
        carry += decoder.decode(block, final=not block)
        while len(carry) > PIECE_CHARS:
            cut = _safe_cut(carry, PIECE_CHARS)
            if cut <= 0:  # a line longer than a piece: cut at the first safe point after it
                cut = _next_safe_cut(carry, PIECE_CHARS)
            if cut <= 0:
                break
            yield carry[:cut]
            carry = carry[cut:]
        if not block:
            break
    if carry:
        yield carry


def _safe_cut(text: str, near: int) -> int:
    """An index <= near just after '\\n' with a non-space character next, or -1."""
    i = text.rfind("\n", 0, near)
    while i > 0 and text[i + 1].isspace():
        i = text.rfind("\n", 0, i)
    return i + 1 if i > 0 else -1


def _next_safe_cut(text: str, start: int) -> int:
    """The first index >= start just after '\\n' with a non-space character next, or -1."""
    i = text.find("\n", start)
    while i != -1 and (i + 1 == len(text) or text[i + 1].isspace()):
        i = text.find("\n", i + 1)
    return i + 1 if i != -1 else -1


def _records(stream, location: str, text_field: str, stats: ReadStats):
    """Texts of the records in a .jsonl/.json/.parquet file."""
    low = location.lower()
    if low.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise UserError("reading .parquet needs pyarrow: pip install 'gptrain[hf]'") from None
        pf = pq.ParquetFile(stream)
        if text_field not in pf.schema_arrow.names:
            raise UserError(f"{location} has no column {text_field!r} (columns: "
                            f"{', '.join(pf.schema_arrow.names)}); name the column that holds the text: "
                            "--data.text_field=NAME to the trainer, --text-field NAME to `gptrain data prepare`")
        for batch in pf.iter_batches(columns=[text_field], batch_size=1024):
            yield from (t for t in batch.column(0).to_pylist() if t)
        return
    if low.endswith(".json"):
        try:
            data = json.loads("".join(_pieces(stream, location, stats)))
        except (json.JSONDecodeError, RecursionError) as e:  # (RecursionError: nested too deep)
            raise UserError(f"{location} is not valid JSON: {e}") from None
        rows = data if isinstance(data, list) else [data]
        yield from (_field(r, text_field, location, i + 1) for i, r in enumerate(rows))
        return
    for lineno, line in enumerate(_lines(_pieces(stream, location, stats)), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError) as e:  # (RecursionError: nested too deep)
                raise UserError(f"{location} line {lineno} is not valid JSON: {e}") from None
            yield _field(row, text_field, location, lineno)


def _lines(pieces):
    """Lines of a stream of text pieces (JSONL is read line by line, never whole)."""
    carry = ""
    for piece in pieces:
        carry += piece
        lines = carry.split("\n")
        carry = lines.pop()
        yield from lines
    if carry:
        yield carry


def _field(row, text_field: str, location: str, where: int) -> str:
    if isinstance(row, str):
        return row
    if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
        fields = f" (its fields: {', '.join(map(str, list(row)[:8]))})" if isinstance(row, dict) and row else ""
        raise UserError(f"{location} record {where} has no string field {text_field!r}{fields}; name the "
                        "field that holds the text: --data.text_field=NAME to the trainer (--dataset_text_field), "
                        "--text-field NAME to `gptrain data prepare`")
    return row[text_field]


def documents(src: Source, text_field: str, stats: ReadStats):
    """Yield each document of a file source as an iterator of text pieces."""
    with _open_binary(src.location) as stream:
        if src.location.lower().endswith(TEXT_EXTS):
            yield _pieces(stream, src.location, stats)
        else:
            for text in _records(stream, src.location, text_field, stats):
                yield iter([text])


def hf_splits(name: str, hf_config: str | None, text_field: str):
    """{'train': iterator of texts, 'val': ...} from a Hugging Face dataset's own splits."""
    try:
        import datasets
    except ImportError:
        raise UserError(f"{name!r} is not a local path, and Hugging Face datasets need: "
                        "pip install 'gptrain[hf]'") from None
    try:
        if is_hf_saved(Path(name).expanduser()):
            ds = load_saved(Path(name).expanduser())
            ds = ds if isinstance(ds, datasets.DatasetDict) else {"train": ds}
        else:  # streamed: read as it downloads, never held whole in memory or on disk first
            ds = datasets.load_dataset(name, hf_config, streaming=True)
    except UserError:
        raise
    except Exception as e:  # offline, unknown name, missing config: the hub raises many types
        raise UserError(f"cannot load Hugging Face dataset {name!r}"
                        f"{' (' + hf_config + ')' if hf_config else ''}: {str(e).splitlines()[0][:200]}"
                        " — check the name and --hf-config, or prepare local files") from None
    val_name = next((s for s in ("validation", "valid", "val", "test") if s in ds), None)
    if "train" not in ds:
        raise UserError(f"dataset {name!r} has no train split (splits: {', '.join(ds)})")
    columns = ds["train"].column_names or []  # a stream whose files do not say is checked as it is read
    if columns and text_field not in columns and "input_ids" in columns:
        raise UserError(f"dataset {name!r} is already tokenized (input_ids): push it as it is, or "
                        "`gptrain data import` it into token files")
    if columns and text_field not in columns:
        raise UserError(f"dataset {name!r} has no column {text_field!r} (columns: "
                        f"{', '.join(columns)}); pass --text-field")

    def texts(split):
        for batch in ds[split].iter(batch_size=1000):
            if text_field not in batch:
                raise UserError(f"dataset {name!r} has no column {text_field!r} (columns: "
                                f"{', '.join(batch)}); pass --text-field")
            yield from batch[text_field]

    return {"train": texts("train"), **({"val": texts(val_name)} if val_name else {})}


def version_stamp(src: str) -> tuple[str, int | None]:
    """(what identifies a version of a file, folder or URL: its size and modification stamp, its size)."""
    if not is_url(src):
        p = Path(src)
        stats = [f.stat() for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p.stat()]
        size, stamp = sum(st.st_size for st in stats), max((st.st_mtime_ns for st in stats), default=0)
        return f"{p.resolve()}:{size}:{stamp}", size
    import fsspec

    from gptrain.data.remote_read import timeouts

    try:
        fs, path = fsspec.core.url_to_fs(src, **timeouts(src))
        info = fs.info(path)
    except (ImportError, ValueError, OSError) as e:
        from gptrain.data.remote_read import failure

        raise UserError(f"cannot read {src}: {failure(e)}") from None
    version = [info.get(k) for k in ("size", "ETag", "LastModified", "mtime", "last-modified")]
    return f"{src}:{version}", info.get("size")
