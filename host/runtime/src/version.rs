//! Which component versions this host runs.
//!
//! A component's version is its WIT package version, carried in its export
//! names (`fencecheck:fence/check@0.1.0`). This crate was built against the
//! package in `wit/fence.wit` ([`WIT_VERSION`], read by the build script) and
//! runs a component only if its exports carry a version of the same release
//! line (for 0.x: the same major and minor; any patch, older or newer):
//! anything else has another contract and is refused at load with
//! [`Error::UnsupportedComponent`], before anything is instantiated. Within
//! a line versions only add (0.1.1 added `fencecheck:fence/auth`): a call
//! that needs what an older component lacks is refused with
//! [`Error::Unsupported`], and every other call works.

use crate::Error;

/// The WIT package every fencecheck component exports from.
pub const WIT_PACKAGE: &str = "fencecheck:fence";

/// The version of [`WIT_PACKAGE`] this crate was built against (the
/// `package fencecheck:fence@…;` line of `wit/fence.wit`).
pub const WIT_VERSION: &str = env!("FENCECHECK_WIT_VERSION");

/// The interface whose version is the component's version.
const CHECK: &str = "check";

/// `MAJOR.MINOR.PATCH`, digits only: pre-release and build tags are not
/// accepted (no fencecheck release carries one, and they have no
/// compatibility promise).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Version {
    major: u64,
    minor: u64,
    patch: u64,
}

impl Version {
    fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split('.');
        let mut number = || {
            let part = parts.next()?;
            // No sign, no leading zeros (as semver), no empty part.
            let canonical = !part.is_empty()
                && part.bytes().all(|b| b.is_ascii_digit())
                && (part == "0" || !part.starts_with('0'));
            canonical.then(|| part.parse().ok()).flatten()
        };
        let version = Self {
            major: number()?,
            minor: number()?,
            patch: number()?,
        };
        parts.next().is_none().then_some(version)
    }

    /// Whether a component at `self` can serve a host built against `built`:
    /// the same release line (for 0.x the same minor, else the same major),
    /// older or newer. Within a line versions only add: a host runs an
    /// older component of its line (the rolling upgrade's old half) and
    /// refuses, per call, a feature it lacks ([`Error::Unsupported`]).
    fn serves(self, built: Self) -> bool {
        if built.major == 0 {
            self.major == 0 && self.minor == built.minor
        } else {
            self.major == built.major
        }
    }
}

/// The versions this host runs, for messages: `fencecheck:fence@0.1.x`.
pub fn supported() -> String {
    let Some(built) = Version::parse(WIT_VERSION) else {
        return format!("{WIT_PACKAGE}@{WIT_VERSION}");
    };
    let line = if built.major == 0 {
        format!("0.{}.x", built.minor)
    } else {
        format!("{}.x", built.major)
    };
    format!("{WIT_PACKAGE}@{line}")
}

/// The version of the component whose top-level export names are `exports`,
/// if this host runs it, with the full name of its check interface; else
/// [`Error::UnsupportedComponent`] saying what was found.
///
/// The version is that of `fencecheck:fence/check@…`; every other
/// `fencecheck:fence/…` export must carry the same one (a component mixing
/// versions is not one release).
pub(crate) fn vet<'a>(exports: impl IntoIterator<Item = &'a str>) -> Result<Vetted, Error> {
    let prefix = format!("{WIT_PACKAGE}/");
    let mut ours: Vec<(&str, Option<&str>)> = Vec::new();
    let mut others: Vec<&str> = Vec::new();
    for name in exports {
        match name.strip_prefix(prefix.as_str()) {
            Some(rest) => ours.push(match rest.split_once('@') {
                Some((interface, version)) => (interface, Some(version)),
                None => (rest, None),
            }),
            None => others.push(name),
        }
    }
    let refuse = |found: String| Error::UnsupportedComponent {
        found,
        supported: supported(),
    };
    let Some(&(_, check_version)) = ours.iter().find(|(interface, _)| *interface == CHECK) else {
        let mut all: Vec<String> = ours
            .iter()
            .map(|(i, v)| full_name(i, *v))
            .chain(others.iter().map(|n| n.to_string()))
            .collect();
        all.sort();
        let listed = if all.is_empty() {
            "nothing".to_string()
        } else {
            all.join(", ")
        };
        return Err(refuse(format!(
            "no {WIT_PACKAGE}/{CHECK} interface (its exports: {listed})"
        )));
    };
    let check_name = full_name(CHECK, check_version);
    let Some(version) = check_version else {
        return Err(refuse(format!("{check_name} without a version")));
    };
    if let Some((interface, other)) = ours.iter().find(|(_, v)| *v != check_version) {
        return Err(refuse(format!(
            "{check_name} and {} (two versions)",
            full_name(interface, *other)
        )));
    }
    let built = Version::parse(WIT_VERSION);
    match (Version::parse(version), built) {
        (Some(found), Some(built)) if found.serves(built) => Ok(Vetted {
            version: version.to_string(),
            check_interface: check_name,
        }),
        _ => Err(refuse(check_name)),
    }
}

/// The top-level export names of `component` as its binary states them, or
/// `None` if it does not parse (then wasmtime reports why). Lets the load
/// refuse another version before spending a compile on it.
pub(crate) fn declared_exports(component: &[u8]) -> Option<Vec<String>> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        match payload.ok()? {
            // Each (nested) module or component starts with its header and
            // ends with `End`: only depth 1 is the component itself.
            wasmparser::Payload::Version { encoding, .. } => {
                if depth == 0 && encoding != wasmparser::Encoding::Component {
                    return None;
                }
                depth += 1;
            }
            wasmparser::Payload::End(_) => depth = depth.checked_sub(1)?,
            wasmparser::Payload::ComponentExportSection(exports) if depth == 1 => {
                for export in exports {
                    names.push(export.ok()?.name.0.to_string());
                }
            }
            _ => {}
        }
    }
    Some(names)
}

fn full_name(interface: &str, version: Option<&str>) -> String {
    match version {
        Some(v) => format!("{WIT_PACKAGE}/{interface}@{v}"),
        None => format!("{WIT_PACKAGE}/{interface}"),
    }
}

/// A component this host runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Vetted {
    /// Its WIT package version, e.g. `0.1.0`.
    pub(crate) version: String,
    /// The full name of its check interface, e.g. `fencecheck:fence/check@0.1.0`
    /// (the core module's export names start with it).
    pub(crate) check_interface: String,
}

/// `component` with every `fencecheck:fence…@WIT_VERSION` name rewritten to
/// `@to` (same length), validated as a component: the same component
/// claiming another version, for tests of the refusal. Not part of the API.
#[doc(hidden)]
pub fn rewrite_wit_version(component: &[u8], to: &str) -> Result<Vec<u8>, Error> {
    let fail = |why: String| Error::Load(format!("rewriting the WIT version to {to}: {why}"));
    if to.len() != WIT_VERSION.len() {
        return Err(fail(format!("{to} is not as long as {WIT_VERSION}")));
    }
    let mut out = component.to_vec();
    let package = WIT_PACKAGE.as_bytes();
    let (mut at, mut rewritten) = (0, 0);
    while let Some(found) = out
        .get(at..)
        .and_then(|rest| rest.windows(package.len()).position(|w| w == package))
    {
        // Past the package and an interface path (`/check`), to the `@`.
        let mut end = at + found + package.len();
        while out
            .get(end)
            .is_some_and(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'/' | b'_'))
        {
            end += 1;
        }
        let version = end + 1..end + 1 + WIT_VERSION.len();
        if out.get(end) == Some(&b'@') && out.get(version.clone()) == Some(WIT_VERSION.as_bytes()) {
            out.splice(version, to.bytes());
            rewritten += 1;
        }
        at = end;
    }
    if rewritten == 0 {
        return Err(fail(format!("no name carries @{WIT_VERSION}")));
    }
    wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
        .validate_all(&out)
        .map_err(|e| fail(format!("the result does not validate: {e}")))?;
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::panic)]
mod tests {
    use super::*;

    fn vetted(names: &[&str]) -> Result<String, String> {
        vet(names.iter().copied())
            .map(|v| v.version)
            .map_err(|e| e.to_string())
    }

    /// Every patch of the built-against 0.x line is run, older (0.1.0, the
    /// released component) and newer; the component's version is its check
    /// interface's.
    #[test]
    fn same_line_is_run() -> Result<(), String> {
        assert_eq!(WIT_VERSION, "0.1.1", "update these cases with the WIT");
        let names = [
            "fencecheck:fence/types@0.1.0",
            "fencecheck:fence/check@0.1.0",
            "fencecheck:fence/lease@0.1.0",
        ];
        assert_eq!(vetted(&names)?, "0.1.0");
        assert_eq!(vetted(&["fencecheck:fence/check@0.1.1"])?, "0.1.1");
        assert_eq!(
            vetted(&["fencecheck:fence/check@0.1.7", "unrelated:pkg/x@9.0.0"])?,
            "0.1.7"
        );
        Ok(())
    }

    /// The export names read from the binary before compiling are the ones
    /// wasmtime sees after compiling, so the early refusal judges the same
    /// names; a bare core module or garbage yields none (wasmtime reports).
    #[test]
    fn declared_exports_are_wasmtimes() {
        let engine = wasmtime::Engine::default();
        let component = match wasmtime::component::Component::new(&engine, crate::COMPONENT) {
            Ok(c) => c,
            Err(e) => panic!("{e:#}"),
        };
        let mut seen: Vec<String> = component
            .component_type()
            .exports(&engine)
            .map(|(n, _)| n.to_string())
            .collect();
        let mut declared = declared_exports(crate::COMPONENT).unwrap_or_default();
        seen.sort();
        declared.sort();
        assert!(!seen.is_empty());
        assert_eq!(declared, seen);
        assert_eq!(declared_exports(b"\0asm\x01\0\0\0"), None);
        assert_eq!(declared_exports(b"garbage"), None);
    }

    /// Another minor or major, a malformed or tagged version, no version,
    /// mixed versions and a missing check interface are all refused with
    /// what was found and what is supported.
    #[test]
    fn everything_else_is_refused() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["fencecheck:fence/check@0.2.0"],
                "component exports fencecheck:fence/check@0.2.0; this host supports fencecheck:fence@0.1.x",
            ),
            (
                &["fencecheck:fence/check@1.0.0"],
                "exports fencecheck:fence/check@1.0.0;",
            ),
            (
                &["fencecheck:fence/check@0.0.9"],
                "exports fencecheck:fence/check@0.0.9;",
            ),
            (&["fencecheck:fence/check@0.1.0-rc1"], "check@0.1.0-rc1;"),
            (&["fencecheck:fence/check@0.1"], "check@0.1;"),
            (&["fencecheck:fence/check@0.01.0"], "check@0.01.0;"),
            (&["fencecheck:fence/check@0.1.0.0"], "check@0.1.0.0;"),
            (
                &["fencecheck:fence/check"],
                "fencecheck:fence/check without a version",
            ),
            (
                &[
                    "fencecheck:fence/check@0.1.0",
                    "fencecheck:fence/lease@0.2.0",
                ],
                "fencecheck:fence/check@0.1.0 and fencecheck:fence/lease@0.2.0 (two versions)",
            ),
            (
                &["fencecheck:fence/lease@0.1.0", "other:thing/check@0.1.0"],
                "no fencecheck:fence/check interface (its exports: fencecheck:fence/lease@0.1.0, other:thing/check@0.1.0)",
            ),
            (
                &[],
                "no fencecheck:fence/check interface (its exports: nothing)",
            ),
        ];
        for (names, expected) in cases {
            match vetted(names) {
                Ok(v) => panic!("{names:?} was accepted as {v}"),
                Err(message) => {
                    assert!(message.contains(expected), "{names:?}: {message}");
                    assert!(
                        message.ends_with("this host supports fencecheck:fence@0.1.x"),
                        "{message}"
                    );
                }
            }
        }
    }
}
