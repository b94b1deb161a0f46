//! The dashboard (`ops/grafana/ratelimit.json`) and the alert rules
//! (`ops/prometheus/ratelimit.rules.yml`) on a real Prometheus: an axum app limited by
//! a set of limits and by a per-IP limit on a real `redis-server`, its `/metrics`
//! rendered by `metrics-exporter-prometheus` as in the `prometheus` example, scraped
//! every second by `/usr/bin/prometheus` with the repository's rules loaded. Every
//! panel's query returns data and every rule's expression evaluates; then Redis is
//! killed, and `RateLimitFallbackActive` fires; Redis comes back and goes again, and
//! every panel has something to show.
//!
//! Skipped (with a message) when Prometheus is not installed, unless `CI` is set:
//! `scripts/test` installs it (Debian's `prometheus` package). `$PROMETHEUS` names
//! another binary.
#![cfg(feature = "metrics")]

mod support;

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use serde_json::Value;
use support::http::Served;
use support::RedisServer;
use tower_redis_ratelimit::key::{HeaderKey, PeerIp};
use tower_redis_ratelimit::{LimitLayer, LimitSet, PeriodConfig, RedisState};

const DASHBOARD: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/ops/grafana/ratelimit.json");
const RULES: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/ops/prometheus/ratelimit.rules.yml"
);
/// The alert the test waits for, once Redis is gone.
const FALLBACK_ALERT: &str = "RateLimitFallbackActive";
/// The buckets of `examples/prometheus.rs`: Redis round trips of 0.1 ms to 1 s.
const BUCKETS: [f64; 11] = [
    0.000_1, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];
/// How long Prometheus may take to be ready.
const READY_TIMEOUT: Duration = Duration::from_secs(15);
/// How long the panels may take to have data (a few scrapes).
const DATA_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a query to Prometheus may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the fallback alert may take to fire once Redis is killed: its `for` (30 s),
/// a scrape and an evaluation (1 s each), and a busy machine's margin.
const FIRING_TIMEOUT: Duration = Duration::from_secs(50);

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// The Prometheus binary: `$PROMETHEUS`, or Debian's.
fn prometheus_bin() -> PathBuf {
    std::env::var_os("PROMETHEUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/prometheus"))
}

fn on_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// A `prometheus` process on a free loopback port with its own temporary directory
/// (config and TSDB), killed and removed when dropped; its log is printed if the test
/// is failing.
struct Prometheus {
    child: Child,
    port: u16,
    dir: PathBuf,
    log: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus scraping `target` every second, with the repository's rules
    /// evaluated every second; retries on another port if the chosen one was taken.
    fn start(bin: &Path, target: SocketAddr) -> Self {
        let dir = support::make_temp_dir("prometheus");
        let config = dir.join("prometheus.yml");
        fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
                 rule_files:\n  - {RULES}\n\
                 scrape_configs:\n  - job_name: app\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let log = dir.join("prometheus.log");
        for _ in 0..5 {
            let port = support::free_port();
            let out = fs::File::create(&log).unwrap();
            let mut child = Command::new(bin)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .arg("--log.level=warn")
                .current_dir(&dir)
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .unwrap_or_else(|e| panic!("could not spawn {}: {e}", bin.display()));
            if wait_ready(&mut child, port, &log) {
                return Prometheus {
                    child,
                    port,
                    dir,
                    log,
                };
            }
            let text = fs::read_to_string(&log).unwrap_or_default();
            assert!(
                text.contains("address already in use"),
                "prometheus did not start:\n{text}"
            );
        }
        panic!("prometheus found no free port in 5 attempts");
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("http://127.0.0.1:{}{path_and_query}", self.port)
    }
}

/// Waits until Prometheus's `/-/ready` answers 200 (a raw HTTP/1.1 GET); false if the
/// process exited (its port was taken, say).
fn wait_ready(child: &mut Child, port: u16, log: &Path) -> bool {
    use std::io::{Read, Write};
    let deadline = Instant::now() + READY_TIMEOUT;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            stream.set_read_timeout(Some(Duration::from_secs(2))).ok();
            let mut reply = String::new();
            let request = "GET /-/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
            if stream.write_all(request.as_bytes()).is_ok()
                && stream.read_to_string(&mut reply).is_ok()
                && reply.starts_with("HTTP/1.1 200")
            {
                return true;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "prometheus not ready after {READY_TIMEOUT:?}:\n{}",
        fs::read_to_string(log).unwrap_or_default()
    );
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- prometheus log (last 50 lines) ---\n{}",
                lines[lines.len().saturating_sub(50)..].join("\n")
            );
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `text` percent-encoded for a query string (every byte but the unreserved ones).
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 3);
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// GETs `url` (within [`REQUEST_TIMEOUT`]) and parses the body as JSON.
async fn get_json(client: &HttpClient, url: &str) -> Value {
    let exchange = async {
        let response = client
            .get(url.parse().unwrap())
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = response.status();
        (
            status,
            response.into_body().collect().await.unwrap().to_bytes(),
        )
    };
    let (status, body) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| panic!("GET {url}: no answer within {REQUEST_TIMEOUT:?}"));
    let json: Value = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("GET {url}: {status}, not JSON ({e}): {body:?}"));
    json
}

/// Evaluates `expr` now; panics unless Prometheus says `success`. Returns the result's
/// series.
async fn query(client: &HttpClient, prometheus: &Prometheus, expr: &str) -> Vec<Value> {
    let url = prometheus.url(&format!("/api/v1/query?query={}", encode(expr)));
    let json = get_json(client, &url).await;
    assert_eq!(json["status"], "success", "{expr}: {json}");
    json["data"]["result"]
        .as_array()
        .unwrap_or_else(|| panic!("{expr}: no result array: {json}"))
        .clone()
}

/// Waits (up to [`DATA_TIMEOUT`]) until `expr` has a result.
async fn wait_for(client: &HttpClient, prometheus: &Prometheus, expr: &str) {
    let deadline = Instant::now() + DATA_TIMEOUT;
    while query(client, prometheus, expr).await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "no result after {DATA_TIMEOUT:?}: {expr}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The queries of every panel of the dashboard (rows' panels included), each with its
/// panel's title, dashboard variables replaced by concrete values.
fn panel_queries(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for panel in panels.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or("?").to_owned();
            for target in panel["targets"].as_array().into_iter().flatten() {
                let expr = target["expr"]
                    .as_str()
                    .unwrap_or_else(|| panic!("panel {title:?}: a target without expr"));
                let expr = expr
                    .replace("$__rate_interval", "1m")
                    .replace("${__rate_interval}", "1m")
                    .replace("$__interval", "15s")
                    .replace("$__range", "5m");
                assert!(
                    !expr.contains('$'),
                    "panel {title:?}: a variable left: {expr}"
                );
                out.push((title.clone(), expr));
            }
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every alert rule of the rules file: (name, expression).
fn alert_rules() -> Vec<(String, String)> {
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&fs::read_to_string(RULES).unwrap()).expect("the rules file is YAML");
    let mut out = Vec::new();
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let name = rule["alert"].as_str().expect("an alert name").to_owned();
            assert!(rule["for"].as_str().is_some(), "{name}: no for");
            assert!(
                rule["labels"]["severity"].as_str().is_some(),
                "{name}: no severity"
            );
            for field in ["summary", "description"] {
                assert!(
                    rule["annotations"][field].as_str().is_some(),
                    "{name}: no annotations.{field}"
                );
            }
            let expr = rule["expr"].as_str().expect("an expr").trim().to_owned();
            out.push((name, expr));
        }
    }
    out
}

/// The dashboard is a plain importable one: a Prometheus datasource variable that
/// every panel and query uses, unique panel ids, and at least one query per panel.
fn check_dashboard_shape(dashboard: &Value) {
    let variables = dashboard["templating"]["list"]
        .as_array()
        .expect("templating");
    let datasource = variables
        .iter()
        .find(|v| v["type"] == "datasource" && v["query"] == "prometheus")
        .expect("a Prometheus datasource variable");
    let uid = format!("${{{}}}", datasource["name"].as_str().unwrap());
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    let mut ids = Vec::new();
    for panel in panels {
        let title = panel["title"].as_str().expect("a title");
        ids.push(panel["id"].as_u64().expect("an id"));
        assert_eq!(panel["datasource"]["uid"], uid.as_str(), "panel {title:?}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], uid.as_str(), "panel {title:?}");
        }
    }
    let count = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), count, "panel ids are unique");
}

/// Requests on both routes until `stop`: new clients of the set every 4 s (each soon
/// refused by the second's limit, then by the minute's), the per-IP route until it
/// refuses too.
fn drive(served: Arc<Served>, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let mut sent = 0;
        let start = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let client = format!("c{}", start.elapsed().as_secs() / 4);
            for _ in 0..2 {
                let (response, _) = served.get("/api", &[("x-client", &client)]).await;
                assert!(matches!(response.status().as_u16(), 200 | 429));
                sent += 1;
            }
            let (response, _) = served.get("/ip", &[]).await;
            assert!(matches!(response.status().as_u16(), 200 | 429));
            sent += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        sent
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alerts_on_a_real_prometheus() {
    let started = Instant::now();
    let bin = prometheus_bin();
    if !bin.exists() {
        assert!(
            !on_ci(),
            "{} not found (CI is set): scripts/test installs it (apt-get install prometheus)",
            bin.display()
        );
        eprintln!(
            "skipped: {} not found (apt-get install prometheus, or set PROMETHEUS)",
            bin.display()
        );
        return;
    }
    let dashboard: Value =
        serde_json::from_str(&fs::read_to_string(DASHBOARD).unwrap()).expect("dashboard JSON");
    check_dashboard_shape(&dashboard);
    let panels = panel_queries(&dashboard);
    let rules = alert_rules();
    assert!(rules.iter().any(|(name, _)| name == FALLBACK_ALERT));

    // This file is its own test binary, with this one test: the global recorder is its.
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_owned()), &BUCKETS)
        .unwrap()
        .install_recorder()
        .unwrap();

    let mut redis = RedisServer::start();
    // Short deadlines, so that the breaker opens soon after the kill (tests/outage.rs).
    let backend = support::backend_builder()
        .redis(redis.pool())
        .call_timeout(Duration::from_millis(500))
        .probe_interval(Duration::from_millis(100))
        .recovery(Duration::from_millis(200))
        .build()
        .unwrap();
    backend.warm_up().await.unwrap();
    let set = LimitLayer::builder(
        &backend,
        LimitSet::new()
            .limit("second", PeriodConfig::new(5, Duration::from_secs(1)))
            .limit("minute", PeriodConfig::new(12, Duration::from_secs(60))),
    )
    .name("api")
    .key(HeaderKey::from_static("x-client"))
    .build()
    .unwrap();
    let per_ip = LimitLayer::builder(&backend, PeriodConfig::new(10, Duration::from_secs(60)))
        .name("ip")
        .key(PeerIp::new())
        .build()
        .unwrap();
    let render = handle.clone();
    let app = Router::new()
        .route("/api", get(|| async { "api\n" }).layer(set))
        .route("/ip", get(|| async { "ip\n" }).layer(per_ip))
        .route("/metrics", get(move || std::future::ready(render.render())));
    let served = Arc::new(Served::start(app).await);

    // (Its start waits on a blocking socket: off the runtime's worker.)
    let prometheus = tokio::task::block_in_place(|| Prometheus::start(&bin, served.addr));
    let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = drive(Arc::clone(&served), Arc::clone(&stop));

    // Every rule is loaded and evaluates without error, and every expression is valid
    // PromQL (most have no data yet).
    let deadline = Instant::now() + DATA_TIMEOUT;
    loop {
        let json = get_json(&client, &prometheus.url("/api/v1/rules")).await;
        assert_eq!(json["status"], "success", "{json}");
        let loaded: Vec<&Value> = json["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap())
            .collect();
        let evaluated = loaded
            .iter()
            .all(|r| r["lastEvaluation"] != "0001-01-01T00:00:00Z");
        if loaded.len() == rules.len() && evaluated {
            for rule in &loaded {
                assert_eq!(rule["health"], "ok", "{rule}");
            }
            break;
        }
        assert!(Instant::now() < deadline, "rules not all evaluated: {json}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (name, expr) in &rules {
        let _ = query(&client, &prometheus, expr).await;
        eprintln!("rule {name}: valid");
    }

    // The refusals are labelled by the limit that refused: both limits of the set, and
    // the per-IP policy itself.
    // (The layers register every series at once, at 0: those that counted are above.)
    let refusals = r#"sum by (policy, limit) (ratelimit_requests_total{outcome="rejected"}) > 0"#;
    let deadline = Instant::now() + DATA_TIMEOUT;
    loop {
        let series = query(&client, &prometheus, refusals).await;
        let mut limits: Vec<String> = series
            .iter()
            .map(|s| format!("{}/{}", s["metric"]["policy"], s["metric"]["limit"]))
            .collect();
        limits.sort();
        if limits
            == [
                r#""api"/"api.minute""#,
                r#""api"/"api.second""#,
                r#""ip"/"ip""#,
            ]
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "refusals by limit: {limits:?}\n{}",
            handle.render()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Redis goes away: the breaker opens, the backend answers from its fallback, and
    // the alert fires once its `for` has passed.
    redis.kill();
    let killed = Instant::now();
    let mut pending = None;
    loop {
        let json = get_json(&client, &prometheus.url("/api/v1/alerts")).await;
        assert_eq!(json["status"], "success", "{json}");
        let alert = json["data"]["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["labels"]["alertname"] == FALLBACK_ALERT)
            .cloned();
        match alert {
            Some(alert) if alert["state"] == "firing" => {
                assert_eq!(alert["labels"]["severity"], "critical", "{alert}");
                assert!(alert["labels"]["prefix"].is_string(), "{alert}");
                eprintln!(
                    "{FALLBACK_ALERT} firing {:?} after the kill (pending after {:?})",
                    killed.elapsed(),
                    pending.unwrap_or_default()
                );
                break;
            }
            Some(_) if pending.is_none() => pending = Some(killed.elapsed()),
            _ => {}
        }
        assert!(
            killed.elapsed() < FIRING_TIMEOUT,
            "{FALLBACK_ALERT} not firing {FIRING_TIMEOUT:?} after the kill: {json}\n{}",
            handle.render()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // Redis comes back, and goes again: a second switch to the fallback. The first
    // switch of a process creates its counter at 1, which `increase()` cannot tell from
    // a counter that was at 1 before the window (the panel and the flapping alert count
    // from the second; the fallback gauge shows the first): the second is counted.
    redis.restart();
    let deadline = Instant::now() + DATA_TIMEOUT;
    while backend.redis_state() != Some(RedisState::Healthy) {
        assert!(
            Instant::now() < deadline,
            "not back on Redis after {DATA_TIMEOUT:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_for(&client, &prometheus, "max(ratelimit_fallback_active) == 0").await;
    redis.kill();
    wait_for(
        &client,
        &prometheus,
        r#"sum(ratelimit_redis_switches_total{to="fallback"}) >= 2 and max(ratelimit_fallback_active) == 1"#,
    )
    .await;
    // A scrape more, so that every rate has the second outage's samples.
    tokio::time::sleep(Duration::from_millis(1_500)).await;

    // Every panel has data now, and something to show (a value above 0: the layers
    // register their series at 0): the outage's series (fallback decisions, errors,
    // switches) beside the traffic's of before.
    for (title, expr) in &panels {
        let series = query(&client, &prometheus, expr).await;
        assert!(!series.is_empty(), "panel {title:?} has no data: {expr}");
        let values: Vec<f64> = series
            .iter()
            .map(|s| s["value"][1].as_str().unwrap().parse().unwrap())
            .collect();
        assert!(
            values.iter().any(|v| *v > 0.0),
            "panel {title:?} shows nothing: {expr}: {series:?}"
        );
        eprintln!("panel {title:?}: {} series, {values:?}", series.len());
    }
    for (name, expr) in &rules {
        let _ = query(&client, &prometheus, expr).await;
        eprintln!("rule {name}: valid");
    }

    stop.store(true, Ordering::Relaxed);
    let sent = traffic.await.unwrap();
    eprintln!("{sent} requests; the test took {:?}", started.elapsed());
}
