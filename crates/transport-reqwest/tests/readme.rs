//! The README's Rust examples compile as doctests of this crate, whose
//! dev-dependencies hold every crate of the workspace. A reader's crate holds only the
//! ones "Depending on it" lists, so an example that names another would compile here
//! and fail there: every crate of the workspace a native example names must be one
//! that section's manifest lists.
#![cfg(not(target_arch = "wasm32"))]

use std::collections::BTreeSet;

fn readme() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    std::fs::read_to_string(path).expect("the workspace README")
}

/// The bodies of the fenced blocks whose info string starts with `lang`.
fn blocks<'a>(text: &'a str, lang: &str) -> Vec<&'a str> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let info_end = after.find('\n').unwrap_or(after.len());
        let info = &after[..info_end];
        let body = &after[info_end..];
        let close = body.find("```").unwrap_or(body.len());
        // `rust` or `rust,no_run`, but not `rs` (the wasm32 copy, not compiled here).
        if info.split(',').next() == Some(lang) {
            found.push(&body[..close]);
        }
        rest = &body[(close + 3).min(body.len())..];
    }
    found
}

/// Every `vantage_api_pool…` crate name a piece of code names.
fn crate_names(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("vantage_api_pool") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        names.insert(name);
    }
    names
}

/// The crates the "Depending on it" manifest lists, as Rust names.
fn listed() -> BTreeSet<String> {
    let text = readme();
    let section = &text[text.find("## Depending on it").expect("the section")..];
    let manifest = blocks(section, "toml")
        .into_iter()
        .next()
        .expect("its manifest");
    manifest
        .lines()
        .filter_map(|line| line.split_once(" = "))
        .map(|(name, _)| name.trim().replace('-', "_"))
        .filter(|name| name.starts_with("vantage_api_pool"))
        .collect()
}

#[test]
fn the_readme_examples_name_only_the_crates_a_reader_depends_on() {
    let listed = listed();
    assert!(
        listed.contains("vantage_api_pool") && listed.contains("vantage_api_pool_reqwest"),
        "{listed:?}"
    );
    let text = readme();
    let examples = blocks(&text, "rust");
    assert!(
        examples.len() >= 5,
        "found only {} examples",
        examples.len()
    );
    for example in examples {
        for name in crate_names(example) {
            assert!(
                listed.contains(&name),
                "a README example names `{name}`, which \"Depending on it\" does not list \
                 ({listed:?}):\n{example}"
            );
        }
    }
}

#[test]
fn the_checks_find_what_they_look_for() {
    let text = "a\n```toml\nvantage-api-pool-x = { path = \"p\" }\n```\n\
                ```rust,no_run\nuse vantage_api_pool_y::Z;\n```\n```rs\nvantage_api_pool_w\n```\n";
    let rust = blocks(text, "rust");
    assert_eq!(rust.len(), 1);
    assert_eq!(
        crate_names(rust[0]).into_iter().collect::<Vec<_>>(),
        ["vantage_api_pool_y"]
    );
    assert_eq!(blocks(text, "toml").len(), 1);
    assert_eq!(blocks(text, "rs").len(), 1);
}
