"""PromQL as a Grafana dashboard holds it: its queries, the metric names each uses, and
the query a Prometheus server takes once Grafana's variables are filled in.

Enough of PromQL's grammar to find metric names: strings, label matchers, ranges and
grouping clauses, numbers and durations are dropped, and every remaining identifier not followed by `(` (a
function or an aggregation) nor a keyword is a metric name.
"""
from __future__ import annotations

import re
from typing import Any

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_MATCHERS = re.compile(r"\{[^}]*\}")
_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
#: Numbers and durations (`0.99`, `5m`, `1e3`): not names.
_NUMBER = re.compile(r"(?<![A-Za-z0-9_:])\d[A-Za-z0-9_.]*")
_WORD = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
             "or", "unless", "offset", "inf", "nan"}
#: Grafana's `label_values(metric{matchers}, label)` variable query.
_LABEL_VALUES = re.compile(r"^label_values\((?P<series>[^,]+),\s*(?P<label>\w+)\)$")
#: Grafana's variables and what a test puts in their place.
VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$topic": ".*", "$group": ".*"}


def metric_names(expr: str) -> set[str]:
    """The metric names `expr` (PromQL, or a `label_values(...)` query) reads."""
    found = _LABEL_VALUES.match(expr.strip())
    text = found.group("series") if found else expr
    for name in VARIABLES:
        text = text.replace(name, "")
    for pattern in (_STRING, _MATCHERS, _RANGE, _GROUPING, _NUMBER):
        text = pattern.sub(" ", text)
    names = set()
    for word in _WORD.finditer(text):
        if text[word.end():].lstrip().startswith("(") or word.group().lower() in _KEYWORDS:
            continue
        names.add(word.group())
    return names


def for_prometheus(expr: str) -> str:
    """`expr` as Prometheus takes it: variables filled in; a `label_values(series, label)`
    query becomes `count by (label) (series)`."""
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    found = _LABEL_VALUES.match(expr.strip())
    if found:
        return f"count by ({found.group('label')}) ({found.group('series')})"
    return expr


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, query) of every panel target and query variable of a dashboard's JSON."""
    out: list[tuple[str, str]] = []
    panels = list(dashboard.get("panels", []))
    while panels:
        panel = panels.pop(0)
        panels.extend(panel.get("panels", []))   # a collapsed row holds its panels
        for target in panel.get("targets", []):
            out.append((f"panel {panel.get('title')!r}", str(target["expr"])))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            out.append((f"variable {var['name']!r}",
                        str(query["query"] if isinstance(query, dict) else query)))
    return out
