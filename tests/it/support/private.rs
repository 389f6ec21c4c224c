//! Private servers for fault tests, on spare ports and in their own data directories,
//! owned by the test that starts them — never the machine's shared Redis, MariaDB or
//! RabbitMQ. Each can be killed (SIGKILL: a crash, nothing flushed, nothing said) and
//! started again on the same port with the same data; each is killed on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{eventually, free_port, signal};

/// A fresh directory under the system's temp dir, removed by the owner's drop.
pub fn scratch(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "seckill-{what}-{}",
        ulid::Ulid::new().to_string().to_lowercase()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Hands a directory to a service account (the servers drop root to it).
pub(super) fn give_to(dir: &Path, user: &str) {
    let status = Command::new("chown")
        .args(["-R", &format!("{user}:{user}"), &dir.display().to_string()])
        .status()
        .expect("chown");
    assert!(
        status.success(),
        "chown {user} {}: the private MariaDB and RabbitMQ of the fault tests need root (as dev/test.sh and CI run)",
        dir.display()
    );
}

pub(super) async fn listening(port: u16, what: &str, within: Duration) {
    eventually(within, &format!("{what} listening on {port}"), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
}

/// A private `redis-server` on a spare port, for tests that stop, freeze or flush Redis.
pub struct PrivateRedis {
    pub port: u16,
    args: Vec<String>,
    /// Its data directory, when it keeps an append-only file.
    dir: Option<PathBuf>,
    child: Child,
}

impl PrivateRedis {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// With more `redis-server` options (`--rename-command CONFIG ""`, …), keeping nothing.
    pub async fn start_with(options: &[&str]) -> Self {
        let mut args: Vec<String> = ["--save", "", "--appendonly", "no"]
            .map(String::from)
            .to_vec();
        args.extend(options.iter().map(|o| o.to_string()));
        Self::launch(free_port(), args, None).await
    }

    /// Keeping an append-only file, fsynced as `appendfsync` says (`everysec`, `always`).
    pub async fn start_persistent(appendfsync: &str) -> Self {
        let dir = scratch("redis");
        let args = [
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            appendfsync,
            "--dir",
            &dir.display().to_string(),
        ]
        .map(String::from)
        .to_vec();
        Self::launch(free_port(), args, Some(dir)).await
    }

    async fn launch(port: u16, args: Vec<String>, dir: Option<PathBuf>) -> Self {
        let child = Self::spawn(port, &args);
        let redis = Self {
            port,
            args,
            dir,
            child,
        };
        redis.wait_ready().await;
        redis
    }

    fn spawn(port: u16, args: &[String]) -> Child {
        Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server on PATH")
    }

    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.ping().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "private redis-server did not start"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub async fn ping(&self) -> redis::RedisResult<()> {
        let mut conn = redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await?;
        redis::cmd("PING").query_async(&mut conn).await
    }

    pub async fn cmd(&self, args: &[&str]) -> redis::Value {
        let mut conn = redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut conn).await.unwrap()
    }

    /// SIGSTOP: the process keeps its socket but answers nothing (a hung Redis).
    pub fn freeze(&self) {
        signal(self.child.id(), "STOP");
    }

    pub fn thaw(&self) {
        signal(self.child.id(), "CONT");
    }

    /// SIGKILL: a crash, with whatever its persistence had written.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port, with the same data.
    pub async fn restart(&mut self) {
        self.child = Self::spawn(self.port, &self.args);
        self.wait_ready().await;
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.thaw();
        self.kill();
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A fresh directory (named for `what`) holding a new MariaDB data directory, `data`
/// (`mariadb-install-db`), and a temp directory of its own, `tmp` (see [`mariadb_tmpdir`]),
/// all owned by the server's account.
pub(super) fn mariadb_data(what: &str) -> PathBuf {
    let dir = scratch(what);
    std::fs::create_dir_all(dir.join("tmp")).unwrap();
    give_to(&dir, "mysql");
    let log = dir.join("install-db.log");
    let output = std::fs::File::create(&log).unwrap();
    let installed = Command::new("mariadb-install-db")
        .args([
            "--no-defaults".to_owned(),
            format!("--datadir={}", dir.join("data").display()),
            mariadb_tmpdir(&dir),
            "--user=mysql".to_owned(),
            "--skip-test-db".to_owned(),
        ])
        .stdout(output.try_clone().unwrap())
        .stderr(output)
        .status()
        .expect("mariadb-install-db on PATH");
    assert!(
        installed.success(),
        "mariadb-install-db: {installed}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    dir
}

/// The `--tmpdir` of a private MariaDB in `dir`. Sharing the system's `/tmp`, two
/// `mariadb-install-db` bootstraps run at once (a Galera cluster's nodes beside another
/// test's) removed each other's `#sql-temptable-…` files and one failed with "Unknown
/// table 'mysql.tmp_user_nopasswd'" (2 of 8 run at once here; a CI run lost its Galera test).
pub(super) fn mariadb_tmpdir(dir: &Path) -> String {
    format!("--tmpdir={}", dir.join("tmp").display())
}

/// A private MariaDB server (`mariadb-install-db` data of its own, no grant tables: root
/// without a password, like the shared one).
pub struct PrivateMariaDb {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PrivateMariaDb {
    pub async fn start() -> Self {
        let dir = mariadb_data("mariadb");
        let mut db = Self {
            port: free_port(),
            dir,
            child: None,
        };
        db.launch().await;
        db
    }

    /// The server's URL (tests add their database).
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }

    async fn launch(&mut self) {
        let child = Command::new("mariadbd")
            .args([
                "--no-defaults".to_owned(),
                format!("--datadir={}", self.dir.join("data").display()),
                format!("--port={}", self.port),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--socket={}", self.dir.join("mysqld.sock").display()),
                format!("--pid-file={}", self.dir.join("mysqld.pid").display()),
                format!("--log-error={}", self.dir.join("error.log").display()),
                mariadb_tmpdir(&self.dir),
                "--user=mysql".to_owned(),
                "--skip-grant-tables".to_owned(),
                "--innodb-buffer-pool-size=64M".to_owned(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("mariadbd on PATH");
        self.child = Some(child);
        listening(self.port, "private MariaDB", Duration::from_secs(30)).await;
    }

    /// SIGKILL: a crash (InnoDB recovers its log at the next start).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub async fn restart(&mut self) {
        self.launch().await;
    }
}

impl Drop for PrivateMariaDb {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
