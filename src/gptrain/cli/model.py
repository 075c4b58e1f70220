"""`gptrain generate`, `gptrain export`: use a trained model."""

from __future__ import annotations

import sys


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
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("export", help="export a model to a Hugging Face directory",
                       description="Write MODEL as a Hugging Face model directory (hf: a LoRA model's "
                       "adapters merged in), or a LoRA model's adapters as a PEFT adapter directory "
                       "(peft: for PeftModel.from_pretrained on the HF form of its base).")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("--format", default="hf", choices=["hf", "peft"])
    p.add_argument("--out", required=True, help="new directory to write")
    p.set_defaults(func=cmd_export)


def cmd_generate(args, extra) -> int:
    import torch

    from gptrain.errors import UserError
    from gptrain.models.generate import check_sampling, generate
    from gptrain.models.load import load_model, pick_device
    from gptrain.refs import resolve
    from gptrain.tokenizers import by_name

    check_sampling(args.max_new_tokens, args.temperature, args.top_k, args.top_p, args.num_samples)
    device = pick_device(args.device)
    model, tokenizer = load_model(resolve(args.model), device=device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(
        args.dtype, torch.bfloat16 if device == "cuda" else torch.float32)
    model = model.to(dtype)
    if args.tokenizer:
        tokenizer = by_name(args.tokenizer)
    if tokenizer is None:
        raise UserError(f"{args.model} has no tokenizer files; pass --tokenizer gpt2 (or a "
                        "tokenizer directory)")
    ids = tokenizer.encode(args.prompt) if args.prompt else []
    if not ids:
        if tokenizer.eos_id is None:
            raise UserError("give a --prompt: this tokenizer has no end-of-text token to start from")
        ids = [tokenizer.eos_id]
    prompt = torch.tensor([ids] * args.num_samples, device=device)
    out = generate(model, prompt, args.max_new_tokens, temperature=args.temperature,
                   top_k=args.top_k, top_p=args.top_p, eos_id=tokenizer.eos_id, seed=args.seed)
    for i, row in enumerate(out.tolist()):
        new = row[len(ids):]
        if tokenizer.eos_id is not None and tokenizer.eos_id in new:
            new = new[: new.index(tokenizer.eos_id)]
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        sys.stdout.write(args.prompt + tokenizer.decode(new) + "\n")
    return 0


def cmd_eval(args, extra) -> int:
    import json

    from gptrain.data.formats import open_examples, read_meta
    from gptrain.data.remote_shards import open_tokens
    from gptrain.data.loader import eval_batches
    from gptrain.errors import UserError
    from gptrain.models.load import load_model, pick_device
    from gptrain.refs import resolve
    from gptrain.tokenizers import name_of, same
    from gptrain.train.evaluate import evaluate
    from gptrain.train.model_init import resolve_data

    args.split_default, args.split = args.split is None, args.split or "val"
    device = pick_device(args.device)
    model, tokenizer = load_model(resolve(args.model), device=device)
    # what training takes, read the same way: a prepared or pushed dataset, a save_to_disk
    # folder, a text/JSONL/parquet file or URL (tokenized once, with the model's own tokenizer)
    data_dir = resolve_data(args.dataset, tokenizer=name_of(tokenizer) if tokenizer is not None else "")
    meta = read_meta(data_dir)
    if tokenizer is not None and not same(tokenizer, meta["tokenizer"]):
        raise UserError(f"dataset {args.dataset} was tokenized with {meta['tokenizer_name']}, "
                        f"not with the model's tokenizer ({tokenizer.name})")
    split = args.split
    if split not in meta["splits"] and args.split_default and "train" in meta["splits"]:
        import sys

        split = "train"  # a save_to_disk folder or a pushed file set with one split only
        print(f"note: {args.dataset} has no val split; evaluating on its train split", file=sys.stderr)
    tokens = open_tokens(data_dir, split)
    batches = eval_batches(tokens, model.config.block_size, args.batch_size, max_blocks=args.max_blocks,
                           vocab_size=meta["vocab_size"], source=f"dataset {data_dir}",
                           examples=open_examples(data_dir, split, len(tokens)))
    result = evaluate(lambda x, y: model(x), batches, device)
    if not result:
        raise UserError(f"the {split} split has fewer than {model.config.block_size + 1} tokens")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"loss {result['loss']:.4f} | perplexity {result['perplexity']:.2f} | "
              f"accuracy {result['accuracy']:.4f} | {result['tokens']:,} tokens")
    return 0


def cmd_export(args, extra) -> int:
    from gptrain.models.hf import export_hf
    from gptrain.models.load import load_model
    from gptrain.refs import resolve

    model, tokenizer = load_model(resolve(args.model), device="cpu")
    arch = "Llama" if model.config.arch == "llama" else "GPT-2"
    if args.format == "peft":
        from pathlib import Path

        from gptrain.models.peft_export import export_peft
        from gptrain.weights.hf import is_hf_dir

        base = (getattr(model, "lora_base", None) or {}).get("init_from", "")
        out = export_peft(model, args.out, base)
        print(f"exported the LoRA adapters of {args.model} to {out} (PEFT, on the {arch} base {base})")
        if Path(base).is_dir() and not is_hf_dir(base):
            print(f"note: their base {base} is a gptrain checkpoint, which peft cannot load: export it "
                  f"(`gptrain export {base} --out BASE_DIR`) and set base_model_name_or_path in "
                  f"{out}/adapter_config.json to BASE_DIR")
        return 0
    out = export_hf(model, tokenizer, args.out)
    print(f"exported {args.model} to {out} (Hugging Face {arch} format"
          + (", LoRA adapters merged)" if model.config.lora_r else ")"))
    return 0
