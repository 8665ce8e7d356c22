//! `fencecheck-postgres-worker URL install` / `… URL write SCOPE TOKEN [POLICY]`:
//! one fenced write from a separate process, for the cross-host tests (a
//! Rust writer beside Python ones on one database). Prints the outcome's
//! name and, when applied, the version: `applied 3`, `stale-fence`.

use anyhow::{Context, Result, bail};
use fencecheck::{Fenced, Policy, Request, Runtime, TokenText};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (url, rest) = args
        .split_first()
        .context("usage: URL install | URL write SCOPE TOKEN [POLICY]")?;
    let mut db = postgres::Client::connect(url, postgres::NoTls)?;
    match rest {
        [cmd] if cmd == "install" => {
            fencecheck_postgres::install(&mut db)?;
            println!("installed");
        }
        [cmd, scope, token, policy @ ..] if cmd == "write" => {
            let policy = match policy.first().map(String::as_str) {
                None | Some("strict") => Policy::Strict,
                Some("allow-equal") => Policy::AllowEqual,
                Some(other) => bail!("unknown policy {other}"),
            };
            let token = token.parse::<TokenText>()?.0;
            let mut guest = Runtime::new()?.instance()?;
            let request = Request::new(scope.as_str(), token, policy);
            match fencecheck_postgres::fenced_write(&mut db, &mut guest, &request, |_, _| {
                Ok::<(), postgres::Error>(())
            })? {
                Fenced::Applied { version, .. } => println!("applied {version}"),
                Fenced::Rejected(r) => println!("{}", r.name()),
            }
        }
        _ => bail!("usage: URL install | URL write SCOPE TOKEN [POLICY]"),
    }
    Ok(())
}
