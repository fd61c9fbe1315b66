#!/usr/bin/env python3
"""Writes pgbatch-server.json, the Grafana dashboard, from the panel list
below: edit here, run `python3 deploy/grafana/generate.py` from the
repository root, and commit both. `crates/server/tests/metrics/grafana.rs` checks
that every metric the dashboard queries is exported."""
import json
panels=[]
def panel(title, exprs, unit="short", x=0, y=0, w=12, h=8, kind="timeseries", desc=""):
    pid=len(panels)+1
    ds={"type": "prometheus", "uid": "${datasource}"}
    p={"id": pid, "type": kind, "title": title,
      "datasource": ds,
      "gridPos": {"x": x, "y": y, "w": w, "h": h},
      "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
      "targets": [{"refId": chr(65+i), "expr": e, "legendFormat": l, "datasource": ds} for i,(e,l) in enumerate(exprs)]}
    if desc: p["description"]=desc
    panels.append(p)
def j(extra=""):
    inner='job=~"$job", instance=~"$instance"'
    return "{"+inner+(", "+extra if extra else "")+"}"
R="[$__rate_interval]"
SHED=j('status=~"503|504"')
y=0
panel("Requests/s by route and status", [(f'sum by (route, status) (rate(http_requests_total{j()}{R}))', "{{route}} {{status}}")], "reqps", 0, y)
panel("Request latency p50 / p99 by route", [
  (f'histogram_quantile(0.5, sum by (le, route) (rate(http_request_duration_seconds_bucket{j()}{R})))', "p50 {{route}}"),
  (f'histogram_quantile(0.99, sum by (le, route) (rate(http_request_duration_seconds_bucket{j()}{R})))', "p99 {{route}}")], "s", 12, y)
y+=8
panel("Shed and timed out: 503 / 504 per second", [
  (f'sum by (route, status) (rate(http_requests_total{SHED}{R}))', "{{route}} {{status}}"),
  (f'sum by (batcher) (rate(batcher_overloaded_total{j()}{R}))', "{{batcher}} overloaded lookups"),
  (f'sum by (batcher) (rate(batcher_timed_out_total{j()}{R}))', "{{batcher}} timed-out lookups")], "reqps", 0, y,
  desc="Overload is shed as 503 with Retry-After before any work; 504 is a request past its deadline")
panel("Batches: mean keys per statement, statements/s", [
  (f'sum by (batcher) (rate(batcher_batch_size_sum{j()}{R})) / sum by (batcher) (rate(batcher_batch_size_count{j()}{R}))', "{{batcher}} keys per batch"),
  (f'sum by (batcher) (rate(batcher_batches_total{j()}{R}))', "{{batcher}} statements/s")], "short", 12, y)
y+=8
panel("Batcher queue wait and load time p99", [
  (f'histogram_quantile(0.99, sum by (le, batcher) (rate(batcher_queue_wait_seconds_bucket{j()}{R})))', "{{batcher}} queue wait p99"),
  (f'histogram_quantile(0.99, sum by (le, batcher) (rate(batcher_load_duration_seconds_bucket{j()}{R})))', "{{batcher}} load p99")], "s", 0, y)
panel("Lookups/s: requested, not found", [
  (f'sum by (batcher) (rate(batcher_requests_total{j()}{R}))', "{{batcher}} requested"),
  (f'sum by (batcher) (rate(batcher_not_found_total{j()}{R}))', "{{batcher}} not found")], "ops", 12, y)
y+=8
panel("Cache hit ratio", [
  (f'sum by (cache) (rate(cache_hits_total{j()}{R})) / (sum by (cache) (rate(cache_hits_total{j()}{R})) + sum by (cache) (rate(cache_misses_total{j()}{R})))', "{{cache}}")], "percentunit", 0, y)
panel("Cache entries", [(f'sum by (cache) (cache_entries{j()})', "{{cache}}")], "short", 12, y)
y+=8
panel("Database pool: in use, idle, waiting", [
  (f'sum(db_pool_size{j()}) - sum(db_pool_available{j()})', "in use"),
  (f'sum(db_pool_available{j()})', "idle"),
  (f'sum(db_pool_waiting{j()})', "callers waiting"),
  (f'sum(db_pool_max_size{j()})', "max")], "short", 0, y)
panel("Batcher queue and running statements", [
  (f'sum by (batcher) (batcher_queued{j()})', "{{batcher}} queued"),
  (f'sum by (batcher) (batcher_in_flight_batches{j()})', "{{batcher}} running")], "short", 12, y)
y+=8
panel("Process: CPU cores used and resident memory", [
  (f'rate(process_cpu_seconds_total{j()}{R})', "{{instance}} CPU cores"),
  (f'process_resident_memory_bytes{j()} / 1e9', "{{instance}} RSS GB")], "short", 0, y)
panel("Process: open file descriptors, share of the limit", [
  (f'process_open_fds{j()} / process_max_fds{j()}', "{{instance}}")], "percentunit", 12, y,
  desc="The server caps connections below the open-files limit; near 1, new connections wait")
y+=8
panel("Cache coherence: listener up, invalidations/s", [
  (f'min by (instance) (cache_coherent{j()})', "{{instance}} coherent (1) / bypassed (0)"),
  (f'sum by (instance) (rate(cache_invalidations_received_total{j()}{R}))', "{{instance}} invalidations/s"),
  (f'sum by (instance) (increase(cache_invalidation_listener_failures_total{j()}{R}))', "{{instance}} listener failures")], "short", 0, y, 24, 8,
  desc="Cross-instance invalidation through LISTEN/NOTIFY: while the listener is down, caches are bypassed")
y+=8
panel("Build", [(f'pgbatch_build_info{j()}', "{{instance}} {{version}}")], "short", 0, y, 24, 4, kind="table")
ds={"type": "prometheus", "uid": "${datasource}"}
dash={
  "title": "pgbatch-server", "uid": "pgbatch-server",
  "description": "pgbatch-server: HTTP, batchers, caches, the database pool and the process, by the names /metrics exports.",
  "schemaVersion": 39, "version": 1, "editable": True,
  "time": {"from": "now-30m", "to": "now"}, "refresh": "10s",
  "tags": ["pgbatch", "postgres"],
  "templating": {"list": [
    {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus"},
    {"name": "job", "type": "query", "datasource": ds, "query": "label_values(pgbatch_build_info, job)", "includeAll": True, "multi": True, "refresh": 2},
    {"name": "instance", "type": "query", "datasource": ds, "query": 'label_values(pgbatch_build_info{job=~"$job"}, instance)', "includeAll": True, "multi": True, "refresh": 2}
  ]},
  "panels": panels,
}
open('deploy/grafana/pgbatch-server.json','w').write(json.dumps(dash, indent=2)+"\n")
print(len(panels))
