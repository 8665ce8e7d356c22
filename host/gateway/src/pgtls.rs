//! Connecting to PostgreSQL (`--postgres`): the libpq connection string
//! decides; the password comes from it, `PGPASSWORD` or `PGPASSFILE`
//! (libpq's rules), never from this gateway's command line.

use crate::error::Error;

/// A blocking client for `url`.
pub(crate) fn connect(url: &str) -> Result<postgres::Client, Error> {
    postgres::Client::connect(url, postgres::NoTls).map_err(|source| {
        Error::Postgres(fencecheck_postgres::Error::Postgres {
            doing: "connecting",
            source,
        })
    })
}
