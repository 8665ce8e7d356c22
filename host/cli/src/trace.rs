//! `fencecheck trace`: run an agreement sequence (tests/agreement/README.md)
//! and print one canonical line per check, batch item and damage.
//!
//! The Python and Node.js hosts print the same lines for the same sequence;
//! scripts/test.d/60-agreement.sh compares all runtimes byte for byte. Lines
//! are formatted by hand, not by a JSON serialiser, so that no runtime's
//! number or string formatting can differ (strings are printed as hex).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, Write};
use std::path::Path;

use anyhow::{Context, Result, bail};
use fencecheck::vectors::{CheckStep, DamageArgs, damage};
use fencecheck::{CheckError, Checker, Decision, Outcome, Token};
use serde_json::{Map, Value};

/// One input line: a check, a damage, or a batch. Parsed from a JSON object
/// by hand (the CLI has no serde derive of its own); unknown fields refused.
#[derive(Default)]
struct Line {
    slot: Option<u64>,
    check: Option<CheckStep>,
    damage: Option<String>,
    bit: Option<u64>,
    len: Option<u64>,
    hex: Option<String>,
    batch: Option<Vec<Item>>,
}

/// One item of a batch line.
struct Item {
    slot: u64,
    check: CheckStep,
}

fn object<'a>(value: &'a Value, allowed: &[&str]) -> Result<&'a Map<String, Value>> {
    let obj = value.as_object().context("expected an object")?;
    if let Some(key) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        bail!("unknown field `{key}`");
    }
    Ok(obj)
}

fn u64_field(obj: &Map<String, Value>, key: &str) -> Result<Option<u64>> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => Ok(Some(
            v.as_u64()
                .with_context(|| format!("`{key}` must be a u64"))?,
        )),
    }
}

fn check_field(obj: &Map<String, Value>) -> Result<Option<CheckStep>> {
    match obj.get("check") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => Ok(Some(
            serde_json::from_value(v.clone()).context("bad `check`")?,
        )),
    }
}

fn parse_line(text: &str) -> Result<Line> {
    let value: Value = serde_json::from_str(text)?;
    let obj = object(
        &value,
        &["slot", "check", "damage", "bit", "len", "hex", "batch"],
    )?;
    let string = |key: &str| -> Result<Option<String>> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => Ok(Some(
                v.as_str()
                    .with_context(|| format!("`{key}` must be a string"))?
                    .to_owned(),
            )),
        }
    };
    let batch = match obj.get("batch") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let items = v.as_array().context("`batch` must be a list")?;
            let mut out = Vec::with_capacity(items.len());
            for item in items {
                let i = object(item, &["slot", "check"])?;
                out.push(Item {
                    slot: u64_field(i, "slot")?.context("a batch item needs `slot`")?,
                    check: check_field(i)?.context("a batch item needs `check`")?,
                });
            }
            Some(out)
        }
    };
    Ok(Line {
        slot: u64_field(obj, "slot")?,
        check: check_field(obj)?,
        damage: string("damage")?,
        bit: u64_field(obj, "bit")?,
        len: u64_field(obj, "len")?,
        hex: string("hex")?,
        batch,
    })
}

/// Run the sequence in `path` through `checker`, writing the trace to stdout.
pub fn run(checker: &mut dyn Checker, path: &Path) -> Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut slots: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    for (index, text) in std::io::BufReader::new(file).lines().enumerate() {
        let n = index + 1;
        let text = text.with_context(|| format!("reading line {n}"))?;
        let line = parse_line(&text).with_context(|| format!("line {n}"))?;
        if let Some(items) = &line.batch {
            let others = line.slot.is_some() || line.check.is_some() || line.damage.is_some();
            if others || line.bit.is_some() || line.len.is_some() || line.hex.is_some() {
                bail!("line {n}: a batch line has only `batch`");
            }
            batch(checker, &mut slots, items, n, &mut out)?;
            continue;
        }
        let slot = line
            .slot
            .with_context(|| format!("line {n}: needs `slot`"))?;
        match (&line.check, &line.damage) {
            (None, Some(kind)) => {
                let mut after = slots.remove(&slot);
                let args = DamageArgs {
                    bit: line.bit,
                    len: line.len,
                    hex: line.hex.as_deref(),
                };
                damage(&mut after, kind, args).map_err(|e| anyhow::anyhow!("line {n}: {e}"))?;
                writeln!(
                    out,
                    r#"{{"line":{n},"damage":"{kind}","state":{}}}"#,
                    hex(after.as_deref())
                )?;
                if let Some(bytes) = after {
                    slots.insert(slot, bytes);
                }
            }
            (Some(check), None)
                if line.bit.is_none() && line.len.is_none() && line.hex.is_none() =>
            {
                unsigned(check, n)?;
                let outcome =
                    checker.check(slots.get(&slot).map(Vec::as_slice), &check.request())?;
                if let Ok(Decision::Applied { state, .. }) = &outcome {
                    slots.insert(slot, state.clone());
                }
                let state = hex(slots.get(&slot).map(Vec::as_slice));
                writeln!(
                    out,
                    r#"{{"line":{n},{},"state":{state}}}"#,
                    fields(&outcome)
                )?;
            }
            _ => bail!("line {n}: needs exactly one of `check`, `damage`, `batch`"),
        }
    }
    out.flush()?;
    Ok(())
}

fn batch(
    checker: &mut dyn Checker,
    slots: &mut BTreeMap<u64, Vec<u8>>,
    items: &[Item],
    n: usize,
    out: &mut impl Write,
) -> Result<()> {
    let mut seen = std::collections::BTreeSet::new();
    if !items.iter().all(|i| seen.insert(i.slot)) {
        bail!("line {n}: a batch's slots must be distinct");
    }
    for item in items {
        unsigned(&item.check, n)?;
    }
    let requests: Vec<_> = items.iter().map(|i| i.check.request()).collect();
    let outcomes = {
        let pairs: Vec<_> = items
            .iter()
            .zip(&requests)
            .map(|(i, r)| (slots.get(&i.slot).map(Vec::as_slice), r))
            .collect();
        checker.check_batch(&pairs)?
    };
    for (index, (item, outcome)) in items.iter().zip(&outcomes).enumerate() {
        if let Ok(Decision::Applied { state, .. }) = outcome {
            slots.insert(item.slot, state.clone());
        }
        let state = hex(slots.get(&item.slot).map(Vec::as_slice));
        writeln!(
            out,
            r#"{{"line":{n},"item":{index},{},"state":{state}}}"#,
            fields(outcome)
        )?;
    }
    Ok(())
}

/// The canonical fields of an outcome, in the documented order.
fn fields(outcome: &Outcome) -> String {
    let tok = |t: &Token| format!("[{},{},{}]", t.authority, t.epoch, t.counter);
    match outcome {
        Ok(Decision::Applied {
            version, highest, ..
        }) => format!(
            r#""outcome":"applied","version":{version},"highest":{}"#,
            tok(highest)
        ),
        Ok(Decision::Duplicate { version }) => {
            format!(r#""outcome":"duplicate","version":{version}"#)
        }
        Ok(Decision::StaleFence { presented, highest }) => format!(
            r#""outcome":"stale-fence","presented":{},"highest":{}"#,
            tok(presented),
            tok(highest)
        ),
        Ok(Decision::VersionConflict { expected, actual }) => {
            format!(r#""outcome":"version-conflict","expected":{expected},"actual":{actual}"#)
        }
        Err(e) => {
            let mut s = format!(r#""outcome":"error","error":"{}""#, e.name());
            // Infallible: writing into a String.
            let _ = match e {
                CheckError::InvalidRequest(_) | CheckError::CorruptState(_) => {
                    write!(s, r#","reason":"{}""#, e.reason().unwrap_or("none"))
                }
                CheckError::UnsupportedStateVersion(v) => write!(s, r#","format":{v}"#),
                CheckError::ScopeMismatch(scope) => {
                    write!(s, r#","scope":"{}""#, hex::encode(scope.as_bytes()))
                }
                CheckError::ForeignAuthority { stored, presented } => {
                    write!(s, r#","stored":{stored},"presented":{presented}"#)
                }
                _ => Ok(()),
            };
            s
        }
    }
}

fn hex(state: Option<&[u8]>) -> String {
    state.map_or_else(|| "null".into(), |b| format!("\"{}\"", hex::encode(b)))
}

/// Agreement traces compare `check` across runtimes; a step with keys or a
/// signature would be silently checked unsigned here, so it is refused (the
/// signed path is covered by the conformance vectors in every runner).
fn unsigned(check: &fencecheck::vectors::CheckStep, n: usize) -> Result<()> {
    if check.keys.is_some() || check.signature.is_some() {
        bail!("line {n}: trace steps carry no keys or signatures");
    }
    Ok(())
}
