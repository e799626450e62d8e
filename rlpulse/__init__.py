"""rlpulse: telemetry and closed-loop control for LLM reinforcement-learning post-training.

Subpackages: ``rlpulse.schemas`` (wire contracts and codec), ``rlpulse.producers``
(trainer side), ``rlpulse.rules`` (rule language and evaluator), ``rlpulse.streams``
(the worker). This module imports none of them, so ``import rlpulse.producers``
stays light, and it leaves the program's logging alone: rlpulse's own stderr handler
(:mod:`rlpulse.diagnostics`) is installed when a ``RunLink``, ``EventLogger``,
``EventHandler`` or the CLI is built.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
