"""Instruction (SFT) data: the JSONL rows users bring from TRL, prepared once into tokens, a
per-token loss mask and example boundaries. Detected from the first record's fields:

    {"prompt": "...", "completion": "..."}                     prompt-completion
    {"messages": [{"role": "user", "content": "..."}, ...]}    conversational

A prompt-completion row is its prompt's tokens (no loss) then its completion's and EOS (loss);
both as lists of messages (TRL's conversational prompt-completion), one conversation whose
completion's assistant turns alone carry loss.
A conversation is rendered with the tokenizer's own chat template (a Hugging Face tokenizer
that has one), else with PLAIN_TEMPLATE; only the assistant turns (their content and the EOS
that ends each) carry loss. The template is rendered one turn at a time: the text before each
assistant turn is the template's rendering of the turns before it with the generation prompt,
so the assistant's span is known in the text (its content and the end-of-turn marker the template puts after it), and each
piece is tokenized on its own.

On disk, beside the token files of formats.py (one example after another, `documents` counts
examples): SPLIT.mask.bin (uint8, 1 where the token is a target) and SPLIT.offsets.bin (uint64
little-endian, examples + 1 starts), named in meta.json's "sft" entry with their sha256. Held-out
examples (a seeded share of them) are the validation split. data/loader.py makes each example one
row (padded, never packed with another, so no example attends to another's tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gptrain.errors import UserError

PROMPT_COMPLETION, MESSAGES = "prompt-completion", "messages"
ROLES = ("system", "user", "assistant")
PLAIN_TEMPLATE = "<|{role}|>\n{content}\n"  # each turn; an assistant turn's content ends with EOS


def detect(paths: list[Path]) -> str | None:
    """The SFT format of local JSONL files (from the first file's first record), or None."""
    if not paths or not all(p.suffix.lower() == ".jsonl" and p.is_file() for p in paths):
        return None
    with open(paths[0], encoding="utf-8-sig", errors="replace") as f:
        first = next((line for line in f if line.strip()), "")
    try:
        row = json.loads(first)
    except (json.JSONDecodeError, RecursionError):
        return None
    if isinstance(row, dict) and "messages" in row:
        return MESSAGES
    if isinstance(row, dict) and ("prompt" in row or "completion" in row):  # (render names the missing one)
        return PROMPT_COMPLETION
    return None


def rows(paths: list[Path]):
    """(where, record) for every record of the files."""
    for p in paths:
        with open(p, encoding="utf-8-sig", errors="replace") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield f"{p} line {lineno}", json.loads(line)
                    except (json.JSONDecodeError, RecursionError) as e:  # (RecursionError: nested too deep)
                        raise UserError(f"{p} line {lineno} is not valid JSON: {e}") from None


def render(row, kind: str, tok, where: str) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of one record."""
    if tok.eos_id is None:
        raise UserError(f"instruction data needs a tokenizer with an end-of-sequence token; {tok.name} has none")
    if kind == PROMPT_COMPLETION:
        prompt, completion = (row.get(k) if isinstance(row, dict) else None for k in ("prompt", "completion"))
        if isinstance(prompt, list) and isinstance(completion, list):  # TRL's conversational prompt-completion
            return _conversation(prompt + completion, len(prompt), tok, where)
        if not isinstance(prompt, str) or not isinstance(completion, str) or not completion.strip():
            missing = [k for k, v in (("prompt", prompt), ("completion", completion)) if v is None]
            raise UserError(f"{where}: a prompt-completion record needs a string prompt and a non-empty string "
                            f"completion (or both as lists of messages)" + (f"; it has no {' and no '.join(missing)}"
                                                                            if missing else ""))
        p, c = tok.encode(prompt), tok.encode(completion) + [tok.eos_id]
        return p + c, [0] * len(p) + [1] * len(c)
    return _conversation(row.get("messages") if isinstance(row, dict) else None, 0, tok, where)


def _conversation(messages, first_learned: int, tok, where: str) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a conversation whose assistant turns from `first_learned` on
    carry loss (those of a prompt's messages do not)."""
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages):
        raise UserError(f"{where}: messages must be a list of {{role: system|user|assistant, content: str}}")
    learned = [m for m in messages[first_learned:] if m["role"] == "assistant"]
    if not any(m["content"].strip() for m in learned):
        raise UserError(f"{where}: the conversation has no assistant turn to learn"
                        + (" (its assistant turns are empty)" if learned else ""))
    ids, mask = [], []
    for text, learn in _pieces(messages, first_learned, tok, where):
        piece = tok.encode(text) if isinstance(text, str) else text
        ids += piece
        mask += [int(learn)] * len(piece)
    return ids, mask


def _pieces(messages, first_learned: int, tok, where):
    """(text or token ids, carries loss) in order, with the chat template or the plain one."""
    template = getattr(getattr(tok, "tok", None), "chat_template", None)
    if not template:
        for i, m in enumerate(messages):
            yield f"<|{m['role']}|>\n", False
            if m["role"] == "assistant":
                yield m["content"], i >= first_learned
                yield [tok.eos_id], i >= first_learned
                yield "\n", False
            else:
                yield m["content"] + "\n", False
        return
    def render(turns, **kw):  # the template is the tokenizer's own code: its refusal is one line
        try:
            return tok.tok.apply_chat_template(turns, tokenize=False, **kw)
        except Exception as e:  # jinja2's TemplateError (raise_exception), its TypeErrors, ...
            raise UserError(f"{where}: the tokenizer's chat template refused these turns "
                            f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None
    full = render(messages)
    done = 0
    for i, m in enumerate(messages):
        if m["role"] != "assistant" or i < first_learned:
            continue
        before = render(messages[:i], add_generation_prompt=True)
        through = render(messages[:i + 1])
        if not (full.startswith(before) and full.startswith(through) and len(before) >= done):
            raise UserError(f"{where}: the tokenizer's chat template does not render turn by turn "
                            "(each turn's text must extend the text before it); use a tokenizer "
                            "without a chat template for the plain one")
        end = max(len(before), len(full[:len(through)].rstrip()))  # the turn and its end marker, not the whitespace after
        yield full[done:len(before)], False
        yield full[len(before):end], True
        done = end
    yield full[done:], False


def prepare(paths: list[Path], kind: str, tok, tmp: Path, val_fraction: float, seed: int, dtype: str) -> dict:
    """Write the examples' files into `tmp`; the splits and "sft" entries of meta.json."""
    from gptrain.data.formats import SplitWriter, sha256_file

    examples = [render(row, kind, tok, where) for where, row in rows(paths)]
    examples = [e for e in examples if len(e[0]) >= 2]
    if not examples:
        raise UserError(f"no instruction records in {', '.join(map(str, paths))}")
    order = np.random.default_rng(seed).permutation(len(examples))
    n_val = min(len(examples) - 1, round(len(examples) * val_fraction)) if val_fraction > 0 else 0
    if val_fraction > 0 and len(examples) > 1:
        n_val = max(1, n_val)
    chosen = {"val": sorted(order[:n_val]), "train": sorted(order[n_val:])}
    splits, sft = {}, {"format": kind, "template": "chat template" if getattr(
        getattr(tok, "tok", None), "chat_template", None) else "plain", "splits": {}}
    for split, idx in chosen.items():
        writer = SplitWriter(tmp, split, dtype, 1 << 62)
        masks, offsets = [], [0]
        for i in idx:
            ids, mask = examples[i]
            writer.write(np.asarray(ids, dtype=np.int64), ends=[len(ids)])
            masks.append(np.asarray(mask, dtype=np.uint8))
            offsets.append(offsets[-1] + len(ids))
        splits[split] = writer.finish()
        files = {}
        for what, arr in (("mask", np.concatenate(masks) if masks else np.zeros(0, np.uint8)),
                          ("offsets", np.asarray(offsets, dtype="<u8"))):
            name = f"{split}.{what}.bin"
            (tmp / name).write_bytes(arr.tobytes())
            files[what] = {"name": name, "sha256": sha256_file(tmp / name)}
        sft["splits"][split] = {"examples": len(idx), **files}
    return {"splits": splits, "sft": sft}
