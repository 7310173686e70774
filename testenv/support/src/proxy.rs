//! A loopback TCP proxy a test can cut: the host talks to the apiserver through it, and the test
//! drops every connection and refuses new ones to cut the host off while the cluster goes on (the
//! apiserver's TLS passes through untouched).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; it stops when dropped.
pub struct CuttableProxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped on every cut: each open connection ends when it changes.
    generation: watch::Sender<u64>,
    accept_task: tokio::task::JoinHandle<()>,
}

impl CuttableProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> Result<CuttableProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("bind the proxy")?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let accept_task = tokio::spawn(accept_loop(
            listener,
            target,
            cut.clone(),
            generation.clone(),
        ));
        Ok(CuttableProxy {
            addr,
            cut,
            generation,
            accept_task,
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every open connection and refuses new ones until [`CuttableProxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Forwards new connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for CuttableProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept_task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    cut: Arc<AtomicBool>,
    generation: watch::Sender<u64>,
) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        if cut.load(Ordering::SeqCst) {
            // Closed at once: the client sees its connection reset, as behind a dead link.
            drop(inbound);
            continue;
        }
        let mut ended = generation.subscribe();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(target).await else {
                return;
            };
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                _ = ended.changed() => {}
            }
        });
    }
}
