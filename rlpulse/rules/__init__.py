"""Declarative rules over step summaries: DSL models, loader, presets and the pure evaluator."""

# `rules/` at the repository root is a link to this folder (docs/design.md, "Layout"):
# importing it as `rules` would load every file a second time, under another name.
if __name__ != "rlpulse.rules":
    raise ImportError(f"import rlpulse.rules, not {__name__}: rules/ is a link to it")


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
