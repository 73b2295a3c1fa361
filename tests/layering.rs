//! The crate's layering, checked on the source text.
//!
//! * The layers above the array API (`src/nn`, `src/optim`, `src/io`, `src/data.rs`)
//!   import nothing from the engine: they use the public API and the extension API
//!   (`src/ext.rs`).
//! * The backend (`src/backend`) imports nothing from the engine, the array API or
//!   autograd outside its tests: it sees slices, layouts and dtypes.
//!
//! Comment lines are ignored. A file's test code is skipped: everything from a
//! `#[cfg(test)]` that opens an inline `mod` to the end of the file, and every file
//! that a `#[cfg(test)] mod name;` declares (or named `tests.rs`).

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `path` (or `path` itself), sorted.
fn rust_files(path: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if path.is_file() {
        out.push(path.to_path_buf());
    } else {
        for e in fs::read_dir(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
            out.extend(rust_files(&e.unwrap().path()));
        }
    }
    out.retain(|p| p.extension().is_some_and(|x| x == "rs"));
    out.sort();
    out
}

/// The files that a `#[cfg(test)] mod name;` in one of `files` declares.
fn test_only_files(files: &[PathBuf]) -> HashSet<PathBuf> {
    let mut out = HashSet::new();
    for f in files {
        let text = fs::read_to_string(f).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for w in lines.windows(2) {
            if w[0] != "#[cfg(test)]" {
                continue;
            }
            let Some(name) = w[1]
                .strip_prefix("mod ")
                .or_else(|| w[1].strip_prefix("pub(crate) mod "))
                .and_then(|r| r.strip_suffix(';'))
            else {
                continue;
            };
            let dir = if f
                .file_name()
                .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
            {
                f.parent().unwrap().to_path_buf()
            } else {
                f.with_extension("")
            };
            out.insert(dir.join(format!("{name}.rs")));
            out.insert(dir.join(name).join("mod.rs"));
        }
    }
    out
}

/// Whether `word` occurs in `line` as a whole identifier that is not the tail of a
/// path (`std::array` is not `array`), and, with `path`, begins one (`word::`).
fn has_word(line: &str, word: &str, path: bool) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(word).any(|(i, _)| {
        let (before, after) = (&line[..i], &line[i + word.len()..]);
        !before.chars().next_back().is_some_and(ident)
            && !before.ends_with("::")
            && !after.chars().next().is_some_and(ident)
            && (!path || after.starts_with("::"))
    })
}

/// Whether `prefix` followed by the identifier `word` occurs in `line`.
fn has_word_after(line: &str, prefix: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let pat = format!("{prefix}{word}");
    line.match_indices(&pat)
        .any(|(i, _)| !line[i + pat.len()..].chars().next().is_some_and(ident))
}

/// The lines of `text` (numbered from 1) that use one of the modules `banned` (names
/// under `crate::`): a path `crate::m`, `super::m` or `m::`, or `m` inside a `use`
/// item (`use crate::{m, ...}` over several lines included). Comments and the test
/// module at the end of the file are skipped.
fn violations(text: &str, banned: &[&str]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    let mut in_use = false;
    for (i, raw) in lines.iter().enumerate() {
        let line = raw.trim();
        if line == "#[cfg(test)]" {
            let next = lines[i + 1..]
                .iter()
                .map(|l| l.trim())
                .find(|l| !l.is_empty());
            if next.is_some_and(|n| n.starts_with("mod ") && n.ends_with('{')) {
                break; // the test module: the rest of the file
            }
        }
        // The code before any `//` comment (good enough: no banned name is in a
        // string literal that holds `//`).
        let code = line.split("//").next().unwrap_or("").trim();
        if code.is_empty() {
            continue;
        }
        // A `use` of the crate's own modules (the items below its braces may span
        // several lines).
        let use_item = ["use ", "pub use ", "pub(crate) use "]
            .iter()
            .find_map(|u| code.strip_prefix(u));
        if use_item.is_some_and(|r| {
            ["crate::", "super::", "self::"]
                .iter()
                .any(|p| r.starts_with(p))
        }) {
            in_use = true;
        }
        for m in banned {
            let bad = has_word_after(code, "crate::", m)
                || has_word_after(code, "super::", m)
                || has_word(code, m, true)
                || (in_use && has_word(code, m, false));
            if bad {
                out.push((i + 1, raw.to_string()));
                break;
            }
        }
        if in_use && code.ends_with(';') {
            in_use = false;
        }
    }
    out
}

/// Check every file under `roots` (relative to the crate) against `banned`.
fn check(roots: &[&str], banned: &[&str]) {
    let base = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files: Vec<PathBuf> = roots
        .iter()
        .flat_map(|r| rust_files(&base.join(r)))
        .collect();
    assert!(!files.is_empty(), "no source files under {roots:?}");
    let skip = test_only_files(&files);
    let mut found = Vec::new();
    for f in files.iter().filter(|f| !skip.contains(*f)) {
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = fs::read_to_string(f).unwrap();
        for (n, line) in violations(&text, banned) {
            found.push(format!(
                "{}:{n}: {}",
                f.strip_prefix(base).unwrap().display(),
                line.trim()
            ));
        }
    }
    assert!(
        found.is_empty(),
        "these lines use {banned:?}, which {roots:?} must not:\n{}",
        found.join("\n")
    );
}

#[test]
fn nn_optim_io_and_data_import_nothing_from_the_engine() {
    check(
        &["src/nn", "src/optim", "src/io", "src/data.rs"],
        &["engine"],
    );
}

#[test]
fn the_backend_imports_nothing_from_the_engine_the_arrays_or_autograd() {
    check(&["src/backend"], &["engine", "array", "autograd"]);
}

/// The checker finds what it must, and only that.
/// The backward pass calls the ops' gradient rules as methods of the tape's nodes: the
/// tape and the pass import nothing from the array layer (whose ops import the tape),
/// and the engine nothing from either, so no import runs back up.
#[test]
fn autograd_imports_nothing_from_the_ops_and_the_engine_nothing_above_it() {
    // Nor from the backend: gradients are added in through the engine, which picks the
    // kernel for the device, so the pass runs on any device.
    check(&["src/autograd"], &["array", "backend"]);
    // (`data` and `io` are left out: `data::<T>()` reads as a path to the checker.)
    check(
        &["src/engine"],
        &["array", "autograd", "nn", "optim", "diag", "ext"],
    );
}

#[test]
fn the_checker_catches_imports() {
    let bad = [
        "use crate::engine;",
        "use crate::engine::{self, Layout};",
        "    let id = engine::run_op(\"x\", &[], at, f)?;",
        "    array: crate::engine::desc(x.id)?,",
        "use super::super::engine::read;",
        "use crate::{\n    dtype::DType,\n    engine,\n};",
        "use crate::{array, dtype};",
        "use crate::array::gather::index_select_kernel;",
        "    let y = array::f(x);",
        "fn f() {}\n#[cfg(test)]\nfn g() { crate::engine::read(); }",
    ];
    for text in bad {
        assert!(
            !violations(text, &["engine", "array"]).is_empty(),
            "not caught: {text}"
        );
    }
    let good = [
        "//! goes through the engine's in-place path (`engine::run_inplace`)",
        "    // the engine::run_op path",
        "let x = 1; // crate::engine",
        "use crate::ext;\nlet engine_like = 2;\nlet engines = 3;",
        "use crate::dtype::Native;\nlet array = 1;",
        "let a: [u8; 2] = std::array::from_fn(|i| i as u8);",
        "use std::array;\nuse crate::arrays_of::x;\nuse crate::layout::{Layout, array_like};",
        "fn f() {}\n#[cfg(test)]\nmod tests {\n    use crate::engine::Layout;\n}",
    ];
    for text in good {
        assert_eq!(violations(text, &["engine", "array"]), vec![], "{text}");
    }
}
