"""The trainer's checkpoint half (train/trainer.py's Trainer inherits it): save a checkpoint,
synchronously or in the background, finish a background save, and resume model, optimizer,
loader position, RNG and loss scale from the newest checkpoint (or a named one)."""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist

from gptrain import run_layout
from gptrain.errors import UserError
from gptrain.train import checkpoint as ckpt
from gptrain.weights import layout


def make_output_dir(out: Path, config_text: str, is_main: bool) -> None:
    """Rank 0 makes the output directory and writes config.toml in it; when it cannot (read-only,
    under a file, a full disk), every rank ends with the same one line rather than rank 0 with a
    traceback and the others with a broken connection."""
    from gptrain.errors import disk_full

    problem = None
    if is_main:
        try:
            out.mkdir(parents=True, exist_ok=True)
            run_layout.config_file(out).write_text(config_text)
        except OSError as e:
            full = disk_full(e, out)
            problem = str(full) if full else (f"cannot write the output directory {out} "
                                              f"({e.strerror or e}): choose another train.output_dir")
    if dist.is_initialized():
        shared = [problem]
        dist.broadcast_object_list(shared, src=0)
        problem = shared[0]
    if problem:
        raise UserError(problem)


class Checkpointing:
    """Uses the trainer's cfg, env, out, step, parts, optims, loader, scaler, last, pending_save,
    _async_pg, _step_loss, read_back and the fields it records (model_cfg,
    tokenizer_spec, data_dir, lora_base)."""

    def save(self, final: bool = False) -> Path:
        # the step just taken; nan_policy=stop ends the run here: no checkpoint after a NaN
        if (loss := self.read_back(self._step_loss)[0]) is not None:
            self.last["train_loss"] = loss
        self.data_check.wait()  # nothing trained on damaged data is committed (train/data_check.py)
        state = {
            "step": self.step, "total_steps": self.total_steps, "loader": self.reader.position(),
            "train_loss": self.last["train_loss"], "eval_loss": self.last["eval_loss"],
            "eval_step": self.last.get("eval_step"),  # the step eval_loss was measured at
            "model_config": self.model_cfg.to_dict(), "tokenizer": self.tokenizer_spec,
            "config": self.cfg.to_dict(), "dataset": str(self.data_dir), "world_size": self.env.world,
            "scaler": self.scaler.state_dict() if self.scaler else None,
        }
        if self.lora_base is not None:  # adapters only, and where their base is (models/lora.py)
            state["lora_base"] = self.lora_base
        self.finish_pending_save()
        tensors = ckpt.training_tensors(self.parts, self.optims, adapters_only=self.lora_base is not None)
        use_async = self.cfg.checkpoint.async_save and not final
        pending = ckpt.save(self.out, self.step, tensors, state, self.cfg.checkpoint.keep_last,
                            asynchronous=use_async, group=self._async_group() if use_async else None,
                            remote=self.cfg.checkpoint.remote, keep_best=self.cfg.checkpoint.keep_best)
        if use_async:
            self.pending_save = pending
            self.log_main(f"writing checkpoint {pending.path} in the background")
        else:
            self.log_main(f"saved checkpoint {pending.path}")
        return pending.path

    def finish_pending_save(self) -> None:
        if self.pending_save is not None:
            path = self.pending_save.finish()
            self.pending_save = None
            self.log_main(f"saved checkpoint {path}")

    def _async_group(self):
        """A gloo group of its own, so the background writer's collectives never interleave
        with training's."""
        if not dist.is_initialized():
            return None
        if self._async_pg is None:
            self._async_pg = dist.new_group(backend="gloo")
        return self._async_pg

    def maybe_resume(self) -> None:
        """Resume from checkpoint.resume_from: 'auto' takes the newest checkpoint of this run that
        passes verification (weights/checksums.py), marking each newer one that fails and saying
        so; a checkpoint named by the user is verified and refused, never swapped for another."""
        from gptrain.weights.checksums import VerificationError

        where = self.cfg.checkpoint.resume_from
        if where == "none":
            return
        if where != "auto":
            self._resume(layout.resolve(where))  # a directory (names were resolved by jobs/api.model_source)
            return
        if self.cfg.checkpoint.remote:
            self._fetch_remote(layout.find_latest(self.out))
        refused = []
        for path in layout.resume_order(self.out):
            try:
                self._resume(path)
            except VerificationError as e:
                refused.append(path.name)
                self.log_main(f"warning: {e}; passed by (a resume tries the checkpoint before it)")
                if self.env.is_main:
                    layout.mark_damaged(path, e.why)
                continue
            if refused:
                self.log_main(f"checkpoint {', '.join(refused)} failed verification: resumed from "
                              f"{path.name} instead (the steps after it are trained again)")
            return
        # checkpoints an earlier attempt marked damaged are not tried again, and they are no reason
        # to start over on top of them either (a second attempt trained from step 0 and overwrote them)
        gone = layout.gone_latest(self.out)
        if gone and not refused:  # (every step folder removed: `latest` still names the newest)
            raise UserError(f"checkpoints/latest in {self.out} names {gone}, which is gone, and no other checkpoint "
                            "is there: the run would start over; --checkpoint.resume_from=none starts it again")
        refused = refused or [p.name for p in layout.complete(layout.root_of(self.out)) if layout.damaged(p)]
        if refused:
            raise UserError(f"no checkpoint of {self.out} passes verification ({', '.join(refused)} "
                            "damaged; see `gptrain checkpoints NAME --verify`): resume from another "
                            "with --checkpoint.resume_from, or start again with --checkpoint.resume_from=none")

    def _resume(self, path) -> None:
        state = layout.read_state(path)
        theirs = state.get("lora_base")
        if (theirs or {}).get("sha256") != (self.lora_base or {}).get("sha256"):
            raise UserError(f"checkpoint {path} " + (
                f"holds LoRA adapters for the base {theirs.get('init_from')}, not this run's weights" if theirs
                else "holds a whole model and this run trains adapters over referenced weights")
                + "; start from it with --model.init_from, or resume with the same base")
        ckpt.load_training_tensors(path, self.parts, self.optims, adapters_only=theirs is not None)
        self.step = state["step"]
        self.last.update(train_loss=state.get("train_loss"), eval_loss=state.get("eval_loss"),
                         eval_step=state.get("eval_step"))
        try:
            self.loader.load_state_dict(state["loader"])
        except ValueError:
            self.log_main("warning: the dataset, block size or data.packing changed; the data order restarts")
        if getattr(self.loader, "resume_note", None):
            self.log_main(self.loader.resume_note)
        if state.get("world_size") == self.env.world:
            ckpt.load_rng(path)
        if self.scaler and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.log_main(f"resumed from {path} at step {self.step}")

    def _fetch_remote(self, local: Path | None) -> None:
        """The newest checkpoint, fetched from checkpoint.remote first when it is newer than
        the local one (rank 0 downloads into the output directory, which all ranks share)."""
        from gptrain.train import remote

        if self.env.is_main:
            remote.fetch_newest(self.cfg.checkpoint.remote, self.out, local, self.log_main)
        if dist.is_initialized():
            dist.barrier()
