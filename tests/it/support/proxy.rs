//! A TCP proxy a test puts between a server and a store, to cut, slow or break the line.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// A TCP proxy in front of a real server, which a test can cut (open connections dropped,
/// new ones accepted and closed at once) and restore; it counts connection attempts.
pub struct TcpProxy {
    pub addr: SocketAddr,
    state: std::sync::Arc<ProxyState>,
    accept_loop: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProxyState {
    cut: std::sync::atomic::AtomicBool,
    attempts: std::sync::atomic::AtomicU64,
    /// Added to every answer from the target, in ms (a slow server, not a slow link: answers
    /// are delayed, not queued behind each other).
    delay_ms: std::sync::atomic::AtomicU64,
    open: std::sync::Mutex<Vec<tokio::task::AbortHandle>>,
    /// Bytes that, sent by a client, drop its connection instead of going through; and
    /// how many more times.
    drop_on: std::sync::Mutex<Option<(Vec<u8>, u32)>>,
}

impl ProxyState {
    /// Whether this chunk from a client is to be dropped with its connection.
    fn drops(&self, chunk: &[u8]) -> bool {
        let mut drop_on = self.drop_on.lock().unwrap();
        let Some((needle, times)) = drop_on.as_mut() else {
            return false;
        };
        if *times == 0 || !chunk.windows(needle.len()).any(|w| w == needle.as_slice()) {
            return false;
        }
        *times -= 1;
        true
    }
}

impl TcpProxy {
    pub async fn start(target: SocketAddr) -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = std::sync::Arc::new(ProxyState::default());
        let shared = state.clone();
        let accept_loop = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                shared.attempts.fetch_add(1, Ordering::SeqCst);
                if shared.cut.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection closed
                }
                let state = shared.clone();
                let forward = tokio::spawn(async move {
                    if let Ok(upstream) = tokio::net::TcpStream::connect(target).await {
                        forward(client, upstream, state).await;
                    }
                });
                shared.open.lock().unwrap().push(forward.abort_handle());
            }
        });
        Self {
            addr,
            state,
            accept_loop,
        }
    }

    pub fn cut(&self) {
        self.state
            .cut
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for connection in self.state.open.lock().unwrap().drain(..) {
            connection.abort();
        }
    }

    /// Delays every answer of the target by `delay` from now on.
    pub fn set_delay(&self, delay: Duration) {
        self.state.delay_ms.store(
            delay.as_millis() as u64,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// The next `times` connections that send `needle` are dropped at that moment, the
    /// bytes never reaching the target: a call cut off at a chosen step.
    pub fn drop_connection_when_sent(&self, needle: &[u8], times: u32) {
        *self.state.drop_on.lock().unwrap() = Some((needle.to_vec(), times));
    }

    pub fn restore(&self) {
        self.state
            .cut
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Connections attempted through the proxy so far.
    pub fn attempts(&self) -> u64 {
        self.state
            .attempts
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Copies both ways; what comes back from the target goes through a delay line.
async fn forward(
    mut client: tokio::net::TcpStream,
    upstream: tokio::net::TcpStream,
    state: std::sync::Arc<ProxyState>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut from_client, mut to_client) = client.split();
    let (mut from_upstream, mut to_upstream) = upstream.into_split();
    let state_in = state.clone();
    let (line_in, mut line_out) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let answers = async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from_upstream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            let delay = state.delay_ms.load(std::sync::atomic::Ordering::SeqCst);
            let due = Instant::now() + Duration::from_millis(delay);
            if line_in.send((due, buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let deliver = async move {
        while let Some((due, bytes)) = line_out.recv().await {
            tokio::time::sleep_until(due.into()).await;
            if to_client.write_all(&bytes).await.is_err() {
                break;
            }
        }
    };
    let requests = async {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = from_client.read(&mut buf).await {
            if n == 0 || state_in.drops(&buf[..n]) {
                break;
            }
            if to_upstream.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = requests => {}
        _ = async { tokio::join!(answers, deliver) } => {}
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept_loop.abort();
        self.cut();
    }
}
