//! The files a newcomer relies on: the compose file is valid and has every part.

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
        // The full picture: stores, broker, two servers, nginx, monitoring; and the
        // cluster profile's fleet.
        let services = Command::new(tool[0])
            .args(&tool[1..])
            .args(["-f", &file, "--profile", "cluster", "config", "--services"])
            .output()
            .expect("compose runs");
        let services = String::from_utf8_lossy(&services.stdout);
        let mut services: Vec<&str> = services.lines().collect();
        services.sort_unstable();
        assert_eq!(
            services,
            [
                "api-1",
                "api-2",
                "grafana",
                "mariadb",
                "nginx",
                "nginx-fleet",
                "prometheus",
                "rabbit-1",
                "rabbit-2",
                "rabbit-3",
                "rabbitmq",
                "redis",
                "redis-cluster-init",
                "redis-node-1",
                "redis-node-2",
                "redis-node-3",
                "redis-node-4",
                "redis-node-5",
                "redis-node-6",
                "seckill-1",
                "seckill-2",
                "worker-1",
                "worker-2"
            ]
        );
        return;
    }
    eprintln!("SKIPPED: neither `docker compose` nor `docker-compose` is installed");
}
