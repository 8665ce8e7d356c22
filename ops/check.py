#!/usr/bin/env python3
"""Hold the operations kit to the metric table of docs/design.md §12.

Every metric the rules (ops/prometheus/fencecheck.rules.yml) and the
dashboard (ops/grafana/fencecheck.json) use is in the table (histograms
with their _bucket/_sum/_count series) or is a recording rule the rules
file defines; every label they group or filter by is one of the table's
labels (or Prometheus' own: job, instance, le); every dashboard query
parses (it is checked by `promtool check rules` as a recording rule).

    ops/check.py            (run by scripts/test.d/70-ops.sh)
"""
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def table():
    text = open(os.path.join(ROOT, "docs/design.md"), encoding="utf-8").read()
    section = text.split("## 12. Signals", 1)[1].split("\n## ", 1)[0]
    metrics = {}
    for line in section.splitlines():
        m = re.match(r"\| `(fencecheck_[a-z_]+)` \| (counter|gauge|histogram) \| (.*?) \|", line)
        if m:
            labels = set(re.findall(r"`([a-z_]+)` \(", m.group(3)))
            metrics[m.group(1)] = (m.group(2), labels)
    if len(metrics) < 5:
        sys.exit(f"ops/check.py: only {len(metrics)} metrics parsed from docs/design.md §12")
    return metrics


def main():
    metrics = table()
    known_labels = {"job", "instance", "le"} | set().union(*(l for _, l in metrics.values()))
    rules_text = open(os.path.join(ROOT, "ops/prometheus/fencecheck.rules.yml"), encoding="utf-8").read()
    recorded = set(re.findall(r"record: ([a-z_:0-9]+)", rules_text))
    dashboard = json.load(open(os.path.join(ROOT, "ops/grafana/fencecheck.json"), encoding="utf-8"))
    dash_exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    problems = []
    for where, exprs in (("rules", [rules_text]), ("dashboard", dash_exprs)):
        for expr in exprs:
            for name in set(re.findall(r"\b(fencecheck(?:_[a-z]+)+)\b", expr)):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                if name in metrics or (base in metrics and metrics[base][0] == "histogram"):
                    continue
                problems.append(f"{where}: {name} is not in docs/design.md §12")
            for name in set(re.findall(r"\b(fencecheck:[a-z_:0-9]+)", expr)):
                if name not in recorded:
                    problems.append(f"{where}: recording rule {name} is not defined")
            for group in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr):
                for label in filter(None, (l.strip() for l in group.split(","))):
                    if label not in known_labels:
                        problems.append(f"{where}: label {label} is not in the table")
            for label in re.findall(r"[{,]\s*([a-z_]+)\s*(?:=|!=|=~|!~)", expr):
                if label not in known_labels:
                    problems.append(f"{where}: label {label} is not in the table")
    # Every dashboard query must parse: promtool checks them as recording rules.
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, expr in enumerate(dash_exprs):
            f.write(f"      - record: dashboard_query_{i}\n        expr: {json.dumps(expr)}\n")
    try:
        run = subprocess.run(["promtool", "check", "rules", f.name], capture_output=True, text=True)
        if run.returncode != 0:
            problems.append("dashboard queries do not parse:\n" + run.stdout + run.stderr)
    finally:
        os.unlink(f.name)
    if problems:
        sys.exit("ops/check.py:\n  " + "\n  ".join(problems))
    print(f"ops/check.py: {len(metrics)} metrics in the table; rules and {len(dash_exprs)} dashboard queries use only them")


if __name__ == "__main__":
    main()
