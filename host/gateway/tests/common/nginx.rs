//! A real nginx (Debian's, `/usr/sbin/nginx`) with WebDAV PUT/DELETE under
//! `/blobs/`, on a free loopback port, with its config and files in a temp
//! dir. Single process (`master_process off`) so killing the child stops it.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A running nginx; killed on drop.
pub struct Nginx {
    child: Child,
    dir: PathBuf,
    /// `http://127.0.0.1:PORT`
    pub url: String,
    /// Where `/blobs/…` files land.
    pub root: PathBuf,
}

impl Nginx {
    /// Start nginx in `dir` (its config, logs, temp files and document root).
    pub fn start(dir: &Path) -> anyhow::Result<Self> {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let root = dir.join("root");
        std::fs::create_dir_all(root.join("blobs"))?;
        std::fs::create_dir_all(dir.join("tmp"))?;
        let d = dir.display();
        let conf = format!(
            r#"daemon off;
master_process off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    log_format gw '$request_method $uri $status $body_bytes_sent';
    access_log {d}/access.log gw;
    client_body_temp_path {d}/tmp/body;
    proxy_temp_path {d}/tmp/proxy;
    fastcgi_temp_path {d}/tmp/fastcgi;
    uwsgi_temp_path {d}/tmp/uwsgi;
    scgi_temp_path {d}/tmp/scgi;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        client_max_body_size 0;
        location /blobs/ {{
            dav_methods PUT DELETE;
            dav_access user:rw;
            autoindex on;
            autoindex_format json;
        }}
    }}
}}
"#,
            root = root.display()
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf)?;
        let child = Command::new("/usr/sbin/nginx")
            .arg("-p")
            .arg(dir)
            .arg("-e")
            .arg(dir.join("error.log"))
            .arg("-c")
            .arg(&conf_path)
            .stdout(Stdio::null())
            .spawn()
            .context("starting /usr/sbin/nginx (apt-get install nginx)")?;
        let mut nginx = Self {
            child,
            dir: dir.to_owned(),
            url: format!("http://127.0.0.1:{port}"),
            root,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = nginx.child.try_wait()? {
                let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                bail!("nginx exited: {status}: {log}");
            }
            if Instant::now() > deadline {
                bail!("nginx did not start listening");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(nginx)
    }

    /// The access log so far: `METHOD URI STATUS BODY-BYTES-SENT` lines.
    pub fn access_log(&self) -> anyhow::Result<String> {
        Ok(std::fs::read_to_string(self.dir.join("access.log")).unwrap_or_default())
    }

    /// Files nginx holds under `/blobs/`.
    pub fn blob_count(&self) -> anyhow::Result<usize> {
        Ok(std::fs::read_dir(self.root.join("blobs"))?.count())
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
