"""Errors raised by ``rlpulse.rules``."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rlpulse.exceptions import RlpulseError


class RulesError(RlpulseError):
    """Root of the errors raised by ``rlpulse.rules``."""


@dataclass(frozen=True)
class RuleProblem:
    """One thing wrong with a rules file, at a 1-based line and column."""

    file: str
    line: int
    column: int
    rule_id: str | None
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}:"
        if self.rule_id is None:
            return f"{where} {self.message}"
        return f"{where} [{self.rule_id}] {self.message}"


class RulesFileError(RulesError, ValueError):
    """A rules file that was refused; ``problems`` lists everything wrong with it."""

    def __init__(self, problems: Iterable[RuleProblem]) -> None:
        self.problems: list[RuleProblem] = list(problems)
        super().__init__(self.problems)

    def __str__(self) -> str:
        return "\n".join(str(problem) for problem in self.problems)


class PresetNotFoundError(RulesError, LookupError):
    """No preset of that name ships with rlpulse; ``available`` lists the ones that do."""

    def __init__(self, name: str, available: Iterable[str]) -> None:
        self.name = name
        self.available: list[str] = sorted(available)
        super().__init__(f"unknown preset {name!r}; available: {', '.join(self.available)}")


class RuleStateError(RulesError, ValueError):
    """Evaluator state that is malformed or belongs to another run attempt."""
