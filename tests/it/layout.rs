//! The crate's shape: no module of `src/` reaches, through the modules it names, back to
//! itself (a circle makes every one of them the place to start reading). Modules are files;
//! what a file names is every `crate::…` and `super::…` path outside its tests, and every
//! path through a module it imported (`use crate::items::repo;` … `repo::get`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// A path a file names, and the name it imports it under (`as`, or its last segment).
struct Named {
    path: Module,
    alias: Option<String>,
}

#[test]
fn no_module_of_src_names_a_module_that_names_it_back() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = BTreeMap::new();
    collect(&src, &src, &mut files);
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    let named: BTreeMap<Module, BTreeSet<Module>> = files
        .iter()
        .map(|(module, text)| (module.clone(), names(module, text, &modules)))
        .collect();
    let circles: Vec<String> = named
        .keys()
        .filter_map(|start| circle_through(start, &named))
        .map(|circle| {
            circle
                .iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" → ")
        })
        .collect();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
    // The check sees what it should: the server names its features.
    assert!(
        named[&vec!["app".to_owned()]].contains(&vec!["purchase".to_owned(), "api".to_owned()])
    );
}

/// Every `.rs` file under `dir` as its module path (`mod.rs`, `lib.rs`, `main.rs` are their
/// folder's module), with its text before its tests.
fn collect(root: &Path, dir: &Path, files: &mut BTreeMap<Module, String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(root, &path, files);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let relative = path.strip_prefix(root).unwrap().with_extension("");
        let mut module: Module = relative
            .iter()
            .map(|part| part.to_string_lossy().into_owned())
            .collect();
        if matches!(
            module.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            module.pop();
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap_or_default();
        let code: String = code
            .lines()
            .map(|line| line.split("//").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n");
        files.insert(module, code);
    }
}

/// The other modules `text` (the code of `module`) names.
fn names(module: &Module, text: &str, modules: &BTreeSet<Module>) -> BTreeSet<Module> {
    let mut paths = Vec::new();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", parent(module))] {
        for at in path_starts(text, prefix) {
            use_tree(&text[at + prefix.len()..], base.clone(), &mut paths);
        }
    }
    // Modules imported by name, and the paths through them.
    let imported: Vec<(String, Module)> = paths
        .iter()
        .filter(|named| modules.contains(&named.path))
        .filter_map(|named| {
            let name = named.alias.clone().or_else(|| named.path.last().cloned())?;
            Some((name, named.path.clone()))
        })
        .collect();
    for (name, target) in imported {
        let prefix = format!("{name}::");
        for at in path_starts(text, &prefix) {
            use_tree(&text[at + prefix.len()..], target.clone(), &mut paths);
        }
    }
    paths
        .into_iter()
        .filter_map(|named| {
            (1..=named.path.len())
                .rev()
                .map(|n| named.path[..n].to_vec())
                .find(|candidate| modules.contains(candidate))
        })
        .filter(|named| named != module && !named.is_empty())
        .collect()
}

/// Where paths starting with `prefix` begin in `text` (not in the middle of another path).
fn path_starts<'t>(text: &'t str, prefix: &'t str) -> impl Iterator<Item = usize> + 't {
    text.match_indices(prefix)
        .map(|(at, _)| at)
        .filter(move |at| {
            let before = text[..*at].chars().last();
            !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
        })
}

/// A `mod.rs` module's `super` is its folder's parent, as is a plain file's.
fn parent(module: &Module) -> Module {
    module[..module.len().saturating_sub(1)].to_vec()
}

/// The paths of a use tree such as `a::b::{c, d::{e, f}}` (or a plain `a::b::c`), each
/// appended to `base`.
fn use_tree(text: &str, base: Module, out: &mut Vec<Named>) -> usize {
    let mut path = base;
    let mut at = 0;
    loop {
        let rest = &text[at..];
        let skipped = rest.len() - rest.trim_start().len();
        at += skipped;
        let rest = &text[at..];
        if let Some(inner) = rest.strip_prefix('{') {
            at += 1;
            let mut consumed = 0;
            loop {
                let part = &inner[consumed..];
                let trimmed = part.trim_start();
                consumed += part.len() - trimmed.len();
                if trimmed.starts_with('}') {
                    return at + consumed + 1;
                }
                consumed += use_tree(&inner[consumed..], path.clone(), out);
                let part = &inner[consumed..];
                let trimmed = part.trim_start();
                consumed += part.len() - trimmed.len();
                match trimmed.chars().next() {
                    Some(',') => consumed += 1,
                    Some('}') => return at + consumed + 1,
                    _ => return at + consumed,
                }
            }
        }
        let ident: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        at += ident.len();
        if !ident.is_empty() && ident != "self" {
            path.push(ident);
        }
        if text[at..].starts_with("::") {
            at += 2;
        } else {
            // ` as name`, a `*`, or the end of the path.
            let end = text[at..]
                .find([',', '}', ';', '('])
                .map_or(text.len(), |n| at + n);
            let alias = text[at..].trim_start().strip_prefix("as ").map(|rest| {
                rest.trim_start()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect()
            });
            let next = if alias.is_some() { end } else { at };
            out.push(Named { path, alias });
            return next;
        }
    }
}

/// A circle of named modules from `start` back to it, if there is one.
fn circle_through(
    start: &Module,
    named: &BTreeMap<Module, BTreeSet<Module>>,
) -> Option<Vec<Module>> {
    let mut stack = vec![(start.clone(), vec![start.clone()])];
    let mut seen = BTreeSet::new();
    while let Some((module, trail)) = stack.pop() {
        for next in named.get(&module).into_iter().flatten() {
            if next == start {
                let mut circle = trail.clone();
                circle.push(start.clone());
                return Some(circle);
            }
            if seen.insert(next.clone()) {
                let mut longer = trail.clone();
                longer.push(next.clone());
                stack.push((next.clone(), longer));
            }
        }
    }
    None
}
