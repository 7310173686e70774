//! An admission webhook the tests run on loopback, over TLS with the apiserver's own serving
//! certificate (valid for 127.0.0.1, signed by the cluster CA): each AdmissionReview is answered by
//! the test's `decide`, which may take its time (to hold a write) or refuse.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_rustls::rustls;

/// Serves the webhook on a free port of 127.0.0.1; returns the port.
pub async fn serve<F, Fut>(pki: &Path, decide: F) -> Result<u16>
where
    F: Fn(Value) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Value> + Send,
{
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> =
        CertificateDer::pem_file_iter(pki.join("apiserver.crt"))?.collect::<Result<_, _>>()?;
    let key = PrivateKeyDer::from_pem_file(pki.join("apiserver.key"))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, decide) = (acceptor.clone(), decide.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await {
                    let _ = serve_connection(tls, decide).await;
                }
            });
        }
    });
    Ok(port)
}

/// HTTP/1.1 with keep-alive: one AdmissionReview per request.
async fn serve_connection<F, Fut>(
    tls: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    decide: F,
) -> Result<()>
where
    F: Fn(Value) -> Fut,
    Fut: Future<Output = Value>,
{
    let mut stream = BufReader::new(tls);
    loop {
        let mut content_length = 0usize;
        let mut line = String::new();
        if stream.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        loop {
            line.clear();
            stream.read_line(&mut line).await?;
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((k, v)) = header.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                content_length = v.trim().parse().context("Content-Length")?;
            }
        }
        let mut body = vec![0; content_length];
        stream.read_exact(&mut body).await?;
        let review: Value = serde_json::from_slice(&body)?;
        let answer = decide(review).await;
        let out = serde_json::to_vec(&answer)?;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            out.len()
        );
        stream.get_mut().write_all(head.as_bytes()).await?;
        stream.get_mut().write_all(&out).await?;
        stream.get_mut().flush().await?;
    }
}
