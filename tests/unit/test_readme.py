"""README.md is a front page read in five minutes (#49 row 6: it was 358 lines and contradicted
itself): under 130 lines, and nothing on it names what the code does not have: each `gptrain ...`
line's options are options of that command (a trainer flag after `--` one the trainer takes),
each page it names exists. Each check is shown failing on a planted mistake."""

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def commands(text: str) -> list[list[str]]:
    """Every `gptrain ...` the page shows: the lines of its code blocks and its `inline` spans."""
    spans = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [ln.split("#", 1)[0] for block in spans for ln in block.splitlines()]
    lines += re.findall(r"`(gptrain [^`]+)`", text)
    out = []
    for line in lines:
        line = line.strip().replace("\\|", "|")
        if line.startswith("gptrain "):
            try:
                out.append(shlex.split(line))
            except ValueError:
                out.append(line.split())
    return out


def unknown_options(words: list[str]) -> list[str]:
    """The options of one `gptrain ...` line its command does not take."""
    import argparse

    from gptrain.cli import build_parser
    from gptrain.config_options import _option_name, _unknown

    parser, i = build_parser(), 1
    while i < len(words):
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or words[i].split("|")[0] not in sub.choices:
            break
        parser, i = sub.choices[words[i].split("|")[0]], i + 1
    known = {s for a in parser._actions for s in a.option_strings}
    bad, trainer = [], parser.prog.endswith(" train")
    for w in words[i:]:
        if w == "--":
            trainer = True
            continue
        if not w.startswith("--") or w in ("--...",):
            continue
        name = w.split("=", 1)[0]
        if name == "--help":  # (every command's; `gptrain train` answers it itself)
            continue
        if trainer and not _unknown(_option_name(name[2:])):
            continue
        if name not in known:
            bad.append(f"{' '.join(words[:i])}: {name}")
    return bad


def missing_pages(text: str) -> list[str]:
    return sorted({p for p in re.findall(r"\b((?:docs|configs|bench|tests|scripts)/[\w./-]+\.(?:md|toml|py|sh))", text)
                   if not (ROOT / p).exists()})


def test_the_front_page_is_short():
    assert len(README.read_text().splitlines()) <= 130


def test_every_option_and_page_the_front_page_names_exists():
    text = README.read_text()
    assert len(commands(text)) >= 15
    assert [b for words in commands(text) for b in unknown_options(words)] == []
    assert missing_pages(text) == []


def test_a_planted_mistake_is_found():
    planted = "```bash\ngptrain run x --nodez 2 -- --train.max_stepz=3\ngptrain checkpoint fetch ID --formatt hf\n```\n" \
              "see docs/nowhere.md"
    found = [b for words in commands(planted) for b in unknown_options(words)]
    assert found == ["gptrain run: --nodez", "gptrain run: --train.max_stepz", "gptrain checkpoint fetch: --formatt"]
    assert missing_pages(planted) == ["docs/nowhere.md"]
