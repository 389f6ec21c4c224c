//! A private nginx with the project's configuration in front of two servers.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::process::{free_port, signal};
use super::wait::eventually;

/// A private nginx with `nginx/seckill.conf` (installed by `dev/nginx.sh`, as a developer
/// runs it) in front of two servers, on a spare port. Stopped on drop.
pub struct Nginx {
    pub addr: SocketAddr,
    child: Child,
    state: std::path::PathBuf,
}

impl Nginx {
    pub async fn start(api_1: SocketAddr, api_2: SocketAddr) -> Self {
        Self::start_from(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")),
            api_1,
            api_2,
        )
        .await
    }

    /// [`Nginx::start`] with the `dev/nginx.sh`, `nginx/` and `web/` of another checkout.
    pub async fn start_from(
        checkout: &std::path::Path,
        api_1: SocketAddr,
        api_2: SocketAddr,
    ) -> Self {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
        Self::launch(
            Command::new(checkout.join("dev/nginx.sh")),
            addr,
            api_1,
            api_2,
        )
        .await
    }

    /// nginx on `host` of the fleet (port 8000 of its address) in front of two servers on
    /// other hosts; the load generator's host (the machine's own) is exempt from the
    /// per-address limit, as a rehearsal's load hosts are.
    pub async fn start_on(
        hosts: &super::Hosts,
        host: &str,
        api_1: SocketAddr,
        api_2: SocketAddr,
    ) -> Self {
        let mut command = hosts.on(host, concat!(env!("CARGO_MANIFEST_DIR"), "/dev/nginx.sh"));
        command.env("SECKILL_LOAD_HOSTS", hosts.checker().to_string());
        Self::launch(command, SocketAddr::new(hosts.ip(host), 8000), api_1, api_2).await
    }

    async fn launch(
        mut command: Command,
        addr: SocketAddr,
        api_1: SocketAddr,
        api_2: SocketAddr,
    ) -> Self {
        let state = std::env::temp_dir().join(format!(
            "seckill-nginx-{}",
            ulid::Ulid::new().to_string().to_lowercase()
        ));
        let child = command
            .args([
                addr.to_string(),
                api_1.to_string(),
                api_2.to_string(),
                state.display().to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("dev/nginx.sh");
        let nginx = Self { addr, child, state };
        eventually(Duration::from_secs(20), "nginx listening", || async {
            tokio::net::TcpStream::connect(addr)
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        nginx
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: the master stops its workers and exits.
        signal(self.child.id(), "TERM");
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.state);
    }
}
