"""Declarative rules over step summaries: DSL models, loader, presets and the pure evaluator."""

if __name__ != "rlpulse.rules":  # the repo root's `rules` is a link to this folder; see docs/design.md
    raise ImportError(f"import rlpulse.rules, not {__name__}: `rules/` at the repository root is a "
                      "link to rlpulse/rules, never a package of its own")


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
