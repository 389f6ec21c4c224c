//! `seckill` as a child process (started, stopped as an operator would, killed as a
//! crash would), and signals and ports for private server processes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use serde_json::Value;

use super::env::TestEnv;
use super::server::TestServer;

/// A free TCP port on loopback (for private server processes).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// What a finished command printed, stdout then stderr: a failure's message.
pub fn said(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

pub fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name} {pid}");
}

/// The `seckill` binary with this environment's settings.
pub fn seckill(env: &TestEnv) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_seckill"));
    command.envs(env.vars()).env_remove("RUST_LOG");
    command
}

/// `seckill` with its clock `offset` off the machine's (libfaketime, e.g. `-10s`): a host
/// whose clock runs behind or ahead. Only the wall clock moves; timers do not.
pub fn seckill_with_clock(env: &TestEnv, offset: &str) -> Command {
    let lib = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|arch| arch.path().join("faketime/libfaketimeMT.so.1"))
        .find(|lib| lib.exists())
        .expect("libfaketime (./dev/tools.sh faketime)");
    let mut command = seckill(env);
    command
        .env("LD_PRELOAD", lib)
        .env("FAKETIME", offset)
        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    command
}

/// Starts `seckill serve …`, collecting its stdout lines; returns once it listens.
pub fn serve(
    command: &mut Command,
) -> (
    Child,
    TestServer,
    Arc<Mutex<Vec<String>>>,
    std::thread::JoinHandle<()>,
) {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Collect stdout; hand over the bound address from the `listening` line.
    let lines = Arc::new(Mutex::new(Vec::<String>::new()));
    let (addr_tx, addr_rx) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(json) = serde_json::from_str::<Value>(&line)
                    && json["message"] == "listening"
                {
                    let _ = addr_tx.send(json["addr"].as_str().unwrap_or_default().to_owned());
                }
                lines.lock().unwrap().push(line);
            }
        })
    };
    let addr = addr_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a `listening` line");
    let server = TestServer::external(addr.parse().unwrap());
    (child, server, lines, reader)
}

/// Stops a `seckill serve` process as an operator would (SIGTERM) and checks it exits
/// cleanly; then waits for its log reader.
pub fn stop_process(mut child: Child, reader: std::thread::JoinHandle<()>) {
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    reader.join().unwrap();
}

/// Sends SIGKILL to a process (an instance dying mid-sale).
pub fn kill_hard(child: &mut Child) {
    signal(child.id(), "KILL");
    let _ = child.wait();
}
