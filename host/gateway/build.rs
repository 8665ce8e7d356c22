//! Embeds the conformance vectors (tests/vectors/*.json) in the gateway: a
//! component is swapped in on reload only after it passes all of them.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/vectors");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/vectors is readable")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut out = String::from(
        "/// The conformance vectors: (file name, JSON text).\npub const VECTORS: &[(&str, &str)] = &[\n",
    );
    for path in &files {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .expect("UTF-8 file name");
        out.push_str(&format!(
            "    ({name:?}, include_str!({:?})),\n",
            path.display().to_string()
        ));
    }
    out.push_str("];\n");
    let dest = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("vectors.rs");
    std::fs::write(dest, out).expect("writing vectors.rs");
}
