"""docs/watching.md documents every metric the exporter serves and every alert rule."""

from __future__ import annotations

from pathlib import Path

import yaml

from rlpulse.streams.exporter.collector import FAMILIES

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "watching.md").read_text()


def test_every_exporter_metric_is_in_the_guide_with_its_type_and_labels() -> None:
    rows = {
        line.split("|")[1].strip().strip("`"): line
        for line in GUIDE.splitlines()
        if "| `rl" in line
    }
    for family in FAMILIES.values():
        assert family.name in rows, f"{family.name} is not documented in docs/watching.md"
        cells = [cell.strip() for cell in rows[family.name].split("|")]
        assert cells[2] == family.kind, family.name
        assert cells[3] == (", ".join(family.labels) or "—"), family.name


def test_every_alert_rule_is_in_the_guide() -> None:
    rules = yaml.safe_load((ROOT / "compose" / "prometheus" / "alerts.yml").read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert f"`{rule['alert']}`" in GUIDE, rule["alert"]
