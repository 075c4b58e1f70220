"""Weights on disk, below models/, train/ and jobs/ (none of which it imports): names.py (what a
file name says), layout.py (gptrain's step-N/ checkpoints), dcp.py (their tensors, read safely),
hf.py (HF model dirs, Trainer checkpoint-N, trainer_state.json), kinds.py (what kind a path is),
scan.py (checkpoints found in a folder, and the newest)."""
