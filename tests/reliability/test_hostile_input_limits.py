"""The files a user names (`run -f job.yaml`, `--config my.toml`, `train my.toml`,
`--deepspeed_config ds.json`) read bounded (gptrain/files.py: read_user_text, parse_user_text):
a device or a huge file, bytes that are not UTF-8, nesting past Python's recursion limit and a
YAML alias bomb are each one line, exit 2, nothing recorded; before, tracebacks or an endless
read. Real CLI processes."""

import pytest

from tests.conftest import run_cli
from tests.job_helpers import nothing_recorded, refused
LIMIT_S = 60  # each command answers at once; before, /dev/zero was read until memory ran out


def _deep_yaml(depth: int) -> str:
    return "name: j\nconfig:\n  data: " + "{a: " * depth + "1" + "}" * depth + "\n"


def _alias_bomb() -> str:
    """9^12 items from 13 short lines: repr or str of `args` never ended (check_types names it)."""
    lines = ["name: j", "slurm:", "  a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"  a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)]
    return "\n".join(lines + ["args: [*a11]"]) + "\n"


JOB_FILES = {
    "not UTF-8": (b"name: j\xff\nargs: []\n", ["job file", "is not UTF-8 text (byte 0xff at offset 7)"]),
    "config: 10,000 deep": (_deep_yaml(10_000).encode(), ["job file", "nests deeper than Python can read"]),
    "config: 300 deep": (_deep_yaml(300).encode(), ["job file", "nests deeper than 32 levels"]),
    "args: 10,000 deep": (b"name: j\nargs: " + b"[" * 10_000 + b"]" * 10_000 + b"\n", ["nests deeper"]),
    "alias bomb": (_alias_bomb().encode(), ["holds more than 100000 items"]),
    "5 MiB": (b"name: j\n" + b"# padding\n" * 524_288, ["is larger than 4 MiB"]),
}


@pytest.mark.parametrize("case", JOB_FILES)
def test_a_hostile_job_file_is_one_line(case, tmp_path, isolated_home):
    content, words = JOB_FILES[case]
    (tmp_path / "job.yaml").write_bytes(content)
    r = run_cli("run", "-f", tmp_path / "job.yaml", timeout=LIMIT_S)
    refused(r, *words)
    nothing_recorded(isolated_home)


@pytest.mark.parametrize("args", [["run", "-f", "/dev/zero"], ["run", "j", "--config", "/dev/zero"],
                                  ["train", "/dev/zero"], ["train", "--deepspeed_config", "/dev/zero"],
                                  ["run", "j", "--requirements", "/dev/urandom", "--", "train.py"]],
                         ids=lambda a: " ".join(a))
def test_a_device_named_as_a_file_is_read_bounded(args, tmp_path, isolated_home):
    r = run_cli(*args, timeout=LIMIT_S, cwd=tmp_path)
    refused(r, "/dev/", "is larger than 4 MiB")
    nothing_recorded(isolated_home)


CONFIGS = {"not UTF-8": (b'[data]\npath = "\xff"\n', "is not UTF-8 text (byte 0xff at offset 15)"),
           "10,000 deep": (b"[data]\npath = " + b"[" * 10_000 + b"]" * 10_000 + b"\n", "nests deeper"),
           "40 deep": (b"[data]\npath = " + b"[" * 40 + b"]" * 40 + b"\n", "nests deeper than 32 levels")}


@pytest.mark.parametrize("case", CONFIGS)
@pytest.mark.parametrize("command", ["run", "train"])
def test_a_hostile_toml_config_is_one_line(case, command, tmp_path, isolated_home):
    content, words = CONFIGS[case]
    (tmp_path / "my.toml").write_bytes(content)
    args = ["run", "j", "--config", "my.toml", "--", "--train.max_steps=1"] if command == "run" else \
        ["train", "my.toml", f"--train.output_dir={tmp_path / 'out'}"]
    r = run_cli(*args, timeout=LIMIT_S, cwd=tmp_path)
    refused(r, "my.toml", words)
    nothing_recorded(isolated_home)
    assert not (tmp_path / "out").exists()


def test_a_deepspeed_config_nested_past_the_recursion_limit_is_one_line(tmp_path, isolated_home):
    (tmp_path / "ds.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    r = run_cli("train", "--deepspeed_config", tmp_path / "ds.json", timeout=LIMIT_S)
    refused(r, "DeepSpeed config", "nests deeper")
