"""Generation speed: gptrain's KV-cached sampler vs transformers' `generate` on the same weights.

    python bench/generate.py [--new-tokens 128] [--prompt-tokens 16] [--repeat 5] [--device auto]

A random-init GPT-2 (CPU: 6 layers x 6 heads x 384 wide; GPU: GPT-2 124M), exported from gptrain
to a Hugging Face directory and loaded by transformers, so both run identical weights. Greedy
decoding with a KV cache, batch 1 and batch 8, with fp32 and with bf16 weights on both sides;
prints each pair, whether the generated ids are equal, and the ratio of each side at its best
precision for that batch size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    args = ap.parse_args()

    import torch
    from transformers import GPT2LMHeadModel

    from gptrain.models.generate import generate
    from gptrain.models.shapes import GPTConfig
    from gptrain.models.gpt2 import GPT
    from gptrain.models.hf import export_hf
    from gptrain.tokenizers import GPT2Tokenizer

    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    shape = dict(n_layer=12, n_head=12, n_embd=768) if device == "cuda" else dict(n_layer=6, n_head=6, n_embd=384)
    torch.manual_seed(0)
    ours = GPT(GPTConfig(block_size=1024, vocab_size=50257, **shape)).eval()
    with tempfile.TemporaryDirectory() as tmp:
        export_hf(ours, GPT2Tokenizer(), Path(tmp) / "hf")
        theirs = GPT2LMHeadModel.from_pretrained(Path(tmp) / "hf", attn_implementation="sdpa").eval()
    models = {"fp32": (ours.to(device), theirs.to(device))}
    import copy

    models["bf16"] = tuple(copy.deepcopy(m).to(torch.bfloat16) for m in models["fp32"])

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    print(f"device {device} | {shape['n_layer']} layers x {shape['n_head']} heads x {shape['n_embd']} wide, "
          f"GPT-2 vocabulary | prompt {args.prompt_tokens} tokens, {args.new_tokens} new tokens, greedy, "
          f"median of {args.repeat}")
    for batch in (1, 8):
        prompt = torch.randint(0, 50257, (batch, args.prompt_tokens), generator=torch.Generator().manual_seed(batch)).to(device)
        best = {"gptrain": (0.0, ""), "transformers": (0.0, "")}
        for dtype, (ours_m, theirs_m) in models.items():
            runs = {
                "gptrain": lambda: generate(ours_m, prompt, args.new_tokens),
                "transformers": lambda: theirs_m.generate(prompt, attention_mask=torch.ones_like(prompt),
                                                          max_new_tokens=args.new_tokens,
                                                          min_new_tokens=args.new_tokens, do_sample=False,
                                                          use_cache=True, pad_token_id=0),
            }
            speeds, outputs = {}, {}
            with torch.inference_mode():
                for name, fn in runs.items():
                    fn()  # warm-up
                    times = []
                    for _ in range(args.repeat):
                        sync()
                        start = time.perf_counter()
                        outputs[name] = fn()
                        sync()
                        times.append(time.perf_counter() - start)
                    speeds[name] = batch * args.new_tokens / statistics.median(times)
                    best[name] = max(best[name], (speeds[name], dtype))
            same = outputs["gptrain"].tolist() == outputs["transformers"].tolist()
            print(f"batch {batch} {dtype}: gptrain {speeds['gptrain']:>7,.0f} tokens/s | transformers "
                  f"{speeds['transformers']:>7,.0f} tokens/s | ratio {speeds['gptrain'] / speeds['transformers']:.2f}x"
                  f" | same ids: {same}")
        (g, gd), (t, td) = best["gptrain"], best["transformers"]
        print(f"batch {batch} best vs best: gptrain {g:,.0f} ({gd}) / transformers {t:,.0f} ({td}) = {g / t:.2f}x")


if __name__ == "__main__":
    main()
