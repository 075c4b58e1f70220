"""The medium rows of #47's fourth attacker round (a9c9e11, 738 probes: 689 held, 15 medium and
34 low broken), each as it was tried, each failing before its fix: a server that accepts and
never answers, a stop while a run is still starting, numbers past any sense, a forged LoRA rank,
weights that are all NaN, destinations that are links, a dataset whose folder was removed."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from gptrain.errors import UserError
from tests.conftest import run_cli
from tests.helpers import make_dataset, step_dir


def one_line(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr[-2000:])
    for w in words:
        assert w in lines[0], (w, lines[0])


def _server(answer=None):
    """A server that accepts every connection and, after `answer(conn)` (nothing by default),
    never sends another byte: (its URL, close)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    held = []

    def serve():
        while True:
            try:
                conn = s.accept()[0]
            except OSError:
                return
            held.append(conn)
            try:
                if answer:
                    answer(conn)
            except OSError:
                pass
    threading.Thread(target=serve, daemon=True).start()

    def close():
        s.close()
        for c in held:
            c.close()
    return f"http://127.0.0.1:{s.getsockname()[1]}", close


@pytest.fixture
def silent_server():
    """A server that accepts every connection and never sends a byte: its URL."""
    url, close = _server()
    yield url
    close()


@pytest.fixture
def stalling_server():
    """A server that sends its headers and the body's first bytes, then nothing more: its URL."""
    def headers_then_silence(conn):
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000000\r\n\r\n"
                     + b"the start of a corpus\n" * 4)
    url, close = _server(headers_then_silence)
    yield url
    close()


def test_a_text_url_that_goes_silent_mid_body_is_one_line(stalling_server, tiny_run, tmp_path):
    """#47 round 6 R.2/R.4/R.6 (medium): a server that sent its headers then went silent was
    fsspec's FSTimeoutError traceback in data prepare, eval and a run's text --data.path."""
    url = f"{stalling_server}/corpus.txt"
    one_line(run_cli("data", "prepare", url, "--out", str(tmp_path / "out"), "--tokenizer", "byte",
                     "--fetch-timeout", "1"), "no answer within 1 s")
    assert not (tmp_path / "out").exists()
    for r in (run_cli("eval", str(tiny_run), "--dataset", url, "--fetch-timeout", "1"),
              run_cli("train", f"--data.path={url}", "--data.fetch_timeout=1", "--data.tokenizer=byte",
                      "--train.max_steps=1", f"--train.output_dir={tmp_path / 'run'}")):
        said = r.stderr.strip().splitlines()  # (after the line saying what it tokenizes)
        assert r.returncode == 2 and "Traceback" not in r.stderr and "no answer within 1 s" in said[-1], r.stderr


def test_a_text_url_that_never_answers_is_one_line_after_the_timeout(silent_server, tmp_path, monkeypatch):
    """9.1, 9.3, 9.4: data prepare, train and eval of a text URL waited forever (420 s and on)."""
    from gptrain.data import remote_read
    from gptrain.data.prepare import prepare

    monkeypatch.setattr(remote_read, "DEFAULT_FETCH_TIMEOUT_S", 1.0)
    start = time.time()
    with pytest.raises(UserError, match="no answer within 1 s"):
        prepare([f"{silent_server}/corpus.txt"], str(tmp_path / "out"), tokenizer="byte", quiet=True)
    assert time.time() - start < 30 and not (tmp_path / "out").exists()
    # a run's text --data.path waits its own data.fetch_timeout (round 5: it waited the default)
    from gptrain.train.model_init import resolve_data

    monkeypatch.setattr(remote_read, "DEFAULT_FETCH_TIMEOUT_S", 600.0)
    start = time.time()
    with pytest.raises(UserError, match="no answer within 1 s"):
        resolve_data(f"{silent_server}/corpus.txt", tokenizer="byte", fetch_timeout=1.0)
    assert time.time() - start < 30


def test_data_prepare_and_eval_wait_the_fetch_timeout_the_user_gives(silent_server, tiny_run, tmp_path):
    """Round 5's 9.3 and 9.4: data prepare and eval of a silent URL had no timeout of their own to
    give (they waited the 60 s default, twice, before saying so)."""
    start = time.time()
    r = run_cli("data", "prepare", f"{silent_server}/corpus.txt", "--out", str(tmp_path / "out"),
                "--tokenizer", "byte", "--fetch-timeout", "1")
    one_line(r, "no answer within 1 s")
    assert not (tmp_path / "out").exists()
    from gptrain.jobs.api import evaluate

    with pytest.raises(UserError, match="no answer within 1 s"):
        evaluate(str(tiny_run), f"{silent_server}/corpus.txt", fetch_timeout=1.0)
    assert time.time() - start < 60
    for bad in ("0", "-1", "nan", "4000"):
        one_line(run_cli("eval", str(tiny_run), "--dataset", "x", "--fetch-timeout", bad), "--fetch-timeout must be")
    one_line(run_cli("data", "prepare", "x.txt", "--out", str(tmp_path / "o2"), "--fetch-timeout", "inf"),
             "--fetch-timeout must be")
    assert not (tmp_path / "o2").exists()


@pytest.mark.parametrize("where", ["config", "deepspeed"])
def test_a_stop_while_a_run_is_still_starting_ends_it_at_once(tmp_path, where):
    """9.7, 9.14: `gptrain train FIFO` (or --deepspeed_config FIFO) blocked reading it; SIGTERM
    only said it would save a checkpoint, and SIGKILL was needed. Before the first step there is
    nothing of the run to save: the stop ends it, 143."""
    fifo = tmp_path / "settings.toml"
    os.mkfifo(fifo)
    args = [str(fifo)] if where == "config" else [f"--deepspeed_config={fifo}"]
    proc = subprocess.Popen([sys.executable, "-m", "gptrain", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # (past `gptrain train`'s imports: blocked in open() of the pipe)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 143 and "SIGTERM before the first step: nothing of this run to save" in err, err


def test_numbers_past_any_sense_are_one_line(tmp_path):
    """3.91: --train.epochs=1e30 was an OverflowError at the first log line; 3.162: a 60,000-deep
    --lr_scheduler_kwargs a RecursionError; 4.34: eval --batch-size 0 a range() traceback."""
    from gptrain.config_options import parse_train_args

    with pytest.raises(UserError, match="epochs"):
        parse_train_args(["--train.epochs=1e30"])
    deep = '{"num_cycles": ' + "[" * 60000 + "]" * 60000 + "}"
    with pytest.raises(UserError, match="nests deeper"):
        parse_train_args(["--lr_scheduler_type", "cosine", "--lr_scheduler_kwargs", deep])
    one_line(run_cli("eval", "hf:none/none", "--dataset", str(tmp_path), "--batch-size", "0"), "--batch-size")
    one_line(run_cli("eval", "hf:none/none", "--dataset", str(tmp_path), "--max-blocks", "-1"), "--max-blocks")


def test_a_forged_lora_rank_and_nan_weights_are_one_line(tiny_run, tiny_hf_gpt2, tmp_path):
    """1.210: a resealed trainer_state.json with lora_r=10**9 tried a 128 GB allocation, then a
    traceback (the memory check left LoRA out); 1.410: an HF folder whose weights are all NaN made
    generate a torch.multinomial traceback."""
    from safetensors.torch import load_file, save_file

    from gptrain.weights import checksums

    ckpt = tmp_path / "forged"
    shutil.copytree(step_dir(tiny_run, 2), ckpt)
    state = json.loads((ckpt / "trainer_state.json").read_text())
    state["model_config"]["lora_r"] = 10 ** 9
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    checksums.seal_folder(ckpt)
    one_line(run_cli("generate", str(ckpt), "--prompt", "a", "--max-new-tokens", "2"), "trainer_state.json", "LoRA")
    nan = tmp_path / "nan"
    shutil.copytree(tiny_hf_gpt2, nan)
    tensors = {k: v.float().fill_(float("nan")) for k, v in load_file(nan / "model.safetensors").items()}
    save_file(tensors, nan / "model.safetensors", metadata={"format": "pt"})
    for temperature in ("0", "1"):
        one_line(run_cli("generate", str(nan), "--prompt", "ab", "--max-new-tokens", "2", "--tokenizer", "byte",
                         "--temperature", temperature), "not finite numbers")


def test_a_destination_that_is_a_link_is_one_line_and_nothing_is_written(tiny_run, isolated_home, tmp_path):
    """2.06, 2.11, 2.13, 5.71: a dangling link or a link to an empty folder as checkpoint fetch's
    --destination or export's --out was a NotADirectoryError traceback; as data prepare's --out,
    a traceback after the tokenizing, whose work was then deleted."""
    from tests.browser.recorded_jobs import record_job

    d = record_job("j")
    from gptrain.jobs.folder import checkpoints_dir

    shutil.copytree(step_dir(tiny_run, 2), checkpoints_dir(d) / step_dir(tiny_run, 2).name)
    ckpt = json.loads(run_cli("checkpoints", "j", "--json").stdout)[0]["id"]
    empty = tmp_path / "empty"
    empty.mkdir()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text " * 100)
    for i, target in enumerate((tmp_path / "nowhere", empty)):
        link = tmp_path / f"link{i}"
        link.symlink_to(target)
        for args, flag in ((["checkpoint", "fetch", ckpt, "--destination", str(link)], "--destination"),
                           (["export", str(tiny_run), "--out", str(link)], "--out"),
                           (["data", "prepare", str(corpus), "--out", str(link), "--tokenizer", "byte"], "--out")):
            one_line(run_cli(*args), "is a link", flag)
        assert link.is_symlink() and not list(empty.iterdir()) and not (tmp_path / "nowhere").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no copy left beside them


def test_a_dataset_whose_folder_was_removed_can_be_removed(tmp_path, isolated_home):
    """5.77: `rm -rf $GPTRAIN_HOME/datasets/d5`, then `data rm d5` said to run `data rm d5`; the
    name stayed taken for good."""
    assert run_cli("data", "push", "d5", make_dataset(tmp_path)).returncode == 0
    shutil.rmtree(isolated_home / "datasets" / "d5")
    one_line(run_cli("data", "inspect", "d5"), "its files", "are gone")
    r = run_cli("data", "rm", "d5")
    assert r.returncode == 0, r.stderr
    assert run_cli("data", "push", "d5", make_dataset(tmp_path)).returncode == 0
