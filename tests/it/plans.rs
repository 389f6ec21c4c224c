//! The k6 and JMeter plans under loadtest/: the k6 script parses as JavaScript and the
//! JMeter plan is well-formed XML that sends the right request.

use std::path::Path;
use std::process::Command;

const LOADTEST: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/loadtest");

fn node_check(script: &Path) -> std::process::Output {
    Command::new("node")
        .arg("--check")
        .arg(script)
        .output()
        .expect("node (Node.js 20 or newer)")
}

#[test]
fn the_k6_script_parses_and_a_broken_copy_does_not() {
    let script = Path::new(LOADTEST).join("k6/flashbuy.js");
    let checked = node_check(&script);
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    let source = std::fs::read_to_string(&script).unwrap();
    for needed in [
        "/api/flashbuy",
        "X-Client-Time",
        "Authorization",
        "thresholds",
        "p(99)",
    ] {
        assert!(source.contains(needed), "the k6 script lacks {needed}");
    }

    // The same check on a copy with one brace missing fails, so the check above means
    // something (beside its package.json, which makes it an ES module for Node).
    let dir = std::env::temp_dir().join(format!("seckill-k6-{}", ulid::Ulid::new()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        Path::new(LOADTEST).join("k6/package.json"),
        dir.join("package.json"),
    )
    .unwrap();
    let broken = dir.join("flashbuy.js");
    std::fs::write(
        &broken,
        source.replacen("export function buy() {", "export function buy() ", 1),
    )
    .unwrap();
    let checked = node_check(&broken);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !checked.status.success(),
        "node --check accepted a broken script"
    );
}

#[test]
fn the_jmeter_plan_is_well_formed_and_posts_a_purchase() {
    let text = std::fs::read_to_string(Path::new(LOADTEST).join("jmeter/flashbuy.jmx")).unwrap();
    let plan = roxmltree::Document::parse(&text).expect("well-formed XML");
    let root = plan.root_element();
    assert_eq!(root.tag_name().name(), "jmeterTestPlan");

    let prop = |node: roxmltree::Node, name: &str| {
        node.children()
            .find(|c| c.attribute("name") == Some(name))
            .and_then(|c| c.text())
            .map(str::to_owned)
    };
    let sampler = root
        .descendants()
        .find(|n| n.has_tag_name("HTTPSamplerProxy"))
        .expect("an HTTP sampler");
    assert_eq!(
        prop(sampler, "HTTPSampler.path").as_deref(),
        Some("/api/flashbuy")
    );
    assert_eq!(prop(sampler, "HTTPSampler.method").as_deref(), Some("POST"));
    let body = sampler
        .descendants()
        .find(|n| n.attribute("name") == Some("Argument.value"))
        .and_then(|n| n.text())
        .unwrap();
    assert!(body.contains("\"item_id\""), "{body}");

    let headers: Vec<(String, String)> = root
        .descendants()
        .filter(|n| n.attribute("elementType") == Some("Header"))
        .map(|h| {
            (
                prop(h, "Header.name").unwrap_or_default(),
                prop(h, "Header.value").unwrap_or_default(),
            )
        })
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("no {name} header in {headers:?}"))
    };
    assert_eq!(header("Authorization"), "Bearer ${token}");
    assert_eq!(header("X-Client-Time"), "${__time()}");
    assert_eq!(header("Content-Type"), "application/json");

    // The tokens come from a CSV into ${token}; the answers are asserted by status code.
    let csv = root
        .descendants()
        .find(|n| n.has_tag_name("CSVDataSet"))
        .expect("a CSV data set");
    assert_eq!(prop(csv, "variableNames").as_deref(), Some("token"));
    let codes: Vec<&str> = root
        .descendants()
        .filter(|n| n.has_tag_name("ResponseAssertion"))
        .flat_map(|a| a.descendants())
        .filter(|n| n.has_tag_name("stringProp"))
        .filter_map(|n| n.text())
        .collect();
    for code in ["202", "409", "410", "429"] {
        assert!(codes.contains(&code), "no assertion accepts {code}");
    }
    assert!(root.descendants().any(|n| n.has_tag_name("ThreadGroup")));
}
