"""A real TRL ``GRPOTrainer`` (or ``RLOOTrainer``) run with ``RlpulseCallback``, on the CPU.

Run under ``torchrun --nproc_per_node N`` (gloo). The model is a 2-layer Qwen2 with hidden
size 32 and random weights, the tokenizer a word-level one over ``w0`` .. ``w60``: both are
built here and saved to ``--output-dir`` (TRL loads its reference model from the policy's
path; the tokenizer object is passed as it is), nothing is downloaded. The reward function
scores this process's completions and writes what it returned, one JSON line per call, to
``rewards-rank<N>.jsonl`` (the step being trained, the pid, the rewards, the completion
lengths): the test's own record of the values each rank computed. It leaves the first
completion of every call unscored (None), so TRL logs its "All reward functions returned
None" warning (rank 0's only: TRL logs through accelerate's main-process logger). Each
rank then logs ``--after-training`` as a transformers warning and writes ``rank<N>.json``
(its pid, the loggers still holding rlpulse's handler).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

from rlpulse.producers import Settings
from rlpulse.producers.integrations.hf import LOGGERS, RlpulseCallback

WORDS = ["<pad>", "<eos>", "<unk>", *(f"w{i}" for i in range(61))]


def tiny_model(directory: Path) -> tuple[str, PreTrainedTokenizerFast]:
    """Build and save the random model (and tokenizer); return its folder and the tokenizer."""
    vocabulary = {word: index for index, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(WORDS),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--run-id", required=True)
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument("--trainer", choices=["grpo", "rloo"], default="grpo")
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--after-training", default="train() returned", help="logged then")
    options = parser.parse_args()
    rank = int(os.environ["RANK"])
    output: Path = options.output_dir
    model, tokenizer = tiny_model(output / f"model-rank{rank}")
    record = output / f"rewards-rank{rank}.jsonl"

    def reward(
        completions: list[Any], completion_ids: list[list[int]], trainer_state: Any, **_: Any
    ) -> list[float | None]:
        """Rank-dependent: ``rank + 1 + 0.01 * length``; the first completion unscored."""
        scores: list[float | None] = [rank + 1 + 0.01 * len(ids) for ids in completion_ids]
        scores[0] = None
        line = {
            "step": int(trainer_state.global_step) + 1,
            "pid": os.getpid(),
            "rewards": scores,
            "lengths": [len(ids) for ids in completion_ids],
        }
        with record.open("a") as file:
            file.write(json.dumps(line) + "\n")
        return scores

    common: dict[str, Any] = {
        "output_dir": str(output / "trainer"),
        "max_steps": options.max_steps,
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        "beta": 0.1,
        "learning_rate": 1e-2,
        "logging_steps": 1,
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "ddp_backend": "gloo",
        "save_strategy": "no",
        "disable_tqdm": True,
        "log_level": "info",
        "log_level_replica": "info",
        "dataloader_num_workers": 0,
        "seed": 0,
    }
    prompts = [" ".join(f"w{(i * 7 + j) % 61}" for j in range(4)) for i in range(64)]
    sources = ["arith" if i % 2 else "words" for i in range(64)]
    data = Dataset.from_dict({"prompt": prompts, "data_source": sources})
    callback = RlpulseCallback(
        options.run_id, settings=Settings(bootstrap=options.bootstrap, prefix=options.prefix)
    )
    if options.trainer == "grpo":
        trainer: GRPOTrainer | RLOOTrainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=GRPOConfig(**common),
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[callback],
        )
    else:
        trainer = RLOOTrainer(
            model=model,
            reward_funcs=reward,
            args=RLOOConfig(**common),
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[callback],
        )
    trainer.train()
    # The link closed at the end of train(): the handler takes itself off the loggers.
    logging.getLogger("transformers.trainer").warning(options.after_training)
    report = {
        "rank": rank,
        "pid": os.getpid(),
        "hooked": callback.trl is not None,
        "handlers_left": [
            name for name in LOGGERS if callback.log_handler in logging.getLogger(name).handlers
        ],
    }
    (output / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
