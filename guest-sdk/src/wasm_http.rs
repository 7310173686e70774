//! Outbound HTTP in the wasm build, called directly by `RequestBuilder::send` (not through the
//! [`Host`](crate::Host) trait, so only plugins that send requests import `wasi:http`): one
//! request, the whole response read into memory (bounded by the request's `max_body`).

use wasip2::http::outgoing_handler;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, Method as WasiMethod, OutgoingBody, OutgoingRequest,
    RequestOptions, Scheme,
};
use wasip2::io::streams::StreamError;

use crate::http::{HttpError, HttpErrorKind, HttpRequest, HttpResponse, Method, split_url};

/// Bytes written per `blocking-write-and-flush` (the most WASI accepts in one call).
const WRITE_CHUNK: usize = 4096;
/// Bytes asked for per read.
const READ_CHUNK: u64 = 64 << 10;

fn invalid(what: impl std::fmt::Display) -> HttpError {
    HttpError::new(HttpErrorKind::InvalidRequest, what)
}

fn transport(e: ErrorCode, url: &str) -> HttpError {
    let kind = match &e {
        ErrorCode::DnsTimeout
        | ErrorCode::ConnectionTimeout
        | ErrorCode::ConnectionReadTimeout
        | ErrorCode::ConnectionWriteTimeout
        | ErrorCode::HttpResponseTimeout => HttpErrorKind::Timeout,
        ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited => HttpErrorKind::Denied,
        ErrorCode::HttpRequestMethodInvalid
        | ErrorCode::HttpRequestUriInvalid
        | ErrorCode::HttpRequestUriTooLong
        | ErrorCode::HttpRequestHeaderSectionSize(_)
        | ErrorCode::HttpRequestHeaderSize(_)
        | ErrorCode::HttpRequestBodySize(_) => HttpErrorKind::InvalidRequest,
        ErrorCode::HttpResponseBodySize(_) => HttpErrorKind::TooLarge,
        _ => HttpErrorKind::Connection,
    };
    HttpError::new(kind, format!("{url}: {e:?}"))
}

pub(crate) fn send(req: &HttpRequest) -> Result<HttpResponse, HttpError> {
    let (scheme, authority, path) =
        split_url(&req.url).ok_or_else(|| invalid("not an http(s) URL"))?;
    let headers = Fields::new();
    for (name, value) in &req.headers {
        headers
            .append(name, value.as_bytes())
            .map_err(|e| invalid(format!("header {name:?}: {e:?}")))?;
    }
    // A known length: without it the body would go chunked, which some servers (Apache mod_wsgi
    // among them) refuse.
    if !req
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-length"))
    {
        headers
            .append("content-length", &req.body.len().to_string().into_bytes())
            .map_err(|e| invalid(format!("content-length: {e:?}")))?;
    }
    let request = OutgoingRequest::new(headers);
    let method = match req.method {
        Method::Get => WasiMethod::Get,
        Method::Head => WasiMethod::Head,
        Method::Post => WasiMethod::Post,
        Method::Put => WasiMethod::Put,
        Method::Patch => WasiMethod::Patch,
        Method::Delete => WasiMethod::Delete,
    };
    let scheme = if scheme.eq_ignore_ascii_case("https") {
        Scheme::Https
    } else {
        Scheme::Http
    };
    request
        .set_method(&method)
        .map_err(|()| invalid("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| invalid(format!("authority {authority:?}")))?;
    request
        .set_path_with_query(Some(path))
        .map_err(|()| invalid("path"))?;

    let options = RequestOptions::new();
    let nanos = u64::try_from(req.timeout.as_nanos()).unwrap_or(u64::MAX);
    // A host may not support some of these; its own defaults then apply.
    let _ = options.set_connect_timeout(Some(nanos));
    let _ = options.set_first_byte_timeout(Some(nanos));
    let _ = options.set_between_bytes_timeout(Some(nanos));

    let body = request.body().map_err(|()| invalid("request body taken"))?;
    // Sent first, the body streamed after: a body larger than the pipe's buffer cannot block.
    let pending =
        outgoing_handler::handle(request, Some(options)).map_err(|e| transport(e, &req.url))?;
    {
        let out = body.write().map_err(|()| invalid("request body stream"))?;
        for chunk in req.body.chunks(WRITE_CHUNK) {
            out.blocking_write_and_flush(chunk).map_err(|e| {
                HttpError::new(
                    HttpErrorKind::Connection,
                    format!("{}: sending the body: {e:?}", req.url),
                )
            })?;
        }
    }
    OutgoingBody::finish(body, None).map_err(|e| transport(e, &req.url))?;

    pending.subscribe().block();
    let response = pending
        .get()
        .ok_or_else(|| HttpError::new(HttpErrorKind::Connection, "no response"))?
        .map_err(|()| HttpError::new(HttpErrorKind::Connection, "response already taken"))?
        .map_err(|e| transport(e, &req.url))?;
    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
        .collect();
    let incoming = response
        .consume()
        .map_err(|()| HttpError::new(HttpErrorKind::Connection, "response body taken"))?;
    let mut bytes = Vec::new();
    {
        let stream = incoming
            .stream()
            .map_err(|()| HttpError::new(HttpErrorKind::Connection, "response body stream"))?;
        loop {
            match stream.blocking_read(READ_CHUNK) {
                Ok(chunk) => {
                    bytes.extend_from_slice(&chunk);
                    if bytes.len() > req.max_body {
                        return Err(HttpError::new(
                            HttpErrorKind::TooLarge,
                            format!("{}: response body over {} bytes", req.url, req.max_body),
                        ));
                    }
                }
                Err(StreamError::Closed) => break,
                Err(StreamError::LastOperationFailed(e)) => {
                    return Err(HttpError::new(
                        HttpErrorKind::Connection,
                        format!("{}: reading the body: {}", req.url, e.to_debug_string()),
                    ));
                }
            }
        }
    }
    drop(IncomingBody::finish(incoming));
    Ok(HttpResponse {
        status,
        headers,
        body: bytes,
    })
}
