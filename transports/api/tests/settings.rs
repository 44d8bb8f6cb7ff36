//! The settings registry is the one list: every `FMX_*` name in fmx's
//! sources is declared in it, and the README's table is generated from it.

use std::path::{Path, PathBuf};

use fmx_transport::settings::registry::{find, markdown_table, SETTINGS};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Names that are not settings: test knobs of unit tests and the build's own.
fn not_a_setting(name: &str) -> bool {
    ["FMX_SIM_", "FMX_FUZZ_", "FMX_ITEST_", "FMX_TEST_", "FMX_SURELY_", "FMX_AM_DIR", "FMX_JOIN_DIR", "FMX_GIT_HASH"]
        .iter()
        .any(|p| name.starts_with(p))
}

#[test]
fn every_fmx_variable_in_the_sources_is_declared() {
    let root = workspace();
    let mut files = Vec::new();
    for dir in [
        "core/src",
        "core/launcher/src",
        "transports/api/src",
        "transports/shm/src",
        "transports/verbs/src",
        "transports/ofi/src",
        "bench/src",
    ] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} source files under {}", files.len(), root.display());
    let mut undeclared = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, _) in text.match_indices("\"FMX_") {
            let name: String = text[i + 1..].chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
            let declared = find(&name).is_some() || SETTINGS.iter().any(|s| s.old_names.contains(&name.as_str()));
            if !declared && !not_a_setting(&name) && !name.ends_with('_') {
                undeclared.push(format!("{name} in {}", f.strip_prefix(&root).unwrap_or(f).display()));
            }
        }
    }
    undeclared.sort();
    undeclared.dedup();
    assert!(undeclared.is_empty(), "declare these in transports/api/src/settings/registry.rs:\n{}", undeclared.join("\n"));
}

#[test]
fn the_readme_settings_table_is_the_registry() {
    let path = workspace().join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (begin, end) = ("<!-- settings-table:begin -->\n", "<!-- settings-table:end -->");
    let a = readme.find(begin).expect("README has a settings-table block") + begin.len();
    let b = readme[a..].find(end).expect("the block ends") + a;
    let want = markdown_table();
    if readme[a..b] != want {
        if std::env::var_os("FMX_UPDATE_README").is_some() {
            std::fs::write(&path, format!("{}{want}{}", &readme[..a], &readme[b..])).unwrap();
            return;
        }
        panic!(
            "README.md's settings table differs from the registry; regenerate it with\n  \
             FMX_UPDATE_README=1 cargo test -p fmx-transport --test settings\nexpected:\n{want}"
        );
    }
}
