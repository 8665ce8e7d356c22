//! Link the extension so that it is never unloaded.
//!
//! MariaDB `dlclose`s a UDF library when its last function is dropped.
//! This library embeds wasmtime, which installs process-wide signal handlers
//! and thread-local destructors pointing into its code, and keeps one
//! component runtime per process in a static: unmapping it would leave those
//! dangling. `-z nodelete` makes `dlclose` keep it mapped for the life of the
//! process (a reload reuses the same copy).

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let elf = [
        "linux",
        "android",
        "freebsd",
        "netbsd",
        "openbsd",
        "dragonfly",
        "illumos",
        "solaris",
    ];
    if elf.contains(&os.as_str()) {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
}
