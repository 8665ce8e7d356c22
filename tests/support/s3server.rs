//! An S3 server in the calling process: `s3s-fs` (a directory per bucket)
//! behind hyper on a free loopback port, signed with one key. The gateway's
//! `--s3-upstream` tests and its S3 benchmark point the gateway at it, and
//! the benchmark's baseline talks to it directly.

use std::path::Path;
use std::thread::JoinHandle;

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

/// The server's access key id.
pub const KEY: &str = "AKIAUPSTREAM0001";
/// The server's secret access key.
pub const SECRET: &str = "upstreamSecretAccessKey0123456789abcdef";

/// A running server; stopped on drop.
pub struct S3Server {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl S3Server {
    /// Serve `root` (bucket `B` is the directory `root/B`, made here for
    /// each of `buckets`).
    pub fn start(root: &Path, buckets: &[&str]) -> anyhow::Result<Self> {
        for bucket in buckets {
            std::fs::create_dir_all(root.join(bucket))?;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?.to_string();
        let fs = s3s_fs::FileSystem::new(root).map_err(|e| anyhow::anyhow!("s3s-fs: {e:?}"))?;
        let mut builder = S3ServiceBuilder::new(fs);
        builder.set_auth(SimpleAuth::from_single(KEY, SECRET));
        let service = builder.build();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?;
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                loop {
                    let socket = tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok((socket, _)) => socket,
                            Err(_) => continue,
                        },
                        _ = &mut stopped => break,
                    };
                    // Without it small answers wait out the client's
                    // delayed ACK (40 ms a GET).
                    let _ = socket.set_nodelay(true);
                    let service = service.clone();
                    tokio::spawn(async move {
                        let _ = Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(socket), service)
                            .await;
                    });
                }
            });
        });
        Ok(Self {
            addr,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
