"""Build the rlpulse Grafana dashboard (compose/grafana/dashboards/rlpulse.json) from code.

Typed builders from grafana-foundation-sdk (a dev dependency, pinned in pyproject.toml; it is
needed only to regenerate the JSON, never at run time):

    python compose/grafana/build_dashboard.py        # rewrites dashboards/rlpulse.json

tests/unit/test_dashboard.py fails when the committed JSON differs from a fresh build, and
tests/integration/test_dashboard_prometheus.py runs every panel's PromQL against a real
Prometheus. Variables: ``$datasource``, ``$namespace`` (the exporter's ``--namespace``,
default ``verl`` as in the compose stack), ``$run`` (one run) and ``$stage`` (any of its
stages); ``$search`` (OpenSearch Dashboards' or Kibana's address) and ``$index_prefix``
(``rlpulse index``'s) for the drill-down links.

Drill-down: each panel of per-step metrics has a hidden query ``S``, the run's step, joined
with its other series by time, so that a point's row holds the step it shows
(``${__data.fields.step}``); its data links open Discover on that run's and step's log
records (index pattern ``<index_prefix>-logs``) and step summary (``<index_prefix>-steps``),
and name the terminal's equivalent, ``rlpulse show RUN --step N``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import bargauge, heatmap, stat, timeseries
from grafana_foundation_sdk.builders.common import VizLegendOptions
from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery,
    Dashboard,
    DatasourceVariable,
    QueryVariable,
    Row,
    TextBoxVariable,
)
from grafana_foundation_sdk.builders.prometheus import Dataquery
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    AxisPlacement,
    GraphDrawStyle,
    LegendDisplayMode,
    LegendPlacement,
    VisibilityMode,
)
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DataTransformerConfig,
    DynamicConfigValue,
    GridPos,
    VariableRefresh,
    VariableSort,
)

OUTPUT = Path(__file__).resolve().parent / "dashboards" / "rlpulse.json"
PROMETHEUS = DataSourceRef(type_val="prometheus", uid="${datasource}")
RUN = 'run=~"$run"'
SEL = 'run=~"$run", stage=~"$stage"'
SIGMA = 3
STEP_REF = "S"
STEP_FIELD = "step"
DRILL_DOWN_PANELS = (2, 3, 5, 7, 8)
"""The time-series panels of per-step metrics: each gets the step query and the links."""
DISCOVER = (
    "${search}/app/discover#/?_g=(time:(from:'${__from:date:iso}',to:'${__to:date:iso}'))"
    "&_a=(index:'${index_prefix}-%s',query:(language:lucene,"
    "query:'run_id:%%22${run:percentencode}%%22%%20AND%%20step:${__data.fields.step}'))"
)
"""Discover (OpenSearch Dashboards, Kibana) on one index pattern: the run's records at the step."""
DRILL_DOWN_LINKS = [
    {
        "title": "Logs of run ${run} at step ${__data.fields.step}",
        "url": DISCOVER % "logs",
        "targetBlank": True,
    },
    {
        "title": "Step summary (in a terminal: rlpulse show ${run} --step ${__data.fields.step})",
        "url": DISCOVER % "steps",
        "targetBlank": True,
    },
]


def query(ref: str, expr: str, legend: str) -> Dataquery:
    """One PromQL target."""
    return Dataquery().ref_id(ref).expr(expr).legend_format(legend).range()


def legend() -> VizLegendOptions:
    """A table legend below the graph with the last and the largest value."""
    return (
        VizLegendOptions()
        .show_legend(True)
        .display_mode(LegendDisplayMode.TABLE)
        .placement(LegendPlacement.BOTTOM)
        .calcs(["lastNotNull", "max"])
    )


def series_panel(
    panel_id: int, title: str, where: GridPos, *targets: Dataquery, unit: str = "short"
) -> timeseries.Panel:
    """A time-series panel over the Prometheus data source."""
    panel = (
        timeseries.Panel()
        .id(panel_id)
        .title(title)
        .datasource(PROMETHEUS)
        .grid_pos(where)
        .unit(unit)
        .legend(legend())
        .line_width(2)
        .fill_opacity(0)
    )
    for target in targets:
        panel = panel.with_target(target)
    return panel


def right_axis(label: str, unit: str) -> list[DynamicConfigValue]:
    """Field overrides that put a query's series on a second Y axis."""
    return [
        DynamicConfigValue(id_val="custom.axisPlacement", value=AxisPlacement.RIGHT),
        DynamicConfigValue(id_val="custom.axisLabel", value=label),
        DynamicConfigValue(id_val="unit", value=unit),
    ]


def with_step(panel: timeseries.Panel) -> timeseries.Panel:
    """Add the hidden step query, joined by time with the panel's series (see the docstring)."""
    hidden = {"legend": True, "tooltip": True, "viz": True}
    step = f'max by (run) (rlpulse_run_step{{{SEL}, stage!="system"}})'
    return (
        panel.with_target(query(STEP_REF, step, STEP_FIELD))
        .override_by_query(STEP_REF, [DynamicConfigValue(id_val="custom.hideFrom", value=hidden)])
        .with_transformation(DataTransformerConfig(id_val="joinByField", options={"mode": "outer"}))
    )


def training_panels() -> list[Any]:
    """The seed's panels: reward, reward vs KL, KL per rank, losses, CPU vs throughput."""
    stat_of = 'rlpulse_step_{stat}{{{sel}, metric="{metric}"}}'
    reward = stat_of.format(stat="mean", sel=SEL, metric="reward_mean")
    reward_std = stat_of.format(stat="std", sel=SEL, metric="reward_mean")
    kl = stat_of.format(stat="mean", sel=SEL, metric="kl_divergence")
    losses = f'rlpulse_step_mean{{{SEL}, metric=~"actor_loss|critic_loss"}}'
    zscores = f'rlpulse_step_zscore{{{SEL}, metric=~"actor_loss|critic_loss"}}'
    band = [
        DynamicConfigValue(id_val="custom.lineWidth", value=0),
        DynamicConfigValue(id_val="custom.fillOpacity", value=20),
        DynamicConfigValue(
            id_val="custom.hideFrom", value={"legend": True, "tooltip": False, "viz": False}
        ),
    ]
    reward_panel = (
        series_panel(
            2,
            "Reward: mean over ranks, ±1 std band",
            GridPos(h=9, w=12, x=0, y=1),
            query("A", reward, "mean {{stage}}"),
            query("B", f"{reward} + {reward_std}", "+1 std"),
            query("C", f"{reward} - {reward_std}", "-1 std"),
        )
        .override_by_query(
            "B", [*band, DynamicConfigValue(id_val="custom.fillBelowTo", value="-1 std")]
        )
        .override_by_query("C", band)
    )
    reward_kl = series_panel(
        3,
        "Reward (left) and KL divergence (right)",
        GridPos(h=9, w=12, x=12, y=1),
        query("A", reward, "reward {{stage}}"),
        query("B", kl, "KL {{stage}}"),
    ).override_by_query("B", right_axis("KL divergence", "short"))
    kl_heatmap = (
        heatmap.Panel()
        .id(4)
        .title("KL divergence per rank (drift heatmap)")
        .datasource(PROMETHEUS)
        .grid_pos(GridPos(h=9, w=12, x=0, y=10))
        .with_target(
            query("A", f"max by (rank) (${{namespace}}_kl_divergence{{{SEL}}})", "{{rank}}")
        )
        .calculate(False)
        .show_value(VisibilityMode.NEVER)
    )
    loss_panel = series_panel(
        5,
        f"Actor and critic loss (red: more than {SIGMA} std from the mean of the recent steps)",
        GridPos(h=9, w=12, x=12, y=10),
        query("A", stat_of.format(stat="mean", sel=SEL, metric="actor_loss"), "actor loss"),
        query("B", stat_of.format(stat="mean", sel=SEL, metric="critic_loss"), "critic loss"),
        query(
            "C",
            f"{losses} and on (run, stage, metric) abs({zscores}) > {SIGMA}",
            f"> {SIGMA} std: {{{{metric}}}}",
        ),
    ).override_by_query(
        "C",
        [
            DynamicConfigValue(id_val="custom.drawStyle", value=GraphDrawStyle.POINTS),
            DynamicConfigValue(id_val="custom.pointSize", value=10),
            DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": "red"}),
        ],
    )
    cpu = series_panel(
        6,
        "Process CPU (cores, left) against throughput (tokens/s, right), per rank",
        GridPos(h=9, w=12, x=0, y=19),
        query(
            "A",
            "sum by (rank) "
            f"(rate(${{namespace}}_process_cpu_seconds_total{{{RUN}}}[$__rate_interval]))",
            "CPU rank {{rank}}",
        ),
        query(
            "B",
            f"sum by (rank) (${{namespace}}_throughput_tokens_per_sec{{{SEL}}})",
            "tokens/s rank {{rank}}",
        ),
    ).override_by_query("B", right_axis("tokens/s", "short"))
    throughput = series_panel(
        7,
        "Training throughput, all ranks (tokens/s)",
        GridPos(h=9, w=6, x=12, y=19),
        query("A", f"sum by (run) (${{namespace}}_throughput_tokens_per_sec{{{SEL}}})", "{{run}}"),
    )
    reward_ranks = series_panel(
        8,
        "Reward per rank",
        GridPos(h=9, w=6, x=18, y=19),
        query("A", f"${{namespace}}_reward_mean{{{SEL}}}", "rank {{rank}}"),
    )
    return [
        with_step(reward_panel),
        with_step(reward_kl),
        kl_heatmap,
        with_step(loss_panel),
        cpu,
        with_step(throughput),
        with_step(reward_ranks),
    ]


def run_panels() -> list[Any]:
    """The run's state: step, ranks, silence, stop, commands and alerts."""
    step = (
        stat.Panel()
        .id(10)
        .title("Step")
        .datasource(PROMETHEUS)
        .grid_pos(GridPos(h=5, w=4, x=0, y=29))
        .with_target(query("A", f"max by (stage) (rlpulse_run_step{{{SEL}}})", "{{stage}}"))
    )
    silence = (
        stat.Panel()
        .id(11)
        .title("Since the last event")
        .datasource(PROMETHEUS)
        .grid_pos(GridPos(h=5, w=4, x=4, y=29))
        .unit("s")
        .with_target(
            query(
                "A",
                f"time() - max by (run) (rlpulse_run_last_event_timestamp_seconds{{{RUN}}})",
                "{{run}}",
            )
        )
    )
    stopped = (
        stat.Panel()
        .id(12)
        .title("Stopped by")
        .datasource(PROMETHEUS)
        .grid_pos(GridPos(h=5, w=4, x=8, y=29))
        .with_target(query("A", f"max by (rule) (rlpulse_run_stopped{{{RUN}}})", "{{rule}}"))
    )
    ranks = series_panel(
        13,
        "Ranks missing and stragglers",
        GridPos(h=5, w=12, x=12, y=29),
        query("A", f"max by (stage) (rlpulse_step_ranks_missing{{{SEL}}})", "missing {{stage}}"),
        query("B", f"max by (stage) (rlpulse_step_stragglers{{{SEL}}})", "stragglers {{stage}}"),
    )
    alerts = (
        bargauge.Panel()
        .id(14)
        .title("Alert statistics: commands issued, alerts firing, notifications, error records")
        .datasource(PROMETHEUS)
        .grid_pos(GridPos(h=7, w=24, x=0, y=34))
        .with_target(
            query(
                "A",
                f'sum by (rule, action) (rlpulse_run_commands_total{{{RUN}, dry_run="false"}})',
                "{{rule}}: {{action}}",
            )
        )
        .with_target(
            query(
                "B",
                f'count by (alertname) (ALERTS{{alertstate="firing", {RUN}}})',
                "firing: {{alertname}}",
            )
        )
        .with_target(
            query(
                "C",
                "sum by (outcome) (rlpulse_exporter_notifications_total)",
                "notifications {{outcome}}",
            )
        )
        .with_target(
            query(
                "D",
                "sum by (level) "
                f'(rlpulse_host_log_records_total{{{RUN}, level=~"ERROR|CRITICAL"}})',
                "{{level}} records",
            )
        )
    )
    return [step, silence, stopped, ranks, alerts]


def pipeline_panels() -> list[Any]:
    """Pipeline health: traffic per node, consumer lag, dead letters, the exporter itself."""
    rate = "[$__rate_interval]"
    return [
        series_panel(
            21,
            "Traffic per host: events and log records per second",
            GridPos(h=8, w=12, x=0, y=42),
            query(
                "A",
                f"sum by (host) (rate(rlpulse_host_events_total{{{RUN}}}{rate}))",
                "events {{host}}",
            ),
            query(
                "B",
                f"sum by (host) (rate(rlpulse_host_log_records_total{{{RUN}}}{rate}))",
                "log records {{host}}",
            ),
        ),
        series_panel(
            22,
            "Consumer lag (messages)",
            GridPos(h=8, w=12, x=12, y=42),
            query(
                "A",
                "sum by (group, topic, partition) (rlpulse_consumer_lag_messages)",
                "{{group}} {{topic}}/{{partition}}",
            ),
        ),
        series_panel(
            23,
            "Dead letters by reason (messages/s)",
            GridPos(h=8, w=8, x=0, y=50),
            query("A", f"sum by (reason) (rate(rlpulse_dlq_messages_total{rate}))", "{{reason}}"),
        ),
        series_panel(
            24,
            "Scrape targets up",
            GridPos(h=8, w=8, x=8, y=50),
            query("A", 'up{job=~"rlpulse-.*"}', "{{job}} {{instance}}"),
        ),
        series_panel(
            25,
            "Exporter: series held, samples dropped (per second)",
            GridPos(h=8, w=8, x=16, y=50),
            query("A", "sum(rlpulse_exporter_series)", "series held"),
            query(
                "B",
                f"sum by (reason) (rate(rlpulse_exporter_dropped_samples_total{rate}))",
                "dropped: {{reason}}",
            ),
        ),
    ]


def variables() -> list[Any]:
    """$datasource, $namespace, $run (one), $stage (any of the run's), $search, $index_prefix."""
    return [
        DatasourceVariable("datasource").label("Data source").type("prometheus"),
        TextBoxVariable("namespace").label("Namespace").default_value("verl"),
        QueryVariable("run")
        .label("Run")
        .datasource(PROMETHEUS)
        .query("label_values(rlpulse_run_attempt, run)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC),
        QueryVariable("stage")
        .label("Stage")
        .datasource(PROMETHEUS)
        .query(f"label_values(rlpulse_run_step{{{RUN}}}, stage)")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(".*"),
        TextBoxVariable("search")
        .label("Log search (OpenSearch Dashboards, Kibana)")
        .default_value("http://localhost:5601"),
        TextBoxVariable("index_prefix").label("Index prefix").default_value("rlpulse"),
    ]


def build() -> Dashboard:
    """The dashboard, as a builder."""
    dashboard = (
        Dashboard("rlpulse: training run")
        .uid("rlpulse-run")
        .tags(["rlpulse"])
        .refresh("10s")
        .time("now-1h", "now")
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .annotation(
            AnnotationQuery()
            .name("Commands")
            .datasource(PROMETHEUS)
            .enable(True)
            .icon_color("orange")
            .expr(f'rlpulse_run_last_command_timestamp_seconds{{{RUN}, dry_run="false"}} * 1000')
        )
        .annotation(
            AnnotationQuery()
            .name("Alerts")
            .datasource(PROMETHEUS)
            .enable(True)
            .icon_color("red")
            .expr(f'ALERTS{{alertstate="firing", {RUN}}}')
        )
    )
    for variable in variables():
        dashboard = dashboard.with_variable(variable)
    rows = [
        (Row("Training").id(1).grid_pos(GridPos(h=1, w=24, x=0, y=0)), training_panels()),
        (Row("Run").id(9).grid_pos(GridPos(h=1, w=24, x=0, y=28)), run_panels()),
        (Row("Pipeline health").id(20).grid_pos(GridPos(h=1, w=24, x=0, y=41)), pipeline_panels()),
    ]
    for row, panels in rows:
        dashboard = dashboard.with_row(row)
        for panel in panels:
            dashboard = dashboard.with_panel(panel)
    return dashboard


# What the typed AnnotationQuery model has no field for (Prometheus annotation options).
ANNOTATION_OPTIONS = {
    "Commands": {
        "titleFormat": "{{rule}}: {{actions}}",
        "tagKeys": "run,rule",
        "textFormat": "command for run {{run}}",
        "useValueForTime": True,
        "step": "10s",
    },
    "Alerts": {
        "titleFormat": "{{alertname}}",
        "tagKeys": "run,severity",
        "useValueForTime": False,
        "step": "10s",
    },
}


def dashboard_json() -> dict[str, Any]:
    """The dashboard as Grafana's JSON model."""
    model: dict[str, Any] = json.loads(JSONEncoder().encode(build().build()))
    for annotation in model["annotations"]["list"]:
        annotation.update(ANNOTATION_OPTIONS.get(annotation["name"], {}))
    for panel in model["panels"]:
        if panel["id"] in DRILL_DOWN_PANELS:
            panel["fieldConfig"]["defaults"]["links"] = DRILL_DOWN_LINKS
    return model


def render() -> str:
    """The file's text: sorted keys, two-space indents, a final newline."""
    return json.dumps(dashboard_json(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUTPUT.write_text(render())
    sys.stdout.write(f"wrote {OUTPUT}\n")
