"""rlpulse inside training frameworks: verl, Hugging Face ``Trainer`` (and TRL), torch.distributed.

Each integration is its own module and imports its framework only when used, so
importing this package (or :mod:`rlpulse.producers`) imports none of them:

- :mod:`~rlpulse.producers.integrations.verl`: a verl ``Tracking`` backend selected by
  ``trainer.logger=['console','rlpulse']``, its launcher, and verl's trainer as the
  target of ``stop``, ``checkpoint`` and ``scale_rollout_batch``;
- :mod:`~rlpulse.producers.integrations.hf`: ``RlpulseCallback``, a
  ``transformers.TrainerCallback`` (TRL's trainers are ``Trainer`` subclasses);
- :mod:`~rlpulse.producers.integrations.trl_ranks`: each rank's own values of the metrics
  TRL's GRPO and RLOO trainers reduce across processes (hooked by ``RlpulseCallback``);
- :mod:`~rlpulse.producers.integrations.torch_dist`: the ``torch.distributed`` broadcast
  that hands rank 0's commands to every rank;
- :mod:`~rlpulse.producers.integrations.commands`: applying a command's actions in a
  trainer and the batch-size arithmetic, shared by the integrations.
"""

__all__: list[str] = []
