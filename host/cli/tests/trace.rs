//! `fencecheck trace`: canonical lines, both runtimes identical, malformed
//! sequences refused (the cross-runtime comparison is scripts/test.d/60-agreement.sh).

use std::process::{Command, Output};

use anyhow::{Context, Result, ensure};

fn trace(runtime: &str, sequence: &str) -> Result<Output> {
    let path = std::env::temp_dir().join(format!(
        "fencecheck-trace-{}-{runtime}-{}.jsonl",
        std::process::id(),
        sequence.len()
    ));
    std::fs::write(&path, sequence)?;
    let out = Command::new(env!("CARGO_BIN_EXE_fencecheck"))
        .args(["trace", "--runtime", runtime])
        .arg(&path)
        .env_remove("FENCECHECK_COMPONENT")
        .output()
        .context("running fencecheck trace");
    std::fs::remove_file(&path)?;
    out
}

const SEQUENCE: &str = r#"{"slot":0,"check":{"scope":"s","token":[0,5]}}
{"slot":0,"check":{"scope":"s","token":[0,4]}}
{"slot":1,"check":{"scope":"é","token":[0,1]}}
{"batch":[{"slot":1,"check":{"scope":"e","token":[0,2]}},{"slot":2,"check":{"scope":"t","token":[0,0]}}]}
{"slot":0,"damage":"flip-bit","bit":3}
{"slot":0,"check":{"scope":"s","token":[0,6]}}
"#;

/// Lines follow tests/agreement/README.md and wasm equals native byte for byte.
#[test]
fn lines_are_canonical_and_runtimes_agree() -> Result<()> {
    let wasm = trace("wasm", SEQUENCE)?;
    let native = trace("native", SEQUENCE)?;
    ensure!(wasm.status.success() && native.status.success());
    ensure!(
        wasm.stdout == native.stdout,
        "wasm and native traces differ"
    );
    let text = String::from_utf8(wasm.stdout)?;
    let lines: Vec<&str> = text.lines().collect();
    ensure!(lines.len() == 7, "{text}");
    let starts = [
        r#"{"line":1,"outcome":"applied","version":1,"highest":[0,0,5],"state":""#,
        r#"{"line":2,"outcome":"stale-fence","presented":[0,0,4],"highest":[0,0,5],"state":""#,
        r#"{"line":4,"item":0,"outcome":"error","error":"scope-mismatch","scope":"c3a9","state":""#,
        r#"{"line":4,"item":1,"outcome":"error","error":"invalid-request","reason":"missing-token","state":null}"#,
        r#"{"line":5,"damage":"flip-bit","state":""#,
        r#"{"line":6,"outcome":"error","error":"corrupt-state","reason":"checksum-mismatch","state":""#,
    ];
    for (line, start) in [0, 1, 3, 4, 5, 6].iter().zip(starts) {
        ensure!(
            lines[*line].starts_with(start),
            "line {line}: {}",
            lines[*line]
        );
    }
    Ok(())
}

/// Malformed lines stop the trace with a non-zero exit instead of being skipped.
#[test]
fn malformed_lines_are_refused() -> Result<()> {
    for bad in [
        r#"{"slot":0}"#,
        r#"{"slot":0,"check":{"scope":"s","token":[0,1]},"damage":"clear"}"#,
        r#"{"slot":-1,"check":{"scope":"s","token":[0,1]}}"#,
        r#"{"slot":0,"check":{"scope":"s","token":[0,1]},"extra":1}"#,
        r#"{"batch":[{"slot":0,"check":{"scope":"s","token":[0,1]}},{"slot":0,"check":{"scope":"s","token":[0,2]}}]}"#,
        r#"{"slot":0,"damage":"melt"}"#,
        "not json",
    ] {
        let out = trace("native", &format!("{bad}\n"))?;
        ensure!(!out.status.success(), "accepted: {bad}");
    }
    Ok(())
}
