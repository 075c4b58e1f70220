"""The console's data path without a server: downsampling, the incremental metrics.jsonl reader,
the loss sparkline of `gptrain inspect`."""

import json

import numpy as np

from gptrain import run_layout
from gptrain.ui.downsample import minmax
from gptrain.jobs.sparkline import loss_line, sparkline
from gptrain.ui.metrics import Chart as MetricsFile  # the library's reader, with curves
from tests.browser.recorded_jobs import write_metrics


def test_small_curves_are_left_whole_and_large_ones_keep_their_extremes():
    x = np.arange(100.0)
    assert minmax(x, x * 2, 4000)[0] is x
    rng = np.random.default_rng(0)
    y = rng.normal(size=1_000_000)
    y[123_457] = 50.0  # one spike among a million rows
    y[777_777] = -50.0
    xs, ys = minmax(np.arange(1_000_000.0), y, 4000)
    assert len(xs) <= 4002 and 50.0 in ys and -50.0 in ys
    assert xs[0] == 0 and xs[-1] == 999_999 and np.all(np.diff(xs) > 0)


def test_metrics_are_read_incrementally_whole_lines_only(tmp_path):
    path = run_layout.metrics_file(tmp_path)
    write_metrics(path, 20)
    mf = MetricsFile(path)
    assert mf.refresh() == 20 and mf.count("eval") == 2
    size = path.stat().st_size
    assert mf.offset == size
    with open(path, "a") as f:  # a row half written: not read yet
        f.write('{"step": 21, "time": 1021.0, "train/lo')
    assert mf.refresh() == 20 and mf.offset == size
    with open(path, "a") as f:
        f.write('ss": 1.5}\n')
    assert mf.refresh() == 21 and mf.last()["loss"] == 1.5
    assert mf.curve("loss", start=20) == {"x": [21.0], "y": [1.5], "total": 21}


def test_a_replaced_or_shrunk_file_is_read_again(tmp_path):
    path = run_layout.metrics_file(tmp_path)
    write_metrics(path, 50)
    mf = MetricsFile(path)
    assert mf.refresh() == 50
    path.unlink()
    write_metrics(path, 5)  # the job removed and submitted again under its name
    assert mf.refresh() == 5
    path.write_text(json.dumps({"step": 1, "time": 1.0, "train/loss": 2.0}) + "\nnot json\n")
    assert mf.refresh() == 1  # a foreign line is skipped


def test_curves_on_tokens_and_time(tmp_path):
    path = run_layout.metrics_file(tmp_path)
    write_metrics(path, 30)
    mf = MetricsFile(path)
    mf.refresh()
    assert mf.curve("loss", "tokens")["x"][:2] == [128.0, 256.0]
    assert mf.curve("eval_loss", "tokens")["x"] == [1280.0, 2560.0, 3840.0]
    assert mf.curve("loss", "time")["x"][:2] == [0.0, 1.0]
    big = mf.curve("loss", max_points=10)
    assert len(big["x"]) <= 12 and big["total"] == 30


def test_sparkline_of_a_falling_loss(tmp_path):
    assert sparkline([3, 2, 1]) == "█▅▁"
    assert sparkline([1, 1, 1]) == "▁▁▁" and sparkline([]) == ""
    path = run_layout.metrics_file(tmp_path)
    assert loss_line(path) is None and loss_line(None) is None
    write_metrics(path, 200)
    line = loss_line(path)
    assert line.startswith("█") and "▁" in line and line.endswith("-> 0.6121 (200 steps)")


def test_a_file_is_read_in_blocks_rows_across_their_edges(tmp_path, monkeypatch):
    from gptrain.jobs import metrics_file

    monkeypatch.setattr(metrics_file, "BLOCK", 300)  # a few rows a block; rows straddle the edges
    path = run_layout.metrics_file(tmp_path)
    write_metrics(path, 40)
    with open(path, "a") as f:
        f.write(json.dumps({"step": 41, "note": "x" * 1000}) + "\n")  # longer than a block
    write_metrics(path, 5, start=42)
    mf = MetricsFile(path)
    assert mf.refresh() == 45 and mf.count("eval") == 4 and mf.offset == path.stat().st_size
    assert mf.curve("loss", max_points=None)["x"] == [float(s) for s in (*range(1, 41), *range(42, 47))]


def test_a_log_read_from_inside_a_line_never_shows_part_of_a_secret(tmp_path):
    """The console's log API takes a byte offset from the client: one inside a secret used to
    return the secret's tail in clear (masking matches whole values)."""
    from gptrain.jobs.logs import rank_log, read_page as read_log

    log = rank_log(tmp_path, 0)
    log.write_bytes(b"step 1\nsecret is hunter2xyz\nstep 2\n")
    start = log.read_bytes().index(b"hunter2xyz")
    for offset in range(0, len(log.read_bytes()) + 1):
        text, end = read_log(log, offset, ["hunter2xyz"])
        assert "unter2" not in text and "2xyz" not in text and "xyz" not in text, (offset, text)
    text, end = read_log(log, start + 1, ["hunter2xyz"])
    assert text == "step 2\n" and end == len(log.read_bytes())
    assert read_log(log, 0, ["hunter2xyz"])[0] == "step 1\nsecret is ***\nstep 2\n"
