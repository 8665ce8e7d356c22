//! The cross-host metric table (docs/design.md §12) as data, and checks that
//! what a host recorded or exported uses only its names, types, labels and
//! label values: every host's signals test goes through here, so a host and
//! the table cannot drift apart unnoticed.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Context, Result, bail, ensure};
use metrics_util::debugging::{DebugValue, Snapshotter};

/// One row of the table: its type and, per label, the allowed values.
#[derive(Debug)]
pub struct Row {
    /// `counter`, `gauge` or `histogram`.
    pub kind: String,
    /// Label → allowed values (the table's backticked values).
    pub labels: BTreeMap<String, BTreeSet<String>>,
}

/// Name → row.
pub type Table = BTreeMap<String, Row>;

/// What a host recorded: name → the (label, value) pairs seen.
pub type Seen = BTreeMap<String, BTreeSet<(String, String)>>;

/// The table, parsed from docs/design.md.
pub fn table() -> Result<Table> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/design.md");
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let section = text
        .split("## 12. Signals")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .context("docs/design.md §12")?;
    let mut table = Table::new();
    for line in section.lines() {
        let cells: Vec<&str> = line.split(" | ").collect();
        let Some(name) = cells
            .first()
            .and_then(|c| c.strip_prefix("| `"))
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue;
        };
        let (Some(kind), Some(labels)) = (cells.get(1), cells.get(2)) else {
            bail!("a short row: {line}");
        };
        // "`result` (`acquired`, `busy`, `error`)" → result: {acquired, busy, error};
        // prose among the values ("the host's own small set: …", "above that")
        // is not backticked and so not a value.
        let mut parsed = BTreeMap::new();
        for part in labels.split("), ") {
            let Some((label, values)) = part.split_once(" (") else {
                continue;
            };
            parsed.insert(label.trim_matches('`').to_owned(), values_of(values));
        }
        table.insert(
            name.to_owned(),
            Row {
                kind: kind.to_string(),
                labels: parsed,
            },
        );
    }
    ensure!(table.len() >= 8, "docs/design.md §12 parsed to {table:?}");
    Ok(table)
}

/// The backticked values of a label's cell; `` `0`–`15` `` is the range.
fn values_of(cell: &str) -> BTreeSet<String> {
    let parts: Vec<&str> = cell.split('`').collect();
    let mut values = BTreeSet::new();
    // parts: prose, value, prose, value, …
    for (i, value) in parts.iter().enumerate().skip(1).step_by(2) {
        values.insert((*value).to_owned());
        let range = (parts.get(i + 1) == Some(&"–"))
            .then(|| parts.get(i + 2))
            .flatten()
            .and_then(|end| Some((value.parse::<u64>().ok()?, end.parse::<u64>().ok()?)));
        if let Some((from, to)) = range {
            values.extend((from..=to).map(|n| n.to_string()));
        }
    }
    values
}

impl Row {
    /// `label=value` is the table's, for this row.
    fn allows(&self, name: &str, label: &str, value: &str) -> Result<()> {
        let allowed = self
            .labels
            .get(label)
            .with_context(|| format!("{name}: label {label} is not in the table"))?;
        ensure!(
            allowed.contains(value),
            "{name}: {label}={value} is not among the table's values {allowed:?}"
        );
        Ok(())
    }
}

/// What a `metrics` recorder held: the (label, value) pairs seen per name,
/// and every counter's value.
#[derive(Debug, Default)]
pub struct Recorded {
    /// Name → the (label, value) pairs seen.
    pub seen: Seen,
    /// (name, sorted `label=value` pairs joined with `,`) → value.
    counters: BTreeMap<(String, String), u64>,
}

impl Recorded {
    /// The counter values recorded under `name`, by label set.
    pub fn counters(&self, name: &str) -> BTreeMap<String, u64> {
        self.counters
            .iter()
            .filter(|((n, _), _)| n == name)
            .map(|((_, labels), v)| (labels.clone(), *v))
            .collect()
    }
}

/// Every metric a `metrics` recorder holds is in the table, with its type,
/// labels and values. One snapshot: the debugging recorder's counters are
/// drained by each.
pub fn check_recorded(snapshotter: &Snapshotter) -> Result<Recorded> {
    let table = table()?;
    let mut out = Recorded::default();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        let row = table
            .get(&name)
            .with_context(|| format!("{name} is not in docs/design.md §12"))?;
        let recorded = match value {
            DebugValue::Counter(_) => "counter",
            DebugValue::Gauge(_) => "gauge",
            DebugValue::Histogram(_) => "histogram",
        };
        ensure!(
            recorded == row.kind,
            "{name}: recorded as a {recorded}, the table says {}",
            row.kind
        );
        let entry = out.seen.entry(name.clone()).or_default();
        let mut labels = Vec::new();
        for label in key.key().labels() {
            row.allows(&name, label.key(), label.value())?;
            entry.insert((label.key().to_owned(), label.value().to_owned()));
            labels.push(format!("{}={}", label.key(), label.value()));
        }
        if let DebugValue::Counter(n) = value {
            labels.sort();
            *out.counters.entry((name, labels.join(","))).or_default() += n;
        }
    }
    Ok(out)
}

/// Every `fencecheck_*` family of a Prometheus text exposition that is not
/// a host's own (`own_prefix`, e.g. `fencecheck_gateway_`) is in the table,
/// with its type, labels and values; returns what was seen.
pub fn check_exposition(text: &str, own_prefix: &str) -> Result<Seen> {
    let table = table()?;
    let mut seen = Seen::new();
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').context("a # TYPE line")?;
            types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let series = line.split(' ').next().unwrap_or_default();
        let (sample, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        if !sample.starts_with("fencecheck_") || sample.starts_with(own_prefix) {
            continue;
        }
        // A histogram's samples: name_bucket{le=…}, name_sum, name_count.
        let name = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                sample
                    .strip_suffix(s)
                    .filter(|n| types.get(*n).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(sample);
        let row = table
            .get(name)
            .with_context(|| format!("{name} is not in docs/design.md §12"))?;
        let kind = types
            .get(name)
            .with_context(|| format!("{name} has no # TYPE line"))?;
        ensure!(
            *kind == row.kind,
            "{name}: exported as a {kind}, the table says {}",
            row.kind
        );
        let entry = seen.entry(name.to_owned()).or_default();
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            let (label, value) = pair.split_once('=').context("label=value")?;
            let value = value.trim_matches('"');
            if label == "le" && kind == "histogram" {
                continue;
            }
            row.allows(name, label, value)?;
            entry.insert((label.to_owned(), value.to_owned()));
        }
    }
    Ok(seen)
}

/// `seen` holds every `(name, label=value)` a scenario must have produced.
pub fn expect_seen(seen: &Seen, expect: &[(&str, &[(&str, &str)])]) -> Result<()> {
    for (name, labels) in expect {
        let got = seen
            .get(*name)
            .with_context(|| format!("{name} was not recorded; seen: {seen:?}"))?;
        for (k, v) in *labels {
            ensure!(
                got.contains(&((*k).to_owned(), (*v).to_owned())),
                "{name}: no {k}={v} in {got:?}"
            );
        }
    }
    Ok(())
}
