"""Instruction (SFT) data (data/sft.py, data/loader.py): TRL's prompt-completion and messages
rows prepared into tokens and a loss mask, the chat template's assistant turns found in its
text, the loss taken on completion tokens only (against a cross-entropy by hand), each example
alone in its row, and bad rows refused in one line."""

import json

import numpy as np
import pytest
import torch

from gptrain.data.formats import open_examples, open_split, read_meta
from gptrain.data.loader import BlockLoader
from gptrain.data.prepare import prepare
from gptrain.tokenizers import GPT2Tokenizer
from tests.conftest import run_cli

WORDS = ["red", "blue", "green", "cat", "dog", "sun", "moon", "tree"]


def jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pc_rows(n=40):
    return [{"prompt": f"Q: say {WORDS[i % 8]}\n", "completion": f"ANSWER: {WORDS[i % 8]}"} for i in range(n)]


def examples_of(out, split="train"):
    tokens = np.asarray(open_split(out, split), dtype=np.int64)
    mask, starts = open_examples(out, split, len(tokens))
    return [(tokens[a:b].tolist(), np.asarray(mask[a:b]).tolist()) for a, b in zip(starts[:-1], starts[1:])]


def test_prompt_completion_rows_learn_the_completion_and_eos_only(tmp_path):
    meta = prepare([str(jsonl(tmp_path / "d.jsonl", pc_rows()))], str(tmp_path / "out"), "gpt2", val_fraction=0.1, quiet=True)
    assert meta["sft"]["format"] == "prompt-completion" and meta["splits"]["val"]["documents"] == 4
    tok = GPT2Tokenizer()
    for ids, mask in examples_of(tmp_path / "out"):
        learned = [t for t, m in zip(ids, mask) if m]
        assert learned[-1] == tok.eos_id and tok.decode(learned[:-1]).startswith("ANSWER: ")
        assert tok.decode([t for t, m in zip(ids, mask) if not m]).startswith("Q: say ")
        assert mask == sorted(mask)  # prompt, then completion


def test_messages_with_the_plain_template(tmp_path):
    rows = [{"messages": [{"role": "system", "content": "Be short."}, {"role": "user", "content": "say cat"},
                          {"role": "assistant", "content": "ANSWER: cat"}, {"role": "user", "content": "again"},
                          {"role": "assistant", "content": "ANSWER: cat"}]}] * 3
    meta = prepare([str(jsonl(tmp_path / "c.jsonl", rows))], str(tmp_path / "out"), "gpt2", val_fraction=0, quiet=True)
    assert meta["sft"] == {**meta["sft"], "format": "messages", "template": "plain"}
    tok = GPT2Tokenizer()
    (ids, mask), = examples_of(tmp_path / "out")[:1]
    eos = tok.decode([tok.eos_id])
    assert tok.decode(ids) == ("<|system|>\nBe short.\n<|user|>\nsay cat\n<|assistant|>\nANSWER: cat" + eos +
                               "\n<|user|>\nagain\n<|assistant|>\nANSWER: cat" + eos + "\n")
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == ("ANSWER: cat" + eos) * 2


def test_messages_with_the_tokenizers_chat_template(tmp_path, tiny_hf_llama):
    import shutil

    tok_dir = tmp_path / "tok"
    shutil.copytree(tiny_hf_llama, tok_dir)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}{{ '[' + m['role'] + '] ' + m['content'] }}"
                               "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
                               "{% if add_generation_prompt %}{{ '[assistant] ' }}{% endif %}")
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    rows = [{"messages": [{"role": "user", "content": "say dog"}, {"role": "assistant", "content": "ANSWER: dog"}]}] * 2
    meta = prepare([str(jsonl(tmp_path / "c.jsonl", rows))], str(tmp_path / "out"), str(tok_dir), val_fraction=0, quiet=True)
    assert meta["sft"]["template"] == "chat template"
    from gptrain.tokenizers import HFTokenizer

    tok = HFTokenizer(str(tok_dir))
    ids, mask = examples_of(tmp_path / "out")[0]
    assert tok.tok.decode(ids) == "[user] say dog\n[assistant] ANSWER: dog<|endoftext|>\n"
    learned = [t for t, m in zip(ids, mask) if m]
    assert tok.tok.decode(learned) == "ANSWER: dog<|endoftext|>" and learned[-1] == tok.eos_id
    rows = [{"prompt": [{"role": "user", "content": "say cat"}, {"role": "assistant", "content": "EXAMPLE: cat"},
                        {"role": "user", "content": "say dog"}],
             "completion": [{"role": "assistant", "content": "ANSWER: dog"}]}] * 2  # conversational prompt-completion
    prepare([str(jsonl(tmp_path / "pc.jsonl", rows))], str(tmp_path / "pc"), str(tok_dir), val_fraction=0, quiet=True)
    ids, mask = examples_of(tmp_path / "pc")[0]
    assert tok.tok.decode(ids) == "[user] say cat\n[assistant] EXAMPLE: cat<|endoftext|>\n[user] say dog\n" \
                                  "[assistant] ANSWER: dog<|endoftext|>\n"
    assert tok.tok.decode([t for t, m in zip(ids, mask) if m]) == "ANSWER: dog<|endoftext|>"


def test_conversational_prompt_completion_learns_the_completions_assistant_turns_only(tmp_path):
    """TRL's conversational prompt-completion: both are lists of messages; an assistant turn in
    the prompt (an example shown to the model) carries no loss."""
    rows = [{"prompt": [{"role": "user", "content": "say sun"}, {"role": "assistant", "content": "EXAMPLE: sun"},
                        {"role": "user", "content": "say moon"}],
             "completion": [{"role": "assistant", "content": "ANSWER: moon"}]}] * 2
    meta = prepare([str(jsonl(tmp_path / "c.jsonl", rows))], str(tmp_path / "out"), "gpt2", val_fraction=0, quiet=True)
    assert meta["sft"]["format"] == "prompt-completion"
    tok = GPT2Tokenizer()
    ids, mask = examples_of(tmp_path / "out")[0]
    eos = tok.decode([tok.eos_id])
    assert tok.decode(ids) == ("<|user|>\nsay sun\n<|assistant|>\nEXAMPLE: sun" + eos + "\n<|user|>\nsay moon\n"
                               "<|assistant|>\nANSWER: moon" + eos + "\n")
    assert tok.decode([t for t, m in zip(ids, mask) if m]) == "ANSWER: moon" + eos


@pytest.fixture
def sft_data(tmp_path):
    rows = pc_rows(12) + [{"prompt": "Q: a much longer question " * 3, "completion": "ANSWER: long"}]
    prepare([str(jsonl(tmp_path / "d.jsonl", rows))], str(tmp_path / "out"), "gpt2", val_fraction=0, quiet=True)
    return tmp_path / "out"


def test_the_loss_is_a_cross_entropy_over_completion_tokens_only(sft_data):
    from gptrain.models.registry import build
    from gptrain.models.shapes import GPTConfig

    tokens = open_split(sft_data, "train")
    loader = BlockLoader(tokens, 32, 4, examples=open_examples(sft_data, "train", len(tokens)))
    x, y = loader.next_batch()
    torch.manual_seed(0)
    model = build(GPTConfig(block_size=32, vocab_size=50257, n_layer=2, n_head=2, n_embd=32))
    logits = model(x)
    by_hand, n = 0.0, 0
    for r, (ids, mask) in enumerate(zip(x.tolist(), y.tolist())):
        for t in range(32):
            if mask[t] != -100:  # a completion token: its log-probability by hand
                by_hand -= torch.log_softmax(logits[r, t].double(), -1)[mask[t]].item()
                n += 1
    assert n and all((y[r] != -100).sum() <= 6 for r in range(4))  # "ANSWER: w" + EOS, no prompt token
    for fused in (True, False):
        model.fused_loss = fused
        assert abs(model(x, y)[1].item() - by_hand / n) < 1e-5


def test_each_example_is_alone_in_its_row(sft_data):
    from gptrain.models.registry import build
    from gptrain.models.shapes import GPTConfig

    tokens = open_split(sft_data, "train")
    loader = BlockLoader(tokens, 32, 1, examples=open_examples(sft_data, "train", len(tokens)))
    assert loader.left_out == 0 and loader.n_blocks == 13
    torch.manual_seed(0)
    model = build(GPTConfig(block_size=32, vocab_size=50257, n_layer=2, n_head=2, n_embd=32))
    x, y = loader.batch([0, 1, 2])
    together = model(x)
    sums = []
    for r in range(3):
        alone_x, alone_y = loader.batch([r])
        assert torch.equal(alone_x[0], x[r]) and torch.equal(alone_y[0], y[r])
        valid = y[r] != -100
        assert torch.allclose(model(alone_x)[0][valid], together[r][valid], atol=1e-5)  # no other example seen
        sums.append(model(alone_x, alone_y)[1].item() * valid.sum().item())
    assert abs(model(x, y)[1].item() - sum(sums) / (y != -100).sum().item()) < 1e-5
    short = BlockLoader(tokens, 12, 1, examples=open_examples(sft_data, "train", len(tokens)))
    assert short.left_out == 1 and short.n_blocks == 12  # the long prompt leaves no completion in 13 tokens


@pytest.mark.parametrize("rows, words", [
    ([{"prompt": "Q", "completion": ""}], "line 1: a prompt-completion record needs a string prompt and a non-empty"),
    ([{"prompt": "Q", "completion": "A"}, {"prompt": "Q"}], "line 2: a prompt-completion record needs"),
    ([{"messages": [{"role": "user", "content": "hi"}]}], "line 1: the conversation has no assistant turn"),
    ([{"messages": [{"role": "robot", "content": "hi"}]}], "messages must be a list of {role: system|user|assistant"),
    ([{"completion": "A"}], "line 1: a prompt-completion record needs a string prompt and a non-empty string "
                            "completion (or both as lists of messages); it has no prompt"),
    ([{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}],
     "no assistant turn to learn (its assistant turns are empty)"),
])
def test_bad_rows_are_one_line_and_nothing_is_written(tmp_path, isolated_home, rows, words):
    out = tmp_path / "out"
    r = run_cli("data", "prepare", str(jsonl(tmp_path / "bad.jsonl", rows)), "--out", str(out), "--tokenizer", "gpt2")
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and words in r.stderr, r.stderr
    assert not out.exists() and not list(tmp_path.glob(".*"))


def test_char_is_refused_and_plain_text_jsonl_stays_plain(tmp_path, isolated_home):
    r = run_cli("data", "prepare", str(jsonl(tmp_path / "d.jsonl", pc_rows(3))), "--out", str(tmp_path / "o"),
                "--tokenizer", "char")
    assert r.returncode == 2 and "not char" in r.stderr and not (tmp_path / "o").exists(), r.stderr
    meta = prepare([str(jsonl(tmp_path / "t.jsonl", [{"text": "hello world"}] * 5))], str(tmp_path / "t"), "gpt2", quiet=True)
    assert "sft" not in meta and "sft" not in read_meta(tmp_path / "t")


def test_a_chat_template_that_refuses_the_turns_is_one_line(tmp_path, tiny_hf_llama):
    """#47 round 6 G.tpl1 (medium): a Mistral-style template that raises on the order of roles
    (raise_exception) was a jinja2 TemplateError traceback from `data prepare`."""
    import shutil

    tok_dir = tmp_path / "tok"
    shutil.copytree(tiny_hf_llama, tok_dir)
    config = json.loads((tok_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% for m in messages %}{% if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                               "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                               "{% endif %}{{ m['content'] }}{% endfor %}")
    (tok_dir / "tokenizer_config.json").write_text(json.dumps(config))
    rows = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say dog"},
                          {"role": "assistant", "content": "dog"}]}] * 2
    r = run_cli("data", "prepare", str(jsonl(tmp_path / "c.jsonl", rows)), "--out", str(tmp_path / "out"),
                "--tokenizer", str(tok_dir))
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and "Traceback" not in r.stderr and "chat template refused these turns" in lines[-1], r.stderr
    assert "roles must alternate" in lines[-1] and not (tmp_path / "out").exists()
