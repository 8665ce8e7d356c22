//! Every vector file, through the wasm component and the native reference,
//! with both runtimes compared step by step.

use anyhow::{Result, bail, ensure};
use fencecheck::Native;
use fencecheck::vectors::{load, parse, run};
use fencecheck_tests::{runtime, vector_files};

/// Every vector passes under wasm and native, and the two agree on every
/// outcome and on the stored state bytes after every step.
#[test]
fn vectors_pass_and_runtimes_agree() -> Result<()> {
    let files = vector_files()?;
    ensure!(
        files.len() >= 30,
        "expected at least 30 vector files, found {}",
        files.len()
    );
    let mut wasm = runtime()?.instance()?;
    let mut problems = Vec::new();
    for path in &files {
        let file = match load(path) {
            Ok(f) => f,
            Err(e) => {
                problems.push(format!("{}: {e}", path.display()));
                continue;
            }
        };
        let on_wasm = run(&file, &mut wasm);
        let on_native = run(&file, &mut Native);
        for (runtime, report) in [("wasm", &on_wasm), ("native", &on_native)] {
            for failure in &report.failures {
                problems.push(format!("{} [{runtime}] {failure}", path.display()));
            }
        }
        if on_wasm.records != on_native.records {
            problems.push(format!("{}: wasm and native disagree", path.display()));
        }
    }
    if !problems.is_empty() {
        bail!("{} problem(s):\n{}", problems.len(), problems.join("\n"));
    }
    Ok(())
}

/// The runner itself can fail: a vector whose expectation is wrong is reported
/// (guards against a runner that passes everything).
#[test]
fn a_wrong_expectation_fails() -> Result<()> {
    let file = parse(
        r#"{"name":"wrong","steps":[
            {"check":{"scope":"s","token":[0,1]},"expect":{"outcome":"applied","version":1}},
            {"check":{"scope":"s","token":[0,1]},"expect":{"outcome":"applied"}}]}"#,
    )
    .map_err(anyhow::Error::msg)?;
    let report = run(&file, &mut runtime()?.instance()?);
    ensure!(report.failures.len() == 1, "{:?}", report.failures);
    ensure!(report.failures[0].contains("expected applied, got stale-fence"));
    Ok(())
}
