//! The purity lint: the crate's sources may not name a hash map, a clock, a random number
//! generator or any I/O facility. Test-only (this test itself reads the crate's source files).

use std::path::{Path, PathBuf};

/// Each forbidden token, with why.
const FORBIDDEN: &[(&str, &str)] = &[
    ("HashMap", "iteration order is unspecified; use BTreeMap"),
    ("HashSet", "iteration order is unspecified; use BTreeSet"),
    ("Instant", "no clock: time is an event's position"),
    ("SystemTime", "no clock: time is an event's position"),
    ("thread_rng", "no randomness"),
    ("rand::", "no randomness"),
    ("std::fs", "no I/O"),
    ("std::net", "no I/O"),
    ("std::env", "no I/O"),
    ("println!", "no I/O: the report is returned, never printed"),
];

fn sources(directory: &Path, found: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(directory).expect("the crate's source directory is readable");
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            sources(&path, found);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn sources_name_no_source_of_nondeterminism_or_io() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    files.sort();
    assert!(files.len() >= 10, "found only {files:?}");
    for file in files.iter().filter(|file| !file.ends_with("lint.rs")) {
        let text = std::fs::read_to_string(file).expect("a readable source file");
        for (number, line) in text.lines().enumerate() {
            for (token, why) in FORBIDDEN {
                assert!(
                    !line.contains(token),
                    "{}:{}: `{token}`: {why}",
                    file.display(),
                    number + 1
                );
            }
        }
    }
}
