"""Declarative rules over step summaries: DSL models, loader, presets and the pure evaluator."""

from rlpulse.rules.evaluator import RuleEngine
from rlpulse.rules.exceptions import RuleProblem, RulesError, RulesFileError
from rlpulse.rules.loader import load_preset, load_rules, load_rules_source, parse_rules
from rlpulse.rules.model import Rule, RuleSet

__all__ = [
    "Rule",
    "RuleEngine",
    "RuleProblem",
    "RuleSet",
    "RulesError",
    "RulesFileError",
    "load_preset",
    "load_rules",
    "load_rules_source",
    "parse_rules",
]
