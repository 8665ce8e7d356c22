//! Nothing published that is not whole and durable: blobs on a full disk
//! (a real, small tmpfs mounted by the test; CI runs as root) get 507,
//! publish nothing and leave no file behind; the key keeps its old object.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use common::Gateway;

/// A tmpfs of `size` mounted on `dir`; unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .context("running mount")?;
        if !out.status.success() {
            bail!(
                "mounting a tmpfs needs root (CI runs as root): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(Self(dir.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Blobs on a 256 KiB tmpfs: a 64 KiB object is stored; a 512 KiB one (and
/// a chunked one) runs out of space: 507 problem, the visible object is
/// still the old one with its own bytes, no partial file is left, and the
/// token is not used up. Once space is freed the same token writes.
#[test]
fn disk_full_is_507_and_leaves_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let _tmpfs = Tmpfs::mount(&data.join("blobs"), "256k")?;
    let gw = Gateway::start_authed(&data, &["--max-body", "4194304"])?;
    let small = vec![b's'; 64 << 10];
    let r = gw.request("PUT", "/objects/k", &[("Fence-Token", "0.1")], &small)?;
    ensure!(r.status == 201, "{r:?}");

    let big = vec![b'b'; 512 << 10];
    let r = gw.request("PUT", "/objects/k", &[("Fence-Token", "0.2")], &big)?;
    ensure!(r.status == 507, "{:?}", r.status);
    ensure!(r.header("content-type") == Some("application/problem+json"));
    ensure!(r.json()?["title"] == "insufficient-storage", "{r:?}");
    let mut open = gw.open("PUT", "/objects/k", &[("Fence-Token", "0.2")], None)?;
    for part in big.chunks(64 << 10) {
        if open.send(part).is_err() {
            break;
        }
    }
    let r = open.finish()?;
    ensure!(r.status == 507, "chunked: {r:?}");

    let r = gw.request("GET", "/objects/k", &[], b"")?;
    ensure!(
        r.status == 200 && r.body == small && r.header("etag") == Some("\"1\""),
        "{}",
        r.status
    );
    ensure!(
        gw.blob_count()? == 1,
        "{} files in the blob dir",
        gw.blob_count()?
    );

    // A write that fits, with the token the refused ones presented.
    let r = gw.request("PUT", "/objects/k", &[("Fence-Token", "0.2")], b"fits")?;
    ensure!(
        r.status == 200 && r.header("etag") == Some("\"2\""),
        "{r:?}"
    );
    Ok(())
}
