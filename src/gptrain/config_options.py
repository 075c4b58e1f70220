"""The trainer's command-line options onto the typed config (config.py): `[CONFIG.toml]
[--section.key=value | --section.key value | --hf_flag value]...`, the other tools' flag names
(config_aliases.py; HF's, FMEngine's and nanoGPT's taken, accepted or refused: hf_flags.py), and
the whole config checked before anything runs (config_check.py).

    cfg = parse_train_args(["configs/tiny-debug.toml", "--train.max_steps=20", "--do_eval"])
"""

from __future__ import annotations

import typing

from gptrain import hf_flags, nanogpt_config
from gptrain.config import BOOL_WORDS, Config, all_keys, base_type, field_info, load_toml, set_key
from gptrain.config_aliases import ALIASES, DEEPSPEED_FLAGS, DIALECTS, MEANT
from gptrain.config_check import check
from gptrain.errors import UserError, closest


def parse_train_args(argv: list[str], cfg: Config | None = None) -> Config:
    """Parse `[CONFIG.toml | NANOGPT_CONFIG.py] [--section.key=value | --section.key value | --hf_flag value]...`."""
    cfg = cfg or Config()
    args = list(argv)
    from_file = []
    if args and not args[0].startswith("-"):
        if nanogpt_config.is_nanogpt_config(args[0]):  # its keys apply as flags, before the ones after it
            from_file = [(name, value, [f"--{name}={value}"]) for name, value in nanogpt_config.read(args.pop(0))]
        else:
            load_toml(args.pop(0), cfg)
    default, set_by = Config(), {}
    options = from_file + list(split_options(args))
    _take_dialect(cfg, default, [(name, value) for name, value, _ in options])
    for name, value, _ in options:
        before = {key: _setting(cfg, key) for key in EXCLUSIVE}
        apply_option(cfg, name, value)
        if name not in DEEPSPEED_FLAGS:  # a config file, as a TOML: the flags after it override it
            _refuse_conflicts(name, before, cfg, default, set_by)
    given = {canonical_key(name) for name, _, _ in options}
    if cfg.train.dialect == "hf" and cfg.train.eval_strategy != "no":
        cfg.train.do_eval = True  # as TrainingArguments.__post_init__ does
    if cfg.train.dialect == "nanogpt" and "checkpoint.every" not in given and \
            cfg.checkpoint.every == default.checkpoint.every:
        cfg.checkpoint.every = cfg.train.eval_every  # nanoGPT saves at each evaluation
    return check(cfg)


def _take_dialect(cfg: Config, default: Config, options: list) -> None:
    """train.dialect from the flags (`--train.dialect`, else "hf" when an HF Trainer flag is
    given, "nanogpt" when a nanoGPT key is: config_aliases.DIALECTS), and its defaults for each
    setting a config file has not set (still gptrain's default); the flags are applied after,
    over them. Flags of both tools, with no --train.dialect, are one line: whose defaults fill
    the rest would be a guess."""
    named = [value for name, value in options if canonical_key(name) == "train.dialect"]
    if named:
        cfg.train.dialect = named[-1]
    else:
        marked = {dialect: next((name for name, _ in options if name in markers), None)
                  for dialect, (markers, _) in DIALECTS.items()}
        found = {dialect: name for dialect, name in marked.items() if name}
        if len(found) > 1:
            raise UserError(f"--{found['hf']} is the HF Trainer's flag and --{found['nanogpt']} nanoGPT's: say "
                            "whose defaults fill what the flags leave out with --train.dialect=hf, nanogpt or gptrain")
        if found:
            cfg.train.dialect = next(iter(found))
    if cfg.train.dialect not in DIALECTS:
        return
    for key, value in DIALECTS[cfg.train.dialect][1].items():
        if _setting(cfg, key) == _setting(default, key):
            section, field = key.split(".")
            setattr(getattr(cfg, section), field, value)


# Settings HF sets through separate flags that its parser refuses together (`--bf16 --fp16`);
# elsewhere a later spelling overrides an earlier one, as a later flag does in argparse
EXCLUSIVE = ("train.precision",)


def _setting(cfg: Config, key: str):
    section, field = key.split(".")
    return getattr(getattr(cfg, section), field)


def _refuse_conflicts(name: str, before: dict, cfg: Config, default: Config, set_by: dict) -> None:
    """Two spellings on one command line setting an EXCLUSIVE setting two ways (`--bf16 --fp16`,
    `--bf16 --torch_dtype float16`): one line, as HF's parser refuses `--bf16 --fp16`, where the
    last won unsaid. A flag given again, or one that only restores the default
    (`--bf16 false --fp16`), is no conflict."""
    for key in EXCLUSIVE:
        value = _setting(cfg, key)
        if value in (before[key], _setting(default, key)):
            continue
        other = set_by.get(key)
        if other is not None and other[0] != name and other[1] != value:
            raise UserError(f"--{other[0]} and --{name} both set {key} ({other[1]!r}, then {value!r}): "
                            "give one of them")
        set_by[key] = (name, value)


def split_options(args: list[str]) -> list[tuple[str, str | None, list[str]]]:
    """[(option name, its value or None, the tokens it was written as)] of trainer flags."""
    out, i = [], 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--"):
            raise UserError(f"unexpected argument {token!r}: options look like --section.key=value")
        name, eq, value = token[2:].partition("=")
        tokens = [token]
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else None
            takes_no_value = _is_flag(_option_name(name))
            if nxt is not None and not nxt.startswith("--") and not (
                    takes_no_value and nxt.lower() not in BOOL_WORDS):
                value, i = nxt, i + 1
                tokens.append(nxt)
                while _is_list(name) and i + 1 < len(args) and not args[i + 1].startswith("--"):
                    i += 1  # `--lora_target_modules q_proj v_proj`: a list's values, as HF's nargs="+"
                    value += "," + args[i]
                    tokens.append(args[i])
            elif takes_no_value or _unknown(name) or hf_flags.kind_of(_option_name(name), ALIASES) in (
                    "accepted", "refused"):  # an unknown or refused one is named so where it is applied
                value = None
            else:
                raise UserError(f"option --{name} needs a value")
        out.append((_option_name(name), value, tokens))
        i += 1
    return out


def _option_name(name: str) -> str:
    return name.replace("-", "_") if "." not in name else name  # --max-steps is --max_steps


def _unknown(name: str) -> bool:
    name = _option_name(name)
    return name not in ALIASES and name not in DEEPSPEED_FLAGS and name not in all_keys() and \
        hf_flags.kind_of(name, ALIASES) is None


def canonical_key(name: str) -> str:
    """section.key for an option name or alias (DeepSpeed flags stay as they are)."""
    return ALIASES[name][0] if name in ALIASES else name


def _is_list(name: str) -> bool:
    key = canonical_key(name)
    return key in all_keys() and typing.get_origin(base_type(field_info(key)[1])[0]) is list


def _is_flag(name: str) -> bool:
    """Options that may stand alone: booleans and the HF flags that imply a value."""
    if name in ALIASES:
        key, vmap = ALIASES[name]
        return (vmap is not None and None in vmap) or base_type(field_info(key)[1])[0] is bool
    if name in all_keys():
        return base_type(field_info(name)[1])[0] is bool
    return False


def apply_option(cfg: Config, name: str, value) -> None:
    """Set one option by canonical key (section.key) or HF alias, converting the value; the HF
    Trainer flags that are taken by value, accepted or refused: hf_flags.py."""
    if name in hf_flags.BY_VALUE:
        rule = hf_flags.by_value(name, value)
        if isinstance(rule, str):
            raise UserError(f"--{name} {value}: {rule}")
        for setting, setting_value in [rule] if isinstance(rule, tuple) else rule or []:
            set_key(cfg, setting, setting_value)
        return
    if name in hf_flags.ACCEPTED:
        return  # changes nothing here (the reason: docs/hf-trainer-flags.md)
    if name in hf_flags.REFUSED:
        raise UserError(f"--{name}: {hf_flags.REFUSED[name]}")
    if name in DEEPSPEED_FLAGS:
        from gptrain import deepspeed_config

        if value is None:
            raise UserError(f"--{name} needs the path of a DeepSpeed JSON config")
        for key, setting in deepspeed_config.read(value).items():
            apply_option(cfg, key, setting)
        return
    if name in ALIASES:
        key, vmap = ALIASES[name]
        if vmap is not None:
            lookup = value.lower() if isinstance(value, str) else value
            value = vmap.get(lookup, value)
        if value is None:
            value = "true"
        if name == "dataset":  # nanoGPT's key: data/DATASET
            value = nanogpt_config.data_dir(value)
        set_key(cfg, key, value)
        return
    if "." not in name:
        hint = f" (did you mean {MEANT[name]!r}?)" if name in MEANT else \
            closest(name, [*ALIASES, *DEEPSPEED_FLAGS, *all_keys()])
        raise UserError(f"unknown option --{name}{hint}; see `gptrain train --help`")
    set_key(cfg, name, "true" if value is None else value)
