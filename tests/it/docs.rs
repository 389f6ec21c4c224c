//! The docs a newcomer follows: every relative link and anchor in `README.md` and
//! `docs/` resolves inside the repository, nothing links outside it, every alert's
//! runbook entry exists, the README stays a page, and its summary of what always holds
//! names every invariant of the contract's §7.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// `README.md` and every page under `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![Path::new(ROOT).join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(Path::new(ROOT).join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// The page's text outside fenced code blocks, inline code removed.
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            let parts: Vec<&str> = line.split('`').collect();
            let outside: String = parts.iter().step_by(2).copied().collect();
            lines.push(outside);
        }
    }
    lines
}

/// The anchors GitHub gives the page's headings (lower case, punctuation dropped, spaces
/// to hyphens; a repeated one gets `-1`, `-2`…).
fn anchors(text: &str) -> HashSet<String> {
    let mut fenced = false;
    let mut seen = HashSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(heading) = line
            .strip_prefix('#')
            .filter(|_| !fenced)
            .map(|h| h.trim_start_matches('#'))
            .and_then(|h| h.strip_prefix(' '))
        else {
            continue;
        };
        let slug: String = heading
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while !seen.insert(unique.clone()) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
    }
    seen
}

/// Every `](target)` of the page's prose.
fn links(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for line in prose(text) {
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            found.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    found
}

/// Every relative link of README.md and docs/ names a file of the repository, and an
/// anchor one of that page's headings; none leaves the repository.
#[test]
fn every_link_and_anchor_resolves_inside_the_repository() {
    let root = Path::new(ROOT).canonicalize().expect("root");
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        let dir = page.parent().expect("a folder");
        for link in links(&text) {
            let name = page
                .strip_prefix(ROOT)
                .unwrap_or(&page)
                .display()
                .to_string();
            if link.starts_with("https://") || link.starts_with("http://") {
                continue;
            }
            assert!(!link.starts_with('/'), "{name}: an absolute link {link}");
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                dir.join(path)
            };
            let target = target
                .canonicalize()
                .unwrap_or_else(|_| panic!("{name}: {link} names nothing"));
            assert!(
                target.starts_with(&root),
                "{name}: {link} leaves the repository"
            );
            if !anchor.is_empty() {
                let heads = anchors(&std::fs::read_to_string(&target).expect("target"));
                assert!(
                    heads.contains(anchor),
                    "{name}: {link}: no such heading (there are {heads:?})"
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 40, "only {checked} links: the parser lost them");
}

/// Every alert's `runbook_url` names a heading of docs/operations.md.
#[test]
fn every_alert_has_its_runbook_entry() {
    let rules = std::fs::read_to_string(Path::new(ROOT).join("monitoring/alerts.yml")).unwrap();
    let operations = std::fs::read_to_string(Path::new(ROOT).join("docs/operations.md")).unwrap();
    let heads = anchors(&operations);
    let urls: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: docs/operations.md#"))
        .collect();
    assert_eq!(
        urls.len(),
        rules.matches("- alert: ").count(),
        "an alert without a runbook link"
    );
    for anchor in urls {
        assert!(heads.contains(anchor), "no runbook entry #{anchor}");
    }
}

/// The README is a page a newcomer reads top to bottom; the rest lives in docs/.
#[test]
fn the_readme_stays_a_page_and_the_contract_is_in_the_repository() {
    let readme = std::fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines");
    let contract = std::fs::read_to_string(Path::new(ROOT).join("docs/contract.md")).unwrap();
    for part in [
        "## 1. What runs",
        "## 3. The purchase",
        "## 7. What must always hold",
        "SECKILL_SALE_RETENTION_S",
    ] {
        assert!(contract.contains(part), "docs/contract.md lacks {part}");
    }
}

/// The names of a numbered list's bold items (`1. **Name.**` or `1. **Name** —`) in the
/// section under `heading`.
fn invariant_names(text: &str, heading: &str) -> Vec<String> {
    let section = text
        .split_once(heading)
        .map(|(_, rest)| rest)
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| {
            let (number, rest) = line.split_once(". **")?;
            number.parse::<u32>().ok()?;
            let name = rest.split("**").next()?;
            Some(name.trim_end_matches('.').to_owned())
        })
        .collect()
}

/// The README's summary of what always holds names the contract's invariants of §7, in
/// its order: a new one in the contract must reach the page a newcomer reads first.
#[test]
fn the_readme_summarises_every_invariant_of_the_contract() {
    let read = |path: &str| std::fs::read_to_string(Path::new(ROOT).join(path)).expect(path);
    let contract = invariant_names(&read("docs/contract.md"), "## 7. What must always hold");
    let readme = invariant_names(&read("README.md"), "## What always holds");
    assert!(contract.len() >= 9, "{contract:?}");
    assert_eq!(readme, contract);
}

/// Every report under `loadtest/results/` that README.md or docs/ names — as a link or in
/// code — is committed, and says what a reader needs to rerun it: the command and the commit.
#[test]
fn every_report_the_docs_name_is_committed_with_its_command() {
    let mut named = HashSet::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        for (at, _) in text.match_indices("loadtest/results/") {
            let file: String = text[at..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || "/._-".contains(*c))
                .collect();
            // The folder itself, linked as where the reports are.
            if !file.ends_with('/') {
                named.insert((page.display().to_string(), file));
            }
        }
    }
    assert!(named.len() >= 4, "only {} reports named", named.len());
    for (page, file) in named {
        let path = Path::new(ROOT).join(&file);
        let report = std::fs::read_to_string(&path)
            .unwrap_or_else(|_| panic!("{page} names {file}, which is not committed"));
        let report: serde_json::Value =
            serde_json::from_str(&report).unwrap_or_else(|e| panic!("{file}: {e}"));
        for field in ["command", "commit"] {
            assert!(report[field].is_string(), "{file} has no {field}");
        }
    }
}
