"""The trainer's evaluation half (train/trainer.py's Trainer inherits it): which validation
splits a run can evaluate on (one line when a split is too small for the layout, or read only in
part), the logits of one batch (through the pipeline schedule when there is one), and an
evaluation: metrics on each split, a mix's weighted by its weights, logged and printed."""

from __future__ import annotations

from pathlib import Path

from gptrain.data import mixture
from gptrain.data.formats import open_examples, read_meta
from gptrain.data.loader import count_blocks, eval_batches
from gptrain.data.remote_shards import open_tokens
from gptrain.train.evaluate import eval_block_limit, evaluate, reshard


class Evaluating:
    def _val_split(self, path: Path, T: int):
        """(validation tokens, examples or None) of a dataset, or None; when eval was asked
        for, one line says why not."""
        tc = self.cfg.train
        tokens = read_meta(path)["splits"].get("val", {}).get("tokens", 0)
        examples = open_examples(path, "val", tokens) if tokens else None
        limit = eval_block_limit(self.cfg)
        have = count_blocks(tokens, T, limit, examples)
        need = self.dims.dp * (tc.eval_batch_size if self.dims.pp > 1 else 1)  # a pipeline needs full batches
        if have >= need:
            if tc.do_eval and limit is not None and \
                    (whole := count_blocks(tokens, T, None, examples)) > have:
                self.log_main(f"note: each evaluation reads the first {have:,} of the {whole:,} validation "
                              f"blocks of {path} (set --train.eval_iters=0 to read the whole split)")
            return open_tokens(path, "val"), examples
        if tc.do_eval:
            self.log_main(f"note: no evaluation{' of it' if self.cfg.data.mix else ''}: the validation split of "
                          f"{path} has {tokens} tokens, {have} block(s) of {T}, and this layout needs {need}; "
                          "prepare the data with a larger --val-fraction (or a smaller train.eval_batch_size)")
        return None

    def _logits(self, x, y):
        if self.schedule is None:
            with self.autocast():
                return self.parts[0](x)
        out = self.schedule.eval(*((x,) if self.has_first else ()), target=y if self.has_last else None)
        return out if self.has_last else None

    def _eval(self) -> dict:
        """Metrics on the validation split; with a mix, on each source's (eval/<name>/...) and
        eval/loss their mean weighted by the mix's weights (data/mixture.py)."""
        if not self.val_sets:
            return {}
        for part in self.parts:
            part.eval()
        results = {}
        for name, weight, path, tokens, examples in self.val_sets:
            batches = eval_batches(tokens, self.model_cfg.block_size, self.cfg.train.eval_batch_size,
                                   self.dp_rank, self.dims.dp, eval_block_limit(self.cfg),
                                   self.vocab_size, f"dataset {path}", examples)
            if self.schedule is not None:  # every microbatch split needs full batches
                batches = (b for b in batches if len(b[0]) == self.cfg.train.eval_batch_size)
            if r := evaluate(self._logits, batches, self.env.device, copies=self.dims.tp):
                results[name] = (weight, r)
        for part in self.parts:
            part.train()
        reshard(self.parts)
        if not results:
            return {}
        result = next(iter(results.values()))[1] if not self.cfg.data.mix else mixture.weighted(results)
        self.last.update(eval_loss=result["loss"], eval_step=self.step)
        self.metrics.log(self.step, result, prefix="eval")
        by_source = ", ".join(f"{k[:-5]} {v:.4f}" for k, v in result.items() if k.endswith("/loss"))  # a mix's
        self.log_main(f"eval step {self.step} | loss {result['loss']:.4f} | ppl "
                      f"{result['perplexity']:.2f} | acc {result['accuracy']:.3f} | {result['tokens']:,} tokens"
                      + (f" | by source: {by_source}" if by_source else ""))
        return result

    def _should_eval(self) -> bool:
        tc = self.cfg.train
        if not tc.do_eval or tc.eval_strategy == "no":
            return False
        every = tc.eval_every if tc.eval_strategy == "steps" else self.steps_per_epoch
        return every > 0 and self.step % every == 0
