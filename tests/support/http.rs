//! A real HTTP client against an axum app served on a free loopback port.

use std::net::SocketAddr;

use axum::Router;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// The `RateLimit` header (IETF draft-ietf-httpapi-ratelimit-headers-10).
pub(crate) const RATELIMIT: http::HeaderName = http::HeaderName::from_static("ratelimit");
/// The `RateLimit-Policy` header.
pub(crate) const RATELIMIT_POLICY: http::HeaderName =
    http::HeaderName::from_static("ratelimit-policy");

/// An app served on `127.0.0.1:0`, with the peer address in `ConnectInfo`.
pub(crate) struct Served {
    pub(crate) addr: SocketAddr,
    client: HttpClient,
}

impl Served {
    pub(crate) async fn start(app: Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
            .unwrap();
        });
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self { addr, client }
    }

    /// GETs `path` with `headers`; returns the response head and the body as text.
    pub(crate) async fn get(&self, path: &str, headers: &[(&str, &str)]) -> (Response<()>, String) {
        let mut req = Request::get(format!("http://{}{path}", self.addr));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let response = self
            .client
            .request(req.body(Empty::new()).unwrap())
            .await
            .unwrap();
        read(response).await
    }

    /// GETs `path` with header values given as raw bytes (which need not be UTF-8).
    pub(crate) async fn get_bytes(
        &self,
        path: &str,
        headers: &[(&str, &[u8])],
    ) -> (Response<()>, String) {
        let mut req = Request::get(format!("http://{}{path}", self.addr));
        for (name, value) in headers {
            req = req.header(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        let response = self
            .client
            .request(req.body(Empty::new()).unwrap())
            .await
            .unwrap();
        read(response).await
    }
}

/// A response's head, and its body as text.
pub(crate) async fn read<B>(response: Response<B>) -> (Response<()>, String)
where
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        Response::from_parts(parts, ()),
        String::from_utf8(body.to_vec()).unwrap(),
    )
}

/// The value of header `name`, which must be there.
pub(crate) fn value<'a>(headers: &'a HeaderMap, name: &http::HeaderName) -> &'a str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header in {headers:?}"))
        .to_str()
        .unwrap()
}
