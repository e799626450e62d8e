"""A real ``transformers.Trainer`` run with ``RlpulseCallback``, ended by a command (or max steps).

Run as one process (``python train_until_stopped.py ...``) or under ``torchrun
--nproc_per_node N`` (gloo, CPU). The model is a 2-layer GPT-2 built from a config with
random weights, the data random tokens: nothing is downloaded. Each rank writes
``rank<N>.json`` to ``--output-dir`` after ``train()`` (the step it stopped at, the
command that stopped it, the checkpoints present), then calls
``callback.exit_if_stopped()``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from rlpulse.producers import Settings
from rlpulse.producers.integrations.hf import RlpulseCallback

SEQUENCE = 16
VOCAB = 64


def random_tokens(size: int) -> list[dict[str, torch.Tensor]]:
    """``size`` sequences of random token ids, each its own label."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, VOCAB, (size, SEQUENCE), generator=generator)
    return [{"input_ids": row, "labels": row} for row in tokens]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=5000)
    parser.add_argument("--save-steps", type=int, default=0, help="0: only commands save")
    parser.add_argument("--resume", action="store_true", help="from the last checkpoint")
    options = parser.parse_args()

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=VOCAB, n_positions=SEQUENCE)
    )
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    args = TrainingArguments(
        output_dir=str(options.output_dir),
        max_steps=options.max_steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        save_strategy="steps" if options.save_steps else "no",
        save_steps=options.save_steps or 500,
        report_to="none",
        use_cpu=True,
        ddp_backend="gloo" if distributed else None,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    callback = RlpulseCallback(
        options.run_id,
        settings=Settings(bootstrap=options.bootstrap, prefix=options.prefix),
    )
    trainer = Trainer(
        model=model, args=args, train_dataset=random_tokens(4096), callbacks=[callback]
    )
    trainer.train(resume_from_checkpoint=True if options.resume else None)

    rank = int(args.process_index)
    stopped_by = callback.stopped_by
    report = {
        "rank": rank,
        "world_size": int(args.world_size),
        "global_step": int(trainer.state.global_step),
        "stopped_by": None if stopped_by is None else stopped_by["command_id"],
        "checkpoints": sorted(p.name for p in options.output_dir.glob("checkpoint-*")),
        "attempt": None if callback.link is None else callback.link.attempt,
    }
    (options.output_dir / f"rank{rank}.json").write_text(json.dumps(report))
    callback.exit_if_stopped()


if __name__ == "__main__":
    main()
