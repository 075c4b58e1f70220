"""Hostile and corrupt checkpoints: nothing in one runs as code, and every command that reads one
answers a corrupt or hostile file with one line naming it and exit 2.

The hostile .metadata is written with raw pickle opcodes: protocol 4's STACK_GLOBAL resolves a
dotted name, so ('torch.distributed.checkpoint.filesystem', 'os.system') is os.system reached
through a module of DCP's own (which an allowlist of whole modules let through).
"""

import json
import shutil
import struct

import pytest

from gptrain import run_layout
from tests.conftest import run_cli
from tests.helpers import TINY, step_dir


def _short(s: str) -> bytes:
    b = s.encode()
    return (b"\x8c" + bytes([len(b)]) + b) if len(b) < 256 else (b"X" + struct.pack("<I", len(b)) + b)


def evil_metadata(marker) -> bytes:
    """PROTO 4; STACK_GLOBAL(DCP module, 'os.system'); ('touch MARKER',); REDUCE; STOP."""
    return (b"\x80\x04" + _short("torch.distributed.checkpoint.filesystem") + _short("os.system") +
            b"\x93" + _short(f"touch {marker}") + b"\x85" + b"R" + b".")


def _copy(ckpt, dest, sealed=False):
    """A copy of a checkpoint; crafted (`sealed` False) as an attacker's would be, without the
    checksums.json that gptrain writes (a crafted file would fail it: tests/reliability/
    test_verified_checkpoints.py), so what is tested here is the reader's own refusal."""
    shutil.copytree(ckpt, dest)
    if not sealed:  # nor the mark in its trainer_state.json that says it was sealed with one
        (dest / "checksums.json").unlink(missing_ok=True)
        state = dest / "trainer_state.json"
        if state.is_file():
            doc = json.loads(state.read_text())
            doc.pop("checksums", None)
            state.write_text(json.dumps(doc))
    return dest


@pytest.fixture
def evil(data, tiny_run, tmp_path):
    """(dataset, a checkpoint whose .metadata would create `marker`, marker path)."""
    ckpt = step_dir(tiny_run, 2)
    marker = tmp_path / "pwned"
    bad = _copy(ckpt, step_dir(tmp_path / "evil", 2))
    (bad / ".metadata").write_bytes(evil_metadata(marker))
    return data, bad, marker


@pytest.fixture(autouse=True)
def allowed_unverified(monkeypatch):
    """A crafted checkpoint has no checksums.json, which alone refuses it (#47: checksums.admit,
    tests/reliability/test_unverified_checkpoints.py); here it is let through as --allow-unverified
    does, so what is tested is each reader's own refusal behind that."""
    from gptrain.weights import checksums

    monkeypatch.setenv(checksums.ALLOW_ENV, "1")


def _refused(r, marker, *needles):
    assert not marker.exists(), "the checkpoint ran code"
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
    lines = [line for line in r.stderr.strip().splitlines() if "loaded WITHOUT verifying" not in line]
    assert len(lines) == 1 and lines[0].startswith("gptrain: error:"), r.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def _train_args(data, out, *extra):
    return ["train", f"--data.path={data}", f"--train.output_dir={out}", "--train.batch_size=2",
            "--train.max_steps=3", "--train.do_eval=false", *TINY, *extra]


ENTRY_POINTS = {
    "generate": lambda data, ck, tmp: ["generate", ck, "--prompt", "the", "--max-new-tokens", "2"],
    "export": lambda data, ck, tmp: ["export", ck, "--out", tmp / "exported"],
    "eval": lambda data, ck, tmp: ["eval", ck, "--dataset", data],
    "auto-resume": lambda data, ck, tmp: _train_args(data, ck.parent.parent),
    "resume_from_checkpoint": lambda data, ck, tmp: _train_args(data, tmp / "new-run",
                                                                f"--resume_from_checkpoint={ck}"),
    "init_from": lambda data, ck, tmp: _train_args(data, tmp / "new-run", f"--model.init_from={ck}"),
}


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_code_in_checkpoint_metadata_never_runs(evil, tmp_path, entry):
    data, bad, marker = evil
    r = run_cli(*ENTRY_POINTS[entry](data, bad, tmp_path))
    _refused(r, marker, str(bad / ".metadata"), "os.system")
    assert not (tmp_path / "exported").exists() and not run_layout.checkpoints_dir(tmp_path / "new-run").exists()


def test_code_in_checkpoint_metadata_never_runs_by_job_name_id_or_fetch(evil, tmp_path):
    """A checkpoint listed under a job: generate JOB, generate ID, checkpoint fetch --format hf."""
    from gptrain.home import home
    from gptrain.jobs import found, store

    data, bad, marker = evil
    store.create_job("evil", {}, 1, 1, "local")
    _copy(bad, step_dir(home() / "jobs" / "evil", 2))
    store.sync_checkpoints("evil", found.scan_job("evil"))
    (ckpt_id,) = [c["id"] for c in store.checkpoints("evil")]
    for args in (["generate", "evil", "--prompt", "the"], ["generate", ckpt_id, "--prompt", "the"],
                 ["checkpoint", "fetch", ckpt_id, "--format", "hf", "--destination", tmp_path / "hf"]):
        _refused(run_cli(*args), marker, ".metadata")
    assert not (tmp_path / "hf").exists()


def test_metadata_rewriting_a_metadata_class_is_refused(tiny_run, tmp_path):
    """BUILD with a slot state on an allowed class itself would set that class's attributes in
    the reading process (here Metadata.planted = 1)."""
    ckpt = step_dir(tiny_run, 2)
    bad = _copy(ckpt, tmp_path / "build" / ckpt.name)
    (bad / ".metadata").write_bytes(
        b"\x80\x04" + _short("torch.distributed.checkpoint.metadata") + _short("Metadata") + b"\x93" +
        b"N}" + _short("planted") + b"K\x01s" + b"\x86b.")  # (None, {'planted': 1}) BUILD
    _refused(run_cli("generate", bad, "--prompt", "the"), tmp_path / "none", "sets the state")


def test_metadata_naming_bytes_entries_is_refused(tiny_run, tmp_path):
    """DCP reads a BytesStorageMetadata entry with torch.load(weights_only=False): a .metadata
    that declares one, pointing at a pickle in a .distcp file, must be refused before that."""
    import io
    import pickle

    import torch
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    from gptrain.weights.dcp import _MetadataUnpickler

    ckpt = step_dir(tiny_run, 2)
    bad = _copy(ckpt, tmp_path / "bytes" / ckpt.name)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            import os
            return os.system, (f"touch {marker}",)

    buf = io.BytesIO()
    torch.save(Payload(), buf)
    (bad / "evil.distcp").write_bytes(buf.getvalue())
    meta = pickle.Unpickler(io.BytesIO((ckpt / ".metadata").read_bytes())).load()
    for fqn in list(meta.state_dict_metadata):
        if fqn.startswith("model."):
            meta.state_dict_metadata[fqn] = BytesStorageMetadata()
            for idx in [i for i in meta.storage_data if i.fqn == fqn]:
                del meta.storage_data[idx]
            meta.storage_data[MetadataIndex(fqn)] = _StorageInfo("evil.distcp", 0, len(buf.getvalue()))
    (bad / ".metadata").write_bytes(pickle.dumps(meta, protocol=4))
    _refused(run_cli("generate", bad, "--prompt", "the"), marker, "BytesStorageMetadata")
    with pytest.raises(pickle.UnpicklingError):  # the allowlist itself, without the CLI
        _MetadataUnpickler(io.BytesIO((bad / ".metadata").read_bytes())).load()


@pytest.mark.parametrize("name", ["../../outside.distcp", "/etc/passwd"])
def test_metadata_naming_files_outside_the_checkpoint_is_refused(tiny_run, tmp_path, name):
    import io
    import pickle

    from torch.distributed.checkpoint.filesystem import _StorageInfo

    ckpt = step_dir(tiny_run, 2)
    bad = _copy(ckpt, tmp_path / "outside" / ckpt.name)
    meta = pickle.Unpickler(io.BytesIO((ckpt / ".metadata").read_bytes())).load()
    for idx, info in meta.storage_data.items():
        meta.storage_data[idx] = _StorageInfo(name, info.offset, info.length)
    (bad / ".metadata").write_bytes(pickle.dumps(meta, protocol=4))
    _refused(run_cli("generate", bad, "--prompt", "the"), tmp_path / "none", "not a plain file name")


def test_the_allowlist_reads_the_metadata_dcp_writes(tiny_run):
    """The exact list is enough for a real checkpoint (all layouts write the same globals: see
    train/checkpoint.py), and a checkpoint still generates."""
    ckpt = step_dir(tiny_run, 2)
    r = run_cli("generate", ckpt, "--prompt", "the", "--max-new-tokens", "3", "--seed", "0")
    assert r.returncode == 0, r.stderr[-2000:]


# ---- corrupt files: one line naming the file, exit 2 -------------------------------------------

def _corrupt(path, how):
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"\x00garbage\xff" * 50,
                      "scrambled": bytes((b * 7 + 13) % 256 for b in data),
                      "empty": b"", "not-an-object": b"[1, 2]", "no-fields": b"{}"}[how])


DAMAGE = [(".metadata", "truncated"), (".metadata", "garbage"), (".metadata", "empty"),
          ("__0_0.distcp", "truncated"), ("__0_0.distcp", "scrambled"), ("trainer_state.json", "garbage"),
          ("trainer_state.json", "not-an-object"), ("trainer_state.json", "no-fields")]
# Every damage without checksums (each reader's own refusal); with them, verification refuses
# before any reader runs, the same path for every damage: one per file.
CASES = [(*d, False) for d in DAMAGE] + [(f, h, True) for f, h in DAMAGE if h in ("garbage", "scrambled")]


@pytest.mark.parametrize("file, how, sealed", CASES,
                         ids=[f"{f}-{h}-{'with-checksums' if s else 'without'}" for f, h, s in CASES])
def test_corrupt_checkpoint_file_is_one_line_naming_it(data, tiny_run, tmp_path, file, how, sealed):
    """With its checksums.json the damage is named by verification (checkpoint and file); a
    checkpoint without one (older, or from elsewhere) is refused by the readers themselves."""
    ckpt = step_dir(tiny_run, 2)
    bad = _copy(ckpt, tmp_path / "bad" / ckpt.name, sealed)
    _corrupt(bad / file, how)
    named = [str(bad), "fails verification", file] if sealed or (file, how) == ("__0_0.distcp", "truncated") \
        else [str(bad) if how == "scrambled" else str(bad / file)]  # DCP does not say which tensor file failed
    for args in (["generate", bad, "--prompt", "the"],
                 _train_args(data, tmp_path / "new-run", f"--model.init_from={bad}")):
        _refused(run_cli(*args), tmp_path / "none", *named)


@pytest.fixture
def hf_copy(tiny_hf_gpt2, tmp_path):
    return _copy(tiny_hf_gpt2, tmp_path / "hf-model")


@pytest.mark.parametrize("file, how", [("model.safetensors", "garbage"), ("model.safetensors", "truncated"),
                                       ("config.json", "garbage"), ("config.json", "no-fields")])
def test_corrupt_hf_model_file_is_one_line_naming_it(data, tiny_run, hf_copy, tmp_path, file, how):
    _corrupt(hf_copy / file, how)
    gpt2_data = tmp_path / "unused"
    for args in (["generate", hf_copy, "--prompt", "the"], ["export", hf_copy, "--out", tmp_path / "x"],
                 _train_args(data, tmp_path / "new-run", f"--model.init_from={hf_copy}")):
        _refused(run_cli(*args), gpt2_data, str(hf_copy / file))
    assert not (tmp_path / "x").exists()


def test_pickled_code_in_pytorch_model_bin_never_runs(hf_copy, tmp_path):
    import pickle

    marker = tmp_path / "pwned"
    (hf_copy / "model.safetensors").unlink()
    (hf_copy / "pytorch_model.bin").write_bytes(  # a legacy (non-zip) torch.save file is a pickle
        b"\x80\x02" + b"cos\nsystem\n" + pickle.dumps(f"touch {marker}", 2)[2:-1] + b"\x85R.")
    _refused(run_cli("generate", hf_copy, "--prompt", "the"), marker, str(hf_copy / "pytorch_model.bin"))


def test_remote_latest_naming_a_path_outside_is_refused(data, tiny_run, tmp_path):
    """checkpoint.remote: REMOTE/latest is read from object storage; a name like ../../stash
    would be fetched and renamed to OUTPUT/checkpoints/../../stash, outside the output directory."""
    ckpt = step_dir(tiny_run, 2)
    bucket = tmp_path / "bucket" / "run"
    bucket.mkdir(parents=True)
    _copy(ckpt, tmp_path / "stash")  # REMOTE/../../stash
    (bucket / "latest").write_text("../../stash")
    out = tmp_path / "a" / "b" / "new-run"
    r = run_cli(*_train_args(data, out, f"--checkpoint.remote=file://{bucket}"))
    assert not (tmp_path / "a" / "b" / "stash").exists(), "a remote name reached outside the output"
    _refused(r, tmp_path / "none", "latest")


def test_a_refused_remote_checkpoint_is_not_kept_as_the_local_latest(evil, tmp_path):
    """A checkpoint fetched from checkpoint.remote whose .metadata is a crafted pickle is refused,
    and nothing of it stays in the output: it used to become OUTPUT/checkpoints/latest, so every
    later run refused again even without the remote (found by an attacker trial)."""
    data, bad, marker = evil
    bucket = tmp_path / "bucket"
    shutil.copytree(bad.parent, bucket)
    (bucket / "latest").write_text(bad.name)
    out = tmp_path / "run"
    _refused(run_cli(*_train_args(data, out, f"--checkpoint.remote=file://{bucket}")), marker,
             "was refused and not kept", "checkpoint metadata")
    root = run_layout.checkpoints_dir(out)
    assert not (root / "latest").exists() and not list(root.glob("*step-*"))
    r = run_cli(*_train_args(data, out))  # the same output without the remote trains from scratch
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.parametrize("forged, words", [({"n_layer": 4000, "n_embd": 65536, "n_head": 8}, "GiB for its weights"),
                                           ({"vocab_size": "x", "n_layer": -3}, "must be a whole number")])
def test_a_forged_shape_is_one_line_before_anything_is_built(tiny_run, hf_copy, tmp_path, forged, words):
    """A checkpoint whose trainer_state.json (resealed, as an attacker with the folder can) or an
    HF folder whose config.json names a shape no machine here holds, or not a shape at all: one
    line naming the file, never a 51 GB allocation or a TypeError traceback (#47 round 3)."""
    from gptrain.weights import checksums

    ckpt = _copy(step_dir(tiny_run, 2), tmp_path / "forged")
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state["model_config"].update(forged)
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    checksums.seal_folder(ckpt)
    hf = {"n_layer": "n_layer", "n_embd": "n_embd", "n_head": "n_head", "vocab_size": "vocab_size"}
    config = json.loads((hf_copy / "config.json").read_text())
    config.update({hf[k]: v for k, v in forged.items()})
    (hf_copy / "config.json").write_text(json.dumps(config))
    for model, file in ((ckpt, "trainer_state.json"), (hf_copy, "config.json")):
        r = run_cli("generate", str(model), "--prompt", "a", "--max-new-tokens", "2", "--tokenizer", "byte", timeout=300)
        lines = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (model, r.stderr[-2000:])
        assert file in lines[0] and (words in lines[0] or "not what gptrain expects" in lines[0]), lines[0]
