//! The files a newcomer relies on: the compose file is valid.

use std::process::Command;

/// `docker compose config` (the plugin) or, on Debian, `docker-compose config` (the
/// standalone package); skipped, loudly, where neither exists.
#[test]
fn docker_compose_config_is_valid() {
    let file = format!("{}/docker-compose.yml", env!("CARGO_MANIFEST_DIR"));
    let candidates: [&[&str]; 2] = [&["docker", "compose"], &["docker-compose"]];
    for tool in candidates {
        let works = Command::new(tool[0])
            .args(&tool[1..])
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if !works {
            continue;
        }
        let output = Command::new(tool[0])
            .args(&tool[1..])
            .args(["-f", &file, "config", "--quiet"])
            .output()
            .expect("compose runs");
        assert!(
            output.status.success(),
            "{} config: {}",
            tool.join(" "),
            String::from_utf8_lossy(&output.stderr)
        );
        return;
    }
    eprintln!("SKIPPED: neither `docker compose` nor `docker-compose` is installed");
}
