"""Errors raised by ``rlpulse.producers``.

Transport trouble (broker down, local queue full) is never raised from ``log()``;
these errors are for mistakes of the caller: a wrong value, a bad client setting,
or use after ``close()``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlpulse.exceptions import RlpulseError


class ProducerError(RlpulseError):
    """Root of the errors raised by ``rlpulse.producers``."""


class InvalidFieldError(ProducerError, TypeError):
    """A value of the wrong type, such as a non-numeric metric; names the field and key."""

    def __init__(self, field: str, key: str | None, value: object, expected: str) -> None:
        where = field if key is None else f"{field}[{key!r}]"
        super().__init__(f"{where} is {type(value).__name__} ({value!r:.80}); expected {expected}")
        self.field = field
        self.key = key
        self.value = value
        self.expected = expected


class InvalidValueError(ProducerError, ValueError):
    """A value of the right type that is not allowed; lists the valid choices when there are."""

    def __init__(self, field: str, value: object, choices: Sequence[str] | str) -> None:
        wanted = choices if isinstance(choices, str) else "one of " + ", ".join(map(repr, choices))
        super().__init__(f"{field}={value!r} is not allowed; expected {wanted}")
        self.field = field
        self.value = value
        self.choices = choices


class RefusedSourceError(ProducerError, ValueError):
    """A logger whose run id, attempt or tags the worker would refuse in every event."""


class ProducerClosedError(ProducerError, RuntimeError):
    """A logger, control client or run link was used after ``close()``."""


EXIT_STOPPED_BY_RULE = 0
"""Exit status of a trainer process that a ``stop`` command ended: 0, on purpose.

A stopped run must not be started again by whatever supervises it, and 0 is the only
status that no common launcher retries by default: torchrun (torchelastic) restarts
the whole worker group on any non-zero exit while ``--max-restarts`` allows;
Kubernetes Jobs retry non-zero exits up to ``backoffLimit``; Ray Train's
``max_failures`` and SkyPilot's ``max_restarts_on_errors`` retry failures; Slurm
requeues on exit status only for the codes a site lists in ``RequeueExit``. A
distinctive non-zero code would be safe only where someone configured it (a
Kubernetes ``podFailurePolicy`` rule, Kubeflow's ``ExitCode`` restart policy, which
treats 1-127 as permanent). How the run ended is recorded elsewhere: the ``applied``
ack of the stop command on the acks topic (with ``stopped_at_step``), and the
:class:`StopRequested` a program can catch. Sites that want a distinct status pass
``exit_code=`` to ``RunLink.exit_if_stopped``.
"""


class StopRequested(SystemExit):
    """A ``stop`` command ended the run; uncaught, it exits with :data:`EXIT_STOPPED_BY_RULE`.

    A ``SystemExit``, not an error: ``except Exception`` in a training loop does not
    swallow it, ``atexit`` handlers run, and the interpreter exits with ``code``.
    """

    def __init__(self, command_id: str, reason: str, exit_code: int = EXIT_STOPPED_BY_RULE) -> None:
        super().__init__(exit_code)
        self.command_id = command_id
        self.reason = reason

    def __str__(self) -> str:
        return f"run stopped by command {self.command_id}: {self.reason}"
