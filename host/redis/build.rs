//! Link the module so that it is never unmapped: it embeds wasmtime, which
//! installs process-wide signal handlers and thread-local destructors that
//! point into its code, and keeps the component runtime in a static.
//! `-z nodelete` makes MODULE UNLOAD's `dlclose` keep it mapped.

fn main() {
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    }
}
