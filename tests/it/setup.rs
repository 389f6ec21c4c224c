//! The files a newcomer relies on: the compose file is valid, has every part, holds no
//! default secret and publishes only nginx (and, to this host, the servers' admin ports
//! and the dashboards).

use std::process::Command;

use crate::support::said;

const FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docker-compose.yml");

/// What `dev/compose-env.sh` makes up.
const SECRETS: [&str; 7] = [
    "SECKILL_ADMIN_TOKEN",
    "SECKILL_JWT_SECRET",
    "SECKILL_PAYMENT_SECRET",
    "SECKILL_MYSQL_PASSWORD",
    "SECKILL_RABBITMQ_PASSWORD",
    "SECKILL_ERLANG_COOKIE",
    "SECKILL_GRAFANA_PASSWORD",
];

/// `docker compose` (the plugin) or Debian's `docker-compose`, whichever is installed
/// (`./dev/test.sh` installs the latter).
fn compose() -> Command {
    let candidates: [&[&str]; 2] = [&["docker", "compose"], &["docker-compose"]];
    for tool in candidates {
        let works = Command::new(tool[0])
            .args(&tool[1..])
            .arg("version")
            .output()
            .is_ok_and(|o| o.status.success());
        if works {
            let mut command = Command::new(tool[0]);
            command.args(&tool[1..]).args(["-f", FILE]);
            for secret in SECRETS {
                command.env_remove(secret);
            }
            return command;
        }
    }
    panic!("neither `docker compose` nor `docker-compose`: run ./dev/tools.sh docker-compose");
}

fn with_secrets(command: &mut Command) -> &mut Command {
    for secret in SECRETS {
        command.env(secret, format!("test-{}", secret.to_lowercase()));
    }
    command
}

#[test]
fn docker_compose_config_is_valid() {
    let output = with_secrets(compose().args(["config", "--quiet"]))
        .output()
        .expect("compose runs");
    assert!(output.status.success(), "compose config: {}", said(&output));
    // The full picture: stores, broker, two servers, nginx, monitoring; and the cluster
    // profile's fleet.
    let services = with_secrets(compose().args(["--profile", "cluster", "config", "--services"]))
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
}

/// Without its secrets compose refuses to start, and says how to make them.
#[test]
fn docker_compose_refuses_to_start_without_its_secrets() {
    let output = compose()
        .args(["config", "--quiet"])
        .output()
        .expect("compose runs");
    assert!(!output.status.success(), "compose accepted no secrets");
    assert!(
        said(&output).contains("./dev/compose-env.sh > .env"),
        "{}",
        said(&output)
    );
    // The script makes every one of them.
    let made = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/dev/compose-env.sh"))
        .output()
        .expect("compose-env.sh runs");
    let made = String::from_utf8_lossy(&made.stdout);
    for secret in SECRETS {
        let line = made
            .lines()
            .find(|l| l.starts_with(&format!("{secret}=")))
            .unwrap_or_else(|| panic!("compose-env.sh does not make {secret}"));
        assert!(line.len() > secret.len() + 40, "{line}");
    }
}

/// No secret has a default in the file; RabbitMQ's management port is not published and
/// nobody logs in as guest; every published port but nginx's is bound to loopback.
#[test]
fn docker_compose_publishes_only_nginx_and_has_no_default_secret() {
    let file = std::fs::read_to_string(FILE).unwrap();
    for secret in SECRETS {
        assert!(
            !file.contains(&format!("${{{secret}:-")),
            "{secret} has a default"
        );
        assert!(
            file.contains(&format!("${{{secret}:?")),
            "{secret} is not required"
        );
    }
    assert!(
        !file.contains("15672"),
        "RabbitMQ's management port is published"
    );
    assert!(!file.contains("guest"), "a guest login");
    let mut published = Vec::new();
    let mut in_ports = false;
    for line in file.lines() {
        let trimmed = line.trim();
        if trimmed == "ports:" {
            in_ports = true;
        } else if in_ports && trimmed.starts_with("- ") {
            let port = trimmed.trim_start_matches("- ").trim_matches('"');
            published.push(
                port.split(' ')
                    .next()
                    .unwrap_or_default()
                    .trim_matches('"')
                    .to_owned(),
            );
        } else {
            in_ports = false;
        }
    }
    let open: Vec<&String> = published
        .iter()
        .filter(|p| !p.starts_with("127.0.0.1:"))
        .collect();
    assert_eq!(open, ["8000:8000", "8100:8100"], "published: {published:?}");
}
