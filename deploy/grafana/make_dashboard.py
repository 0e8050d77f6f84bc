#!/usr/bin/env python3
"""Writes deploy/grafana/onlineps.json, the onlineps Grafana dashboard (schema 39,
Grafana 11), from the panel list below. Run it after changing a panel; the lint
(deploy/validate/grafana.mjs, tests/system/deploy_lint.sh) checks the file and that it is
this script's output. Usage: deploy/grafana/make_dashboard.py [OUT]"""
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
NS = 'namespace=~"$namespace"'

# (row title, [(panel title, unit, description, [(expr, legend)])])
ROWS = [
    ("Parameter servers", [
        ("Push and pull requests/s by op", "reqps",
         "Requests served per second, all shards, by op and result code",
         [(f'sum by (op, code) (rate(onlineps_ps_requests_total{{job="onlineps-ps", {NS}, '
           'op=~"push_dense|push_sparse|pull_dense|pull_sparse"}[$__rate_interval]))',
           "{{op}} {{code}}")]),
        ("Push and pull latency p50 / p99 by op", "s",
         "Time from decoding a request to queuing its reply, all shards",
         [(f'histogram_quantile({q}, sum by (op, le) (rate(onlineps_ps_request_duration_seconds_bucket'
           f'{{job="onlineps-ps", {NS}, op=~"push_dense|push_sparse|pull_dense|pull_sparse"}}'
           '[$__rate_interval])))', f"{{{{op}}}} p{int(q * 100)}") for q in (0.5, 0.99)]),
        ("Staleness p50 / p99 by table", "none",
         "tau = table version at apply - version the push was computed from, all shards",
         [(f'histogram_quantile({q}, sum by (table, le) (rate(onlineps_ps_push_staleness_bucket'
           f'{{job="onlineps-ps", {NS}}}[$__rate_interval])))', f"{{{{table}}}} p{int(q * 100)}")
          for q in (0.5, 0.99)]),
        ("Checkpoint age", "s",
         "Seconds since each shard's last successful checkpoint (since its start until the "
         "first); shards without periodic checkpoints are left out. Alert: "
         "OnlinepsCheckpointStale at 3 intervals",
         [(f'(time() - onlineps_ps_last_checkpoint_success_timestamp_seconds{{job="onlineps-ps", {NS}}}) '
           f'and onlineps_ps_checkpoint_interval_seconds{{job="onlineps-ps", {NS}}} > 0', "{{pod}}")]),
        ("Checkpoints by result", "short", "Checkpoints written per hour, by shard and result",
         [(f'sum by (pod, result) (increase(onlineps_ps_checkpoints_total{{job="onlineps-ps", {NS}}}[1h]))',
           "{{pod}} {{result}}")]),
        ("Rows and memory by table", "bytes", "Approximate bytes of parameters and optimizer state",
         [(f'sum by (table) (onlineps_ps_table_memory_bytes{{job="onlineps-ps", {NS}}})', "{{table}}")]),
        ("Memory budget by shard", "bytes",
         "Table state counted against --max-memory-mb, and the budget (0: none); at the budget, "
         "new sparse rows and dense tables are refused",
         [(f'sum by (pod) (onlineps_ps_memory_used_bytes{{job="onlineps-ps", {NS}}})', "{{pod}} used"),
          (f'sum by (pod) (onlineps_ps_memory_budget_bytes{{job="onlineps-ps", {NS}}})',
           "{{pod}} budget")]),
    ]),
    ("Workers", [
        ("Requests/s by op", "reqps", "infer and learn calls served, all workers",
         [(f'sum(rate(onlineps_worker_infer_requests_total{{job="onlineps-worker", {NS}}}[$__rate_interval]))',
           "infer"),
          (f'sum(rate(onlineps_worker_learn_requests_total{{job="onlineps-worker", {NS}}}[$__rate_interval]))',
           "learn"),
          (f'sum(rate(onlineps_worker_rpc_errors_total{{job="onlineps-worker", {NS}}}[$__rate_interval]))',
           "errors")]),
        ("Latency p50 / p99 by op", "s",
         "Time from a request's arrival at a worker to its reply, queueing included",
         [(f'histogram_quantile({q}, sum by (op, le) (rate(onlineps_worker_request_duration_seconds_bucket'
           f'{{job="onlineps-worker", {NS}, op=~"infer|learn"}}[$__rate_interval])))',
           f"{{{{op}}}} p{int(q * 100)}") for q in (0.5, 0.99)]),
        ("Push errors", "percentunit", "Share of each worker's pushes that failed",
         [(f'sum by (pod) (rate(onlineps_worker_push_errors_total{{job="onlineps-worker", {NS}}}[$__rate_interval])) '
           f'/ sum by (pod) (rate(onlineps_worker_pushes_total{{job="onlineps-worker", {NS}}}[$__rate_interval]))',
           "{{pod}}")]),
    ]),
    ("MCP bridge", [
        ("Tool calls/s by tool and result", "reqps", "MCP tools/call requests finished",
         [(f'sum by (tool, result) (rate(onlineps_bridge_tool_calls_total{{job="onlineps-mcp-bridge", {NS}}}'
           '[$__rate_interval]))', "{{tool}} {{result}}")]),
        ("HTTP responses/s by status", "reqps",
         "401/403: auth refused; 413: body too large; 503: connection caps",
         [(f'sum by (code) (rate(onlineps_bridge_http_responses_total{{job="onlineps-mcp-bridge", {NS}}}'
           '[$__rate_interval]))', "{{code}}")]),
        ("Tool call latency p99 by tool", "s", "Time the bridge took to answer a tool call",
         [(f'histogram_quantile(0.99, sum by (tool, le) (rate(onlineps_bridge_tool_call_duration_seconds_bucket'
           f'{{job="onlineps-mcp-bridge", {NS}}}[$__rate_interval])))', "{{tool}}")]),
        ("Workers seen by the bridge", "short", "Healthy and down workers in the bridge's pool",
         [(f'sum by (state) (onlineps_bridge_workers{{job="onlineps-mcp-bridge", {NS}}})', "{{state}}")]),
    ]),
    ("Processes", [
        ("CPU cores by pod", "short", "process_cpu_seconds_total per second",
         [(f'sum by (job, pod) (rate(process_cpu_seconds_total{{job=~"onlineps-.*", {NS}}}[$__rate_interval]))',
           "{{pod}}")]),
        ("Resident memory by pod", "bytes", "process_resident_memory_bytes",
         [(f'process_resident_memory_bytes{{job=~"onlineps-.*", {NS}}}', "{{pod}}")]),
    ]),
]


def build():
    panels, pid, y = [], 1, 0
    for row_title, row_panels in ROWS:
        panels.append({"type": "row", "id": pid, "title": row_title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y = pid + 1, y + 1
        for i, (title, unit, desc, targets) in enumerate(row_panels):
            panels.append({
                "type": "timeseries", "id": pid, "title": title, "description": desc,
                "datasource": DS,
                "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                            "tooltip": {"mode": "multi", "sort": "desc"}},
                "targets": [{"refId": chr(ord("A") + j), "datasource": DS, "expr": e,
                             "legendFormat": legend} for j, (e, legend) in enumerate(targets)],
            })
            pid += 1
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "uid": "onlineps-overview", "title": "onlineps", "tags": ["onlineps"],
        "description": "Parameter servers, workers, MCP bridge: rates, latency, staleness, "
                       "checkpoint age (deploy/grafana/make_dashboard.py)",
        "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1,
        "time": {"from": "now-6h", "to": "now"}, "refresh": "30s", "timezone": "",
        "annotations": {"list": []}, "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "options": []},
            {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DS,
             "query": {"query": "label_values(onlineps_build_info, namespace)", "refId": "ns"},
             "definition": "label_values(onlineps_build_info, namespace)",
             "includeAll": True, "allValue": ".*", "multi": True, "refresh": 2,
             "current": {}, "hide": 0, "options": [], "sort": 1},
        ]},
        "panels": panels,
    }


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "onlineps.json")
    with open(out, "w", encoding="utf-8") as f:
        json.dump(build(), f, indent=2)
        f.write("\n")
    print(f"make_dashboard: wrote {out}")
