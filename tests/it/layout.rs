//! The crate's shape: its modules in layers, each naming only its own layer and those below
//! (the table is [`LAYERS`]); no folder and no module of `src/` reaches, through the modules
//! it names, back to itself (a circle makes every one of them the place to start reading).
//! Modules are files;
//! what a file names is every `crate::…` and `super::…` path outside its tests, and every
//! path through a module it imported (`use crate::items::repo;` … `repo::get`). And no
//! function of `src/` runs over [`MOST_LINES`] lines. docs/development.md's table of the
//! layers is [`LAYERS`], and its diagram of them is drawn from it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Module = Vec<String>;

/// A path a file names, and the name it imports it under (`as`, or its last segment).
struct Named {
    path: Module,
    alias: Option<String>,
}

/// The layers, lowest first: a module may name modules of its own layer and of the layers
/// below, never one above. Each layer lists its units: a top-level module (a folder with
/// everything in it, or a file), or a module inside one that sits elsewhere (the orders
/// table's rows, below the items that ask about orders). A feature's HTTP surface — its
/// `api` and `admin` and the files only they use ([`SURFACE`]) — sits above the edge that
/// serves it. docs/development.md shows the same table, and the diagram [`diagram`] draws
/// from it.
const LAYERS: &[(&str, &[&str])] = &[
    ("ground", &["domain", "config", "error"]),
    ("parts", &["keys", "telemetry", "auth"]),
    (
        "stores",
        &["store", "lua", "clock", "broker", "background", "deps"],
    ),
    ("records", &["orders::repo"]),
    (
        "machinery",
        &["lock", "signals", "marks", "delay_queue", "outbox"],
    ),
    ("features", &["items", "shops", "breaker"]),
    (
        "operations",
        &[
            "orders",
            "payments",
            "draw",
            "warmup",
            "purchase",
            "scheduler",
            "invariants",
            "queue",
        ],
    ),
    ("edge", &["http", "state"]),
    ("surface", &["health"]),
    (
        "whole",
        &["app", "rehearsal", "cli", "testing", "main", "lib"],
    ),
];

/// A feature's HTTP surface besides its `api` and `admin`: the files only they use.
const SURFACE: &[&str] = &[
    "items::bulk",
    "items::body",
    "purchase::entry",
    "purchase::refusal",
    "queue::view",
];

/// The page that shows [`LAYERS`] to a reader: its table, and the diagram drawn from it.
const DEVELOPMENT: &str = "docs/development.md";

/// The table of "### The layers" in docs/development.md is [`LAYERS`]: the same layers,
/// highest first, each row naming the same units (files and folders there, modules here;
/// the surface's row also names the features' `api.rs` and `admin.rs` and [`SURFACE`]).
#[test]
fn the_layer_table_of_the_development_page_is_layers() {
    let page = development_page();
    let section = &page[layers_section(&page)];
    let rows: Vec<(String, BTreeSet<String>)> = section
        .lines()
        // The section's first table, its head and the line under it skipped.
        .skip_while(|line| !line.starts_with("| layer "))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').collect();
            let units = cells.get(2).copied().unwrap_or_default();
            // What is in backticks is a file or a folder; the words between are prose.
            let units = units.split('`').skip(1).step_by(2).map(|file| {
                let file = file.trim_end_matches('/').trim_end_matches(".rs");
                file.replace('/', "::")
            });
            (cells[1].trim().to_owned(), units.collect())
        })
        .collect();
    let layers: Vec<(String, BTreeSet<String>)> = LAYERS
        .iter()
        .rev()
        .map(|(name, units)| {
            let mut units: BTreeSet<String> = units.iter().map(|u| (*u).to_owned()).collect();
            if *name == "surface" {
                units.extend(
                    ["api", "admin"]
                        .into_iter()
                        .chain(SURFACE.iter().copied())
                        .map(str::to_owned),
                );
            }
            ((*name).to_owned(), units)
        })
        .collect();
    assert_eq!(
        rows, layers,
        "the table of {DEVELOPMENT} (left) is not LAYERS (right): change one to match the other"
    );
}

/// The diagram under the table of "### The layers" in docs/development.md is the one
/// [`diagram`] draws from [`LAYERS`], so the picture cannot drift from the checked table.
/// `SECKILL_WRITE_DIAGRAM=1` draws it there again instead of comparing.
#[test]
fn the_crate_diagram_is_drawn_from_the_layer_table() {
    let drawn = diagram();
    if std::env::var_os("SECKILL_WRITE_DIAGRAM").is_some() {
        let page = development_page();
        let block = diagram_block(&page);
        let page = format!("{}{drawn}{}", &page[..block.start], &page[block.end..]);
        std::fs::write(development_path(), page).expect("docs/development.md can be written");
    }
    let page = development_page();
    let committed = &page[diagram_block(&page)];
    assert!(
        committed == drawn,
        "the diagram of the layers in {DEVELOPMENT} is not the one LAYERS draws:\n{drawn}\n\
         write it again with \
         `SECKILL_WRITE_DIAGRAM=1 cargo test --test it layout::the_crate_diagram_is_drawn_from_the_layer_table`"
    );
}

fn development_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(DEVELOPMENT)
}

fn development_page() -> String {
    std::fs::read_to_string(development_path()).expect("docs/development.md can be read")
}

/// Where "### The layers" runs in the page: from its heading to the next one.
fn layers_section(page: &str) -> std::ops::Range<usize> {
    let heading = "### The layers\n";
    let start = page
        .find(heading)
        .expect("docs/development.md has a section \"### The layers\"")
        + heading.len();
    let end = page[start..]
        .find("\n#")
        .map_or(page.len(), |n| start + n + 1);
    start..end
}

/// Where the text of the section's first ```` ```text ```` block runs: after its opening
/// fence, up to its closing one.
fn diagram_block(page: &str) -> std::ops::Range<usize> {
    let section = layers_section(page);
    let fence = "```text\n";
    let start = page[section.clone()]
        .find(fence)
        .map(|n| section.start + n + fence.len())
        .expect("the layers' section of docs/development.md has a ```text block");
    let end = page[start..section.end]
        .find("```")
        .map(|n| start + n)
        .expect("the ```text block of the layers' section is closed within it");
    start..end
}

/// How wide the text inside a layer's box is, so the drawing fits a page without scrolling.
const INSIDE: usize = 64;

/// [`LAYERS`] drawn as boxes, the highest on top, each with its units (the surface's also
/// with what [`unit`] puts there). An arrow joins a box to the one below because a layer
/// may name the layers below it; none points up because none may name a layer above.
fn diagram() -> String {
    let mut drawn = String::from(
        "A box's modules may name modules of their own box and of the boxes below it (▼),\n\
         never of one above.\n\n",
    );
    for (rank, (name, units)) in LAYERS.iter().enumerate().rev() {
        let mut units: Vec<String> = units.iter().map(|u| (*u).to_owned()).collect();
        if *name == "surface" {
            units.push("each feature's api and admin".to_owned());
            units.extend(SURFACE.iter().map(|u| (*u).to_owned()));
        }
        drawn.push_str(&layer_box(name, &units));
        if rank > 0 {
            drawn.push_str(&format!("{:>width$}\n", "▼", width = INSIDE / 2 + 2));
        }
    }
    drawn
}

/// One layer's box: its name in the top edge, its units in lines of at most [`INSIDE`]
/// characters, a unit never cut.
fn layer_box(name: &str, units: &[String]) -> String {
    let mut lines = vec![String::new()];
    for (n, unit) in units.iter().enumerate() {
        let unit = if n + 1 < units.len() {
            format!("{unit},")
        } else {
            unit.clone()
        };
        let line = lines.last_mut().expect("lines start with one");
        if line.is_empty() {
            line.push_str(&unit);
        } else if line.chars().count() + 1 + unit.chars().count() <= INSIDE {
            line.push(' ');
            line.push_str(&unit);
        } else {
            lines.push(unit);
        }
    }
    let title = format!("─ {name} ");
    let mut drawn = format!(
        "┌{title}{}┐\n",
        "─".repeat(INSIDE + 2 - title.chars().count())
    );
    for line in lines {
        drawn.push_str(&format!("│ {line:<INSIDE$} │\n"));
    }
    drawn.push_str(&format!("└{}┘\n", "─".repeat(INSIDE + 2)));
    drawn
}

#[test]
fn no_module_of_src_names_a_module_of_a_layer_above_it() {
    let named = named_in(&src());
    let upward = upward(&named);
    assert!(
        upward.is_empty(),
        "imports from a lower layer to a higher one:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_folder_of_src_names_a_folder_that_names_it_back() {
    let named = named_in(&src());
    let circles = circles(&folders(&named));
    assert!(
        circles.is_empty(),
        "circles among folders:\n{}",
        circles.join("\n")
    );
}

#[test]
fn no_module_of_src_names_a_module_that_names_it_back() {
    let named = named_in(&src());
    let circles = circles(&named);
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

/// The checks catch what they are for: an upward import and a circle of folders planted in
/// a copy of the tree's graph.
#[test]
fn the_layer_checks_find_a_planted_upward_import_and_a_folder_circle() {
    let mut named = named_in(&src());
    let module = |path: &str| -> Module { path.split("::").map(str::to_owned).collect() };
    named
        .get_mut(&module("domain"))
        .unwrap()
        .insert(module("orders::consumer"));
    let upward = upward(&named);
    assert_eq!(
        upward,
        ["domain → orders::consumer (ground below operations)"]
    );

    let mut named = named_in(&src());
    named
        .get_mut(&module("lua"))
        .unwrap()
        .insert(module("keys"));
    named
        .get_mut(&module("keys"))
        .unwrap()
        .insert(module("lua"));
    let circles = circles(&folders(&named));
    assert!(
        circles
            .iter()
            .any(|c| c.contains("keys") && c.contains("lua")),
        "{circles:?}"
    );
}

/// The crate shows only what something outside it reads: every `pub mod` of `src/lib.rs`
/// is named as `seckill::…` by the command (`src/main.rs`), the tests or the load-test
/// tools, and every other module is `pub(crate)` (what the tests reach inside goes through
/// `seckill::testing`).
#[test]
fn every_public_module_has_a_reader_outside_the_crate() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut outside = std::fs::read_to_string(src().join("main.rs")).unwrap();
    for dir in ["tests", "loadtest"] {
        let mut files = BTreeMap::new();
        collect(&root.join(dir), &root.join(dir), &mut files);
        outside.extend(files.into_values());
    }
    let declared: Vec<&str> = lib
        .lines()
        .filter(|line| line.contains("mod ") && line.ends_with(';'))
        .collect();
    let unread: Vec<&str> = declared
        .iter()
        .filter_map(|line| line.strip_prefix("pub mod ")?.strip_suffix(';'))
        .filter(|module| !outside.contains(&format!("seckill::{module}")))
        .collect();
    assert!(
        unread.is_empty(),
        "public modules nothing outside the crate reads (make them pub(crate)): {unread:?}"
    );
    let neither: Vec<&&str> = declared
        .iter()
        .filter(|line| !line.starts_with("pub mod ") && !line.starts_with("pub(crate) mod "))
        .collect();
    assert!(
        neither.is_empty(),
        "modules neither pub nor pub(crate): {neither:?}"
    );
}

/// The longest a function of `src/` may be, counted from its `fn` line to its closing
/// brace: a longer one does several things, and each deserves a name.
const MOST_LINES: usize = 80;

#[test]
fn no_function_of_src_runs_over_eighty_lines() {
    // The count finds a planted one, and where it ends.
    let planted = format!(
        "pub(crate) async fn long() {{\n    let s = \"{{}}\";\n{}}}\nfn next() {{}}\n",
        "    x();\n".repeat(85)
    );
    assert_eq!(
        functions(&planted),
        [("long".to_owned(), 88), ("next".to_owned(), 1)]
    );
    let mut files = BTreeMap::new();
    collect(&src(), &src(), &mut files);
    let long: Vec<String> = files
        .iter()
        .flat_map(|(module, text)| {
            functions(text)
                .into_iter()
                .filter(|(_, lines)| *lines > MOST_LINES)
                .map(move |(name, lines)| format!("{}::{name}: {lines} lines", module.join("::")))
        })
        .collect();
    assert!(
        long.is_empty(),
        "functions over {MOST_LINES} lines: {long:#?}"
    );
}

/// Each function of a file's code (as [`collect`] reads it: tests and `//` comments cut)
/// with its length in lines, by its braces (those of format strings come in pairs).
fn functions(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        let mut words = line.split_whitespace().peekable();
        while let Some(word) = words.peek() {
            if word.starts_with("pub") || matches!(*word, "async" | "const" | "unsafe") {
                words.next();
            } else {
                break;
            }
        }
        if words.next() != Some("fn") {
            continue;
        }
        let name = words
            .next()
            .map(|w| w.split(['(', '<']).next().unwrap_or(w).to_owned())
            .unwrap_or_default();
        let mut depth = 0i64;
        let mut opened = false;
        for (n, body) in lines[at..].iter().enumerate() {
            for c in body.chars() {
                match c {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth == 0 {
                found.push((name.clone(), n + 1));
                break;
            }
            if !opened && body.trim_end().ends_with(';') {
                break;
            }
        }
    }
    found
}

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every module of `src` and the other modules it names.
fn named_in(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = BTreeMap::new();
    collect(src, src, &mut files);
    let modules: BTreeSet<Module> = files.keys().cloned().collect();
    files
        .iter()
        .map(|(module, text)| (module.clone(), names(module, text, &modules)))
        .collect()
}

/// A module's unit (the longest entry of [`LAYERS`] it lies in, with `surface` appended
/// for a feature's HTTP surface), its layer's rank and the layer's name.
fn unit(module: &Module) -> (Module, usize, &'static str) {
    let joined = module.join("::");
    let last = module.last().map_or("", String::as_str);
    let surface =
        module.len() > 1 && (matches!(last, "api" | "admin") || SURFACE.contains(&joined.as_str()));
    let within = |entry: &str| joined == entry || joined.starts_with(&format!("{entry}::"));
    let (rank, name, entry) = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(rank, (name, entries))| entries.iter().map(move |e| (rank, *name, *e)))
        .filter(|(_, _, entry)| within(entry) || (joined.is_empty() && *entry == "lib"))
        .max_by_key(|(_, _, entry)| entry.len())
        .unwrap_or_else(|| panic!("{joined} is in no layer: add it to LAYERS"));
    let mut unit: Module = entry.split("::").map(str::to_owned).collect();
    if surface {
        unit.push("surface".to_owned());
        let rank = LAYERS.iter().position(|(n, _)| *n == "surface").unwrap();
        return (unit, rank, "surface");
    }
    (unit, rank, name)
}

/// Every import from a lower layer to a higher one, as `from → to (low below high)`.
fn upward(named: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    let mut found = Vec::new();
    for (module, targets) in named {
        let (_, rank, name) = unit(module);
        for target in targets {
            let (_, target_rank, target_name) = unit(target);
            if target_rank > rank {
                found.push(format!(
                    "{} → {} ({name} below {target_name})",
                    module.join("::"),
                    target.join("::")
                ));
            }
        }
    }
    found
}

/// The graph among the units of [`LAYERS`] (folders, mostly), without the names inside one.
fn folders(named: &BTreeMap<Module, BTreeSet<Module>>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, targets) in named {
        let from = unit(module).0;
        let to: BTreeSet<Module> = targets
            .iter()
            .map(|target| unit(target).0)
            .filter(|to| *to != from)
            .collect();
        graph.entry(from).or_default().extend(to);
    }
    graph
}

/// Every circle of `graph`, one per module it starts from, as `a → b → a`.
fn circles(graph: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<String> {
    graph
        .keys()
        .filter_map(|start| circle_through(start, graph))
        .map(|circle| {
            circle
                .iter()
                .map(|m| m.join("::"))
                .collect::<Vec<_>>()
                .join(" → ")
        })
        .collect()
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
