"""rlpulse: telemetry and closed-loop control for LLM reinforcement-learning post-training.

Subpackages: ``rlpulse.schemas`` (wire contracts and codec), ``rlpulse.producers``
(trainer side), ``rlpulse.rules`` (rule language and evaluator), ``rlpulse.streams``
(the worker). This module imports none of them, so ``import rlpulse.producers``
stays light. Importing it gives rlpulse's own loggers a stderr handler
(:mod:`rlpulse.oncelog`), so their warnings reach the console whatever handlers the
program has.
"""

from rlpulse.oncelog import install as _install_diagnostics

__version__ = "0.1.0"
__all__ = ["__version__"]

_install_diagnostics()
