//! The limits' metrics on a Prometheus `/metrics` route: the crate records through the
//! [`metrics`](https://docs.rs/metrics) facade (feature `metrics`), and
//! `metrics-exporter-prometheus` renders what it recorded.
//!
//! ```text
//! cargo run --example prometheus --features metrics
//! for i in $(seq 12); do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:3000/; done
//! curl -s http://127.0.0.1:3000/metrics | grep ^ratelimit_
//! ```
//!
//! The names and labels are listed in the crate's `guide::metrics` page. `REDIS_URL` keeps the
//! limit in Redis (and adds the Redis latency histogram and the fallback gauge); `PORT`
//! overrides the port (3000).

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tower_redis_ratelimit::{key::PeerIp, Backend};
use tower_redis_ratelimit::{LimitLayer, PeriodConfig};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The recorder is installed before the first layer records anything. Histograms
    // get buckets (a Prometheus histogram, not a summary) so that p99 can be computed
    // across instances: Redis round trips of 0.1 ms to 1 s.
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".to_owned()),
            &[
                0.000_1, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
            ],
        )?
        .install_recorder()?;

    let backend = match std::env::var("REDIS_URL") {
        Ok(url) => Backend::builder().redis_url(url).build()?,
        Err(_) => Backend::in_process(),
    };
    let per_ip = LimitLayer::builder(&backend, PeriodConfig::new(10, Duration::from_secs(60)))
        .name("api")
        .key(PeerIp::new())
        .build()?;

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(per_ip)
        // Added after the layer, so outside it: a scrape is never limited.
        .route(
            "/metrics",
            get(move || std::future::ready(prometheus.render())),
        );
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
