"""The committed Grafana dashboard is what compose/grafana/build_dashboard.py builds."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "compose" / "grafana" / "build_dashboard.py"
DASHBOARD = ROOT / "compose" / "grafana" / "dashboards" / "rlpulse.json"


def builder() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dashboard", BUILDER)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def committed() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_the_committed_json_is_a_fresh_build() -> None:
    assert DASHBOARD.read_text() == builder().render(), (
        "compose/grafana/dashboards/rlpulse.json is stale: "
        "run `python compose/grafana/build_dashboard.py`"
    )


def test_it_has_the_variables_the_panels_use() -> None:
    model = committed()
    names = {v["name"] for v in model["templating"]["list"]}
    assert names == {"datasource", "namespace", "run", "stage", "search", "index_prefix"}
    used = set()
    for panel in model["panels"]:
        for target in panel.get("targets", []):
            used |= set(re.findall(r"\$\{?(\w+)", target["expr"]))
    assert used - {"__rate_interval"} <= names


def test_commands_are_annotations_and_pipeline_health_is_a_row() -> None:
    model = committed()
    commands = next(a for a in model["annotations"]["list"] if a["name"] == "Commands")
    assert "rlpulse_run_last_command_timestamp_seconds" in commands["expr"]
    assert commands["useValueForTime"] is True
    rows = [p["title"] for p in model["panels"] if p["type"] == "row"]
    assert rows == ["Training", "Run", "Pipeline health"]
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))


def test_per_step_panels_link_a_point_to_its_step_s_logs() -> None:
    """Each per-step series panel joins the step with its series and links to that step."""
    panels = {panel["id"]: panel for panel in committed()["panels"]}
    for panel_id in builder().DRILL_DOWN_PANELS:
        panel = panels[panel_id]
        assert panel["type"] == "timeseries"
        (step,) = [t for t in panel["targets"] if t["refId"] == "S"]
        assert step["legendFormat"] == "step" and "rlpulse_run_step" in step["expr"]
        assert {"id": "joinByField", "options": {"mode": "outer"}} in panel["transformations"]
        logs, steps = panel["fieldConfig"]["defaults"]["links"]
        assert "index:'${index_prefix}-logs'" in logs["url"]
        assert "index:'${index_prefix}-steps'" in steps["url"]
        for link in (logs, steps):
            assert link["url"].startswith("${search}/app/discover#/")
            assert "step:${__data.fields.step}" in link["url"]
            assert "run_id:%22${run:percentencode}%22" in link["url"]
        assert "rlpulse show ${run} --step ${__data.fields.step}" in steps["title"]
