//! What a runtime and its instances cost in memory: resident set (RSS) and
//! address space reserved (virtual size), read from `/proc/self/status`
//! after each step, for on-demand allocation (the default) and a 256-slot
//! pool (what every runtime reserved before).
//!
//! ```sh
//! cargo run --release -p fencecheck-benches --example memory
//! ```
//!
//! Each allocation strategy runs in a fresh process (this binary re-runs
//! itself), so one does not inherit the other's mappings.

use std::process::Command;

use anyhow::{Context, Result, bail};
use fencecheck::{Allocation, Decision, Limits, Policy, Request, Runtime, Token};

/// `(VmRSS, VmSize)` in KiB.
fn usage() -> Result<(u64, u64)> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let field = |name: &str| -> Result<u64> {
        let line = status
            .lines()
            .find(|l| l.starts_with(name))
            .with_context(|| format!("no {name} in /proc/self/status"))?;
        line.split_whitespace()
            .nth(1)
            .context("malformed line")?
            .parse()
            .context("not a number")
    };
    Ok((field("VmRSS:")?, field("VmSize:")?))
}

fn measure(allocation: Allocation) -> Result<()> {
    let limits = Limits {
        allocation,
        ..Limits::default()
    };
    let mut last = usage()?;
    let mut step = |what: &str| -> Result<()> {
        let now = usage()?;
        println!(
            "| {allocation:?} | {what} | {:+.1} MiB | {:+.1} GiB |",
            (now.0 as f64 - last.0 as f64) / 1024.0,
            (now.1 as f64 - last.1 as f64) / (1024.0 * 1024.0),
        );
        last = now;
        Ok(())
    };
    let runtime = Runtime::from_bytes(fencecheck::COMPONENT, limits)?;
    step(&format!("Runtime ({:?})", runtime.loaded()))?;
    let request = Request::new("report/july", Token::new(0, 0, 1), Policy::Strict);
    let mut instances = Vec::new();
    for n in [1usize, 8] {
        while instances.len() < n {
            let mut guest = runtime.instance()?;
            let Ok(Decision::Applied { .. }) = guest.check(None, &request)? else {
                bail!("a first check was not applied");
            };
            instances.push(guest);
        }
        step(&format!("{n} instance(s) in all, each after one check"))?;
    }
    // Lease calls instantiate the component too (made on first use).
    let mut guest = runtime.instance()?;
    let _ = guest.inspect_lease(b"")?;
    step("+1 instance with its component instantiation")?;
    Ok(())
}

fn main() -> Result<()> {
    match std::env::args().nth(1).as_deref() {
        Some("on-demand") => measure(Allocation::OnDemand),
        Some("pooling") => measure(Allocation::Pooling { instances: 256 }),
        Some(other) => bail!("unknown mode {other:?}"),
        None => {
            let (rss, size) = usage()?;
            println!(
                "process before any runtime: RSS {:.1} MiB, virtual {:.2} GiB\n",
                rss as f64 / 1024.0,
                size as f64 / (1024.0 * 1024.0)
            );
            println!("| allocation | step | RSS | virtual |\n| --- | --- | ---: | ---: |");
            let exe = std::env::current_exe()?;
            for mode in ["on-demand", "pooling"] {
                let status = Command::new(&exe).arg(mode).status()?;
                if !status.success() {
                    bail!("{mode}: {status}");
                }
            }
            Ok(())
        }
    }
}
