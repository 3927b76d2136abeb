//! A test's own https server: one file at any path, under the test CA
//! (`tests/fixtures/tls`: `ca.pem` is what the service is told to trust,
//! with `HARNESS_OUTBOUND_CA_FILE`), counting what it served.

use std::sync::{
    Arc,
    atomic::{AtomicUsize, Ordering},
};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_rustls::{
    TlsAcceptor,
    rustls::{
        ServerConfig,
        pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
    },
};

/// The test CA's certificate (a PEM file's path).
pub fn ca_file() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls/ca.pem")
}

pub struct HttpsFile {
    /// `https://127.0.0.1:<port>`
    pub root: String,
    served: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl HttpsFile {
    /// Serves `body` as `media_type` to every request until dropped.
    pub async fn start(body: Vec<u8>, media_type: &'static str) -> Self {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tls");
        let chain = vec![CertificateDer::from_pem_file(dir.join("localhost.pem")).unwrap()];
        let key = PrivateKeyDer::from_pem_file(dir.join("localhost.key")).unwrap();
        let config = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let root = format!("https://{}", listener.local_addr().unwrap());
        let served = Arc::new(AtomicUsize::new(0));
        let counted = served.clone();
        let body: Arc<[u8]> = body.into();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, counted, body) = (acceptor.clone(), counted.clone(), body.clone());
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: {media_type}\r\ncontent-length: {}\r\n\
                         connection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = tls.write_all(answer.as_bytes()).await;
                    let _ = tls.write_all(&body).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Self { root, served, task }
    }

    /// Requests answered so far.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::SeqCst)
    }
}

impl Drop for HttpsFile {
    fn drop(&mut self) {
        self.task.abort();
    }
}
