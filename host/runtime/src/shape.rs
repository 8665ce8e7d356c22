//! Where the component keeps its core module. Shared with `build.rs`, which
//! precompiles that module for the core transport.

/// The bytes of the component's core module if it has exactly one (nested
/// components included), else `None`.
pub(crate) fn only_core_module(component: &[u8]) -> Option<&[u8]> {
    let mut found = None;
    for payload in wasmparser::Parser::new(0).parse_all(component) {
        match payload.ok()? {
            wasmparser::Payload::ModuleSection {
                unchecked_range, ..
            } => {
                if found.is_some() {
                    return None;
                }
                found = Some(component.get(unchecked_range)?);
            }
            // A bare core module is not a component (its own header comes
            // first; a nested module's header follows its ModuleSection).
            wasmparser::Payload::Version {
                encoding: wasmparser::Encoding::Module,
                ..
            } if found.is_none() => return None,
            _ => {}
        }
    }
    found
}
