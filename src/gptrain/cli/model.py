"""`gptrain generate`, `gptrain export`: use a trained model."""

from __future__ import annotations

import sys

from gptrain.cli import render


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text from a model",
                       description="Generate text. MODEL is a job name, a checkpoint ID or "
                       "directory, a Hugging Face model directory (a Trainer checkpoint-N too) "
                       "or hub id, or a nanoGPT ckpt.pt.")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--prompt", "--input_str", dest="prompt", default="",
                   help="text to continue (empty: start from end-of-text)")
    p.add_argument("--max-new-tokens", "--max_new_tokens", dest="max_new_tokens", type=int, default=50)
    p.add_argument("--temperature", type=float, default=0.8, help="0 for greedy decoding")
    p.add_argument("--top-k", dest="top_k", type=int, default=None)
    p.add_argument("--top-p", dest="top_p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--num-samples", dest="num_samples", type=int, default=1)
    p.add_argument("--tokenizer", default=None,
                   help="override the model's tokenizer (gpt2, byte, or a HF tokenizer directory)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16", "fp16"],
                   help="weights for sampling; auto: bf16 on CUDA, fp32 on CPU (bf16 about doubles "
                   "CPU speed, since decoding is bound by reading the weights)")
    _allow_flag(p)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("eval", help="evaluate a model on a dataset's validation split",
                       description="Loss, perplexity and next-token accuracy of MODEL on the val "
                       "split (or --split) of a dataset, read as training reads it.")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--dataset", required=True, help="what training takes: a dataset name or "
                   "directory, a save_to_disk folder, a text/JSONL/parquet file or URL")
    p.add_argument("--split", default=None, choices=["val", "train"],
                   help="val (the default: train when the data has no val split) or train")
    p.add_argument("--batch-size", dest="batch_size", type=int, default=8)
    p.add_argument("--max-blocks", dest="max_blocks", type=int, default=None)
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--fetch-timeout", dest="fetch_timeout", type=float, default=None, metavar="SECONDS",
                   help="a dataset URL that sends nothing this long is an error (default 60, at most 3600)")
    render.json_switch(p)
    _allow_flag(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export", help="export a model to a Hugging Face directory",
                       description="Write MODEL as a Hugging Face model directory (hf: a LoRA model's "
                       "adapters merged in), or a LoRA model's adapters as a PEFT adapter directory "
                       "(peft: for PeftModel.from_pretrained on the HF form of its base).")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--format", default="hf", choices=["hf", "peft"])
    p.add_argument("--out", required=True, help="new directory to write")
    _allow_flag(p)
    p.set_defaults(func=cmd_export)


def _allow_flag(p) -> None:
    p.add_argument("--allow-unverified", "--allow_unverified", dest="allow_unverified", action="store_true",
                   help="load a gptrain checkpoint that has no checksums.json without verifying its bytes "
                   "(one written before gptrain verified checkpoints), with a warning")


def _allow(args) -> None:
    if args.allow_unverified:
        from gptrain.models.api import allow_unverified

        allow_unverified()


def cmd_generate(args, extra) -> int:
    _allow(args)
    from gptrain.jobs.api import generate
    from gptrain.models.api import Sampling

    sampling = Sampling(prompt=args.prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, seed=args.seed, num_samples=args.num_samples,
                        tokenizer=args.tokenizer, device=args.device, dtype=args.dtype)
    texts = generate(args.model, sampling)
    for i, text in enumerate(texts):
        if len(texts) > 1:
            print(f"--- sample {i + 1}")
        sys.stdout.write(text + "\n")
    return 0


def cmd_eval(args, extra) -> int:
    _allow(args)
    from gptrain.jobs.api import evaluate

    result, notes = evaluate(args.model, args.dataset, args.split, args.batch_size, args.max_blocks, args.device,
                              args.fetch_timeout)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if not render.as_json(args, result):
        print(f"loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f} | "
              f"accuracy {result['accuracy']:.4f} | {result['tokens']:,} tokens")
    return 0


def cmd_export(args, extra) -> int:
    _allow(args)
    from gptrain.jobs.api import export

    done = export(args.model, args.out, args.format)
    if args.format == "peft":
        print(f"exported the LoRA adapters of {args.model} to {done.out} (PEFT, on the {done.arch} base {done.base})")
    else:
        print(f"exported {args.model} to {done.out} (Hugging Face {done.arch} format"
              + (", LoRA adapters merged)" if done.merged else ")"))
    for note in done.notes:
        print(f"note: {note}")
    return 0
