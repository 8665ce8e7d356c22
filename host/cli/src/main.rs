//! `fencecheck`: the demo, the conformance runner and the state inspector.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use fencecheck::{Checker, Limits, Native, Runtime};

mod authority;
mod demo;
mod exporter;
mod keys;
mod trace;

#[derive(Parser)]
#[command(
    name = "fencecheck",
    version,
    about = "Stale-owner safety for distributed locks"
)]
struct Cli {
    /// Load this component file instead of the one built into the binary.
    #[arg(long, global = true, env = "FENCECHECK_COMPONENT")]
    component: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The seed's paused report writer, end to end, on an embedded SQLite database.
    Demo {
        /// Keep the database in this file (default: a temporary file, removed after).
        #[arg(long)]
        db: Option<PathBuf>,
    },
    /// Run conformance vector files; ends with `N passed, N failed`.
    Vectors {
        /// Which implementation decides.
        #[arg(long, value_enum, default_value_t = RuntimeKind::Wasm)]
        runtime: RuntimeKind,
        /// Vector files (JSON).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Write the component bytes this binary embeds (for hosts in other
    /// languages, which load the same component).
    Component {
        /// Output file.
        #[arg(short, long)]
        out: PathBuf,
    },
    /// Print the WIT package version of the component this binary runs
    /// (the embedded one, or --component's), e.g. `0.1.0`. A component whose
    /// version this binary does not support is refused, as by every command.
    ComponentVersion,
    /// Run an agreement sequence (tests/agreement/README.md); one canonical
    /// line per step, compared across runtimes by scripts/test.d.
    Trace {
        /// Which implementation decides.
        #[arg(long, value_enum, default_value_t = RuntimeKind::Wasm)]
        runtime: RuntimeKind,
        /// The sequence file (JSON lines).
        file: PathBuf,
    },
    /// The SQLite lease coordinator: acquire, renew, release, restore.
    #[command(subcommand)]
    Authority(authority::Authority),
    /// Print a new signing key (32 random bytes) as key text, `ID:HEX`.
    Keygen {
        /// The key's id: every signature names it.
        #[arg(default_value_t = 1)]
        id: u32,
    },
    /// The keys a SQLite resource's scopes require their tokens signed with.
    #[command(subcommand)]
    Keys(keys::Keys),
    /// Serve `/metrics` (Prometheus text) for Redis/Valkey servers with the
    /// module (FENCE.METRICS) and PostgreSQL databases with the extension
    /// (fencecheck.metrics()), with `fencecheck_exporter_up` per target.
    Exporter(exporter::Exporter),
    /// Print a stored fence or lease state (hex) as JSON.
    Inspect {
        /// The state's bytes in hex.
        hex: String,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum RuntimeKind {
    /// The component, through wasmtime (checks over the core transport when
    /// the component has the shape for it).
    Wasm,
    /// The component, through wasmtime's component API for every call.
    WasmComponent,
    /// The guest's source compiled natively (the reference).
    Native,
}

fn main() -> ExitCode {
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencecheck: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn runtime(component: Option<&PathBuf>) -> Result<Runtime> {
    Ok(match component {
        Some(path) => Runtime::from_file(path, Limits::default())?,
        None => Runtime::new()?,
    })
}

fn checker(kind: RuntimeKind, component: Option<&PathBuf>) -> Result<Box<dyn Checker>> {
    Ok(match kind {
        RuntimeKind::Wasm => Box::new(runtime(component)?.instance()?),
        RuntimeKind::WasmComponent => {
            Box::new(runtime(component)?.with_component_transport().instance()?)
        }
        RuntimeKind::Native => Box::new(Native),
    })
}

fn run() -> Result<ExitCode> {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo { db } => demo::run(&runtime(cli.component.as_ref())?, db.as_deref()),
        Command::Vectors {
            runtime: kind,
            files,
        } => {
            let mut checker = checker(kind, cli.component.as_ref())?;
            Ok(vectors(checker.as_mut(), &files))
        }
        Command::Trace {
            runtime: kind,
            file,
        } => {
            let mut checker = checker(kind, cli.component.as_ref())?;
            trace::run(checker.as_mut(), &file)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::ComponentVersion => {
            println!("{}", runtime(cli.component.as_ref())?.component_version());
            Ok(ExitCode::SUCCESS)
        }
        Command::Component { out } => {
            // Validate before writing: a file that wasmtime refuses must not ship.
            let bytes = match &cli.component {
                Some(path) => {
                    std::fs::read(path).with_context(|| format!("reading {}", path.display()))?
                }
                None => fencecheck::COMPONENT.to_vec(),
            };
            Runtime::from_bytes(&bytes, Limits::default())?;
            std::fs::write(&out, &bytes).with_context(|| format!("writing {}", out.display()))?;
            eprintln!("wrote {} ({} bytes)", out.display(), bytes.len());
            Ok(ExitCode::SUCCESS)
        }
        Command::Authority(command) => authority::run(&runtime(cli.component.as_ref())?, command),
        Command::Keygen { id } => keys::keygen(id),
        Command::Keys(command) => keys::run(command),
        Command::Exporter(options) => exporter::run(options),
        Command::Inspect { hex } => {
            let bytes = hex::decode(hex.trim()).context("the state must be hex")?;
            let mut guest = runtime(cli.component.as_ref())?.instance()?;
            // Lease states carry the magic "LS"; everything else is read as a
            // fence state (whose decoder reports anything it cannot read).
            let json = if bytes.starts_with(b"LS") {
                let info = guest
                    .inspect_lease(&bytes)?
                    .map_err(|e| anyhow::anyhow!("{e}"))?;
                serde_json::to_string_pretty(&info)?
            } else {
                let info = guest.inspect(&bytes)?.map_err(|e| anyhow::anyhow!("{e}"))?;
                serde_json::to_string_pretty(&info)?
            };
            println!("{json}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn vectors(checker: &mut dyn Checker, files: &[PathBuf]) -> ExitCode {
    let (mut passed, mut failed) = (0usize, 0usize);
    for path in files {
        let shown = path.display();
        let report = match fencecheck::vectors::load(path) {
            Ok(file) => fencecheck::vectors::run(&file, checker),
            Err(e) => {
                println!("FAIL {shown}: {e}");
                failed += 1;
                continue;
            }
        };
        for failure in &report.failures {
            println!("FAIL {shown}: {failure}");
        }
        if report.passed() {
            passed += 1;
        } else {
            failed += 1;
        }
    }
    println!("{passed} passed, {failed} failed");
    if failed == 0 && passed > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
