//! Configuration as data: rule files build the same layers, with the same checks and
//! errors, as the builders; the example's rule file works over HTTP, in-process and on a
//! real `redis-server`.

mod support;

#[path = "../examples/rules.rs"]
#[allow(dead_code)]
mod rules_example;

use std::num::NonZeroU32;
use std::time::Duration;

use http::StatusCode;
use support::http::Served;
use support::RedisServer;
use tower_redis_ratelimit::key::GlobalKey;
use tower_redis_ratelimit::TimeSource;
use tower_redis_ratelimit::{Backend, FailurePolicy, Limiter, Source};
use tower_redis_ratelimit::{BackendConfig, RulesConfig};
use tower_redis_ratelimit::{LimitLayer, PeriodConfig, RollingConfig, TokenBucketConfig};

const ONE: NonZeroU32 = NonZeroU32::MIN;

fn parse(text: &str) -> RulesConfig {
    toml::from_str(text).unwrap_or_else(|error| panic!("{error}"))
}

/// Admissions of `n` checks of `key` in a row.
async fn admitted(limiter: &dyn Limiter, key: &[u8], n: usize) -> Vec<bool> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(limiter.check(key, ONE).await.is_admitted());
    }
    out
}

/// Every algorithm with every parameter: the policies say what the file says, and the
/// checks admit exactly the limit.
#[tokio::test]
async fn every_algorithm_builds_its_limit() {
    let rules = parse(
        r#"
        [[rules]]
        name = "fixed"
        limit = { algorithm = "period", quota = 2, period = "1day", align = "+05:30" }
        [[rules]]
        name = "bucket"
        limit = { algorithm = "token_bucket", rate = 1, per = "1h", burst = 3 }
        [[rules]]
        name = "rolling"
        limit = { algorithm = "rolling_window", limit = 4, buckets = 10, interval = "100ms" }
        "#,
    )
    .build()
    .unwrap();
    let expected = [
        ("fixed", 2, Duration::from_secs(86_400)),
        ("bucket", 3, Duration::from_secs(3 * 3_600)),
        ("rolling", 4, Duration::from_secs(1)),
    ];
    assert_eq!(rules.layers.len(), 3);
    for (layer, (name, quota, window)) in rules.layers.iter().zip(expected) {
        let limiter = layer.limiter();
        let policy = limiter.policy();
        assert_eq!(policy.name(), name);
        assert_eq!(policy.quota(), quota, "{name}");
        // The same policy as the builder's.
        let built = match name {
            "fixed" => LimitLayer::builder(&rules.backend, PeriodConfig::new(2, window))
                .name("x")
                .key(GlobalKey)
                .build()
                .unwrap()
                .limiter()
                .policy()
                .window(),
            "bucket" => LimitLayer::builder(
                &rules.backend,
                TokenBucketConfig::new(1, Duration::from_secs(3_600), 3),
            )
            .name("x")
            .key(GlobalKey)
            .build()
            .unwrap()
            .limiter()
            .policy()
            .window(),
            _ => LimitLayer::builder(
                &rules.backend,
                RollingConfig::new(4, 10, Duration::from_millis(100)),
            )
            .name("x")
            .key(GlobalKey)
            .build()
            .unwrap()
            .limiter()
            .policy()
            .window(),
        };
        assert_eq!(policy.window(), built, "{name}");
        let mut want = vec![true; quota as usize];
        want.push(false);
        assert_eq!(
            admitted(&**limiter, b"k", quota as usize + 1).await,
            want,
            "{name}"
        );
        assert_eq!(admitted(&**limiter, b"other", 1).await, [true], "{name}");
    }
}

/// Every field of the backend and of a rule survives `Serialize` then `Deserialize`,
/// and `Debug` shows no password.
#[test]
fn round_trip_and_no_secrets_in_debug() {
    let text = r#"
        [backend]
        url = "redis://limiter:hunter2@127.0.0.1:6379/0"
        prefix = "p"
        call_timeout = "150ms"
        probe_interval = "1s"
        failure_policy = "fail_closed"
        fallback_share = 0.5
        max_local_keys = 1000
        deny_cache = 0
        time_source = "caller"
        breaker = { window = "3s", min_calls = 5, failure_ratio = 0.25, recovery = "2s" }
        sentinel = { master_name = "m", urls = ["redis://:hunter2@10.0.0.1:26379"], username = "u", password = "hunter2" }
        tls = { ca_file = "ca.pem", client_cert_file = "c.pem", client_key_file = "c.key" }

        [[rules]]
        name = "r"
        limit = { algorithm = "token_bucket", rate = 5, per = "1m", burst = 2 }
        key = { or = [{ header = "x-api-key" }, { forwarded_ip = { trusted = ["10.0.0.0/8"], header = "forwarded", ipv6_prefix = 56 } }] }
        cost = 2
        failure_policy = "fail_open"
        fallback_share = 0.25
        shadow = true
        headers = false
        decision_extension = false
        missing_key = { key = "anonymous" }
        max_key_len = 64
    "#;
    let config = parse(text);
    let again: RulesConfig = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
    assert_eq!(again, config);
    assert!(format!("{:?}", config.backend).contains("FailClosed"));
    let debug = format!("{config:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    assert!(!debug.contains("limiter"), "{debug}");
    assert!(debug.contains("127.0.0.1:6379"), "{debug}");
}

/// The rule settings beyond the limit act as the builder's: cost, shadow, headers,
/// missing key.
#[tokio::test]
async fn rule_settings_act_over_http() {
    let rules = parse(
        r#"
        [[rules]]
        name = "shadow"
        key = "global"
        shadow = true
        limit = { algorithm = "period", quota = 1, period = "1m" }

        [[rules]]
        name = "per-key"
        key = { header = "x-api-key" }
        missing_key = { key = "anonymous" }
        cost = 2
        headers = false
        limit = { algorithm = "period", quota = 4, period = "1m" }
        "#,
    )
    .build()
    .unwrap();
    let app = rules.apply(axum::Router::new().route("/", axum::routing::get(|| async { "ok" })));
    let served = Served::start(app).await;
    // Cost 2 of 4: two requests, then 429, although the shadow rule is over its quota.
    for _ in 0..2 {
        let (response, _) = served.get("/", &[("x-api-key", "a")]).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            !response.headers().contains_key("ratelimit"),
            "headers = false"
        );
    }
    let (response, _) = served.get("/", &[("x-api-key", "a")]).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    // Without a key: the shared `anonymous` key, not a 400.
    for want in [
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        assert_eq!(served.get("/", &[]).await.0.status(), want);
    }
}

/// The example's own rule file, served as the example serves it.
#[tokio::test]
async fn example_rule_file_in_process() {
    let config = rules_example::load(&rules_example::rules_file()).unwrap();
    // The file has no URL: its backend keeps the limits in process, whatever the
    // environment says.
    example_limits(config.build().unwrap()).await;
}

async fn example_limits(rules: tower_redis_ratelimit::Rules) {
    assert_eq!(rules.layers.len(), 3);
    let served = Served::start(rules_example::app(&rules)).await;
    // per-client: a burst of 5 per API key.
    for path in ["/", "/search", "/", "/search", "/"] {
        let (response, body) = served.get(path, &[("x-api-key", "me")]).await;
        assert_eq!(response.status(), StatusCode::OK, "{path}: {body}");
        assert!(response.headers().contains_key("ratelimit"));
    }
    let (response, _) = served.get("/", &[("x-api-key", "me")]).await;
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(response.headers().contains_key(http::header::RETRY_AFTER));
    // Another key, and a client without one (keyed by its address), are unaffected.
    assert_eq!(
        served.get("/", &[("x-api-key", "you")]).await.0.status(),
        StatusCode::OK
    );
    assert_eq!(served.get("/", &[]).await.0.status(), StatusCode::OK);
}

/// A Redis backend from the file, with a password in its URL: decisions come from
/// Redis, the keys carry the file's prefix, and `Debug` hides the password.
#[tokio::test]
async fn redis_backend_from_config() {
    let server = RedisServer::start();
    let acl = [
        "ACL",
        "SETUSER",
        "limiter",
        "on",
        ">s3cret-pw",
        "~*",
        "+@all",
    ];
    assert_eq!(server.cmd(&acl), "OK");
    let url = format!("redis://limiter:s3cret-pw@127.0.0.1:{}", server.port());
    let config = rules_example::load(&rules_example::rules_file()).unwrap();
    // The file's backend with a URL of its own; `Debug` hides the password. (The file's
    // 100 ms is for production: a busy machine must not hand checks to the fallback
    // here.)
    let file: BackendConfig = toml::from_str(&format!(
        "url = {url:?}\nprefix = \"rules-example\"\ncall_timeout = \"{}ms\"",
        support::CALL_TIMEOUT.as_millis()
    ))
    .unwrap();
    assert!(!format!("{file:?}").contains("s3cret-pw"));
    let backend: Backend = file.build().unwrap();
    assert!(backend.is_redis());
    backend.warm_up().await.unwrap();
    let rules = config.build_on(&backend).unwrap();
    let limiter = rules.layers[0].limiter();
    let decision = limiter.check(b"hdr:x-api-key:direct", ONE).await;
    assert!(decision.is_admitted());
    assert_eq!(decision.source, Source::Redis);
    let keys = server.cmd(&["KEYS", "rules-example:*"]);
    assert!(keys.contains("per-client"), "{keys}");
    example_limits(rules).await;

    // A wrong password is a clear error at start-up.
    let wrong: BackendConfig = toml::from_str(&format!(
        "url = \"redis://limiter:wrong-pw@127.0.0.1:{}\"",
        server.port()
    ))
    .unwrap();
    let error = wrong.build().unwrap().warm_up().await.unwrap_err();
    assert!(!error.to_string().contains("wrong-pw"), "{error}");
}

/// Every backend setting reaches the builder: the builder set up from a file equals,
/// setting for setting, the one written in code (TLS files included).
#[test]
fn every_backend_field_reaches_the_builder() {
    let dir = support::make_temp_dir("config-tls");
    for file in ["ca.pem", "c.pem", "c.key"] {
        std::fs::write(dir.join(file), b"not checked until a connection").unwrap();
    }
    let config = parse(&format!(
        r#"
        [backend]
        url = "rediss://u:p@127.0.0.1:6380/0"
        prefix = "p"
        call_timeout = "150ms"
        probe_interval = "1s"
        failure_policy = "fail_closed"
        fallback_share = 0.5
        max_local_keys = 1000
        deny_cache = 0
        time_source = "caller"
        breaker = {{ window = "3s", min_calls = 5, failure_ratio = 0.25, recovery = "2s" }}
        tls = {{ ca_file = "{0}/ca.pem", client_cert_file = "{0}/c.pem", client_key_file = "{0}/c.key" }}
        "#,
        dir.display()
    ));
    let from_file = config.backend.builder().unwrap();
    let in_code = support::backend_builder()
        .redis_url("rediss://u:p@127.0.0.1:6380/0")
        .prefix("p")
        .call_timeout(Duration::from_millis(150))
        .probe_interval(Duration::from_secs(1))
        .failure_policy(FailurePolicy::FailClosed)
        .fallback_share(0.5)
        .max_local_keys(1000)
        .deny_cache(0)
        .time_source(TimeSource::Caller)
        .breaker_window(Duration::from_secs(3))
        .breaker_min_calls(5)
        .breaker_failure_ratio(0.25)
        .recovery(Duration::from_secs(2))
        .tls_ca_pem(b"x".to_vec())
        .tls_client_auth_pem(b"x".to_vec(), b"x".to_vec());
    assert_eq!(format!("{from_file:?}"), format!("{in_code:?}"));
    assert_ne!(
        format!("{from_file:?}"),
        format!("{:?}", support::backend_builder()),
        "not the defaults"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Every form of every algorithm's limit (calendars, offsets, lockouts, leases) and of
/// `missing_key` writes back to the text it was read from: the algorithms' own config
/// types are what a rule file holds.
#[test]
fn every_limit_form_reads_back_as_written() {
    let text = r#"
        [[rules]]
        name = "fixed"
        limit = { algorithm = "period", quota = 5, period = "1m", align = "+05:30", lockout = "15m" }
        key = "global"
        missing_key = "allow"

        [[rules]]
        name = "week"
        limit = { algorithm = "period", quota = 5, calendar = "week", zone = "Europe/Berlin", week_starts = "sunday" }
        key = "global"
        missing_key = { reject = 401 }

        [[rules]]
        name = "month"
        limit = { algorithm = "period", quota = 5, calendar = "month", zone = "UTC" }
        key = "global"

        [[rules]]
        name = "bucket"
        limit = { algorithm = "token_bucket", rate = 10, per = "1s", burst = 20, lease = { size = 5, lifetime = "100ms" } }
        key = "global"

        [[rules]]
        name = "locked"
        limit = { algorithm = "token_bucket", rate = 10, burst = 20, lockout = "1m" }
        key = "global"
        missing_key = { key = "anonymous" }

        [[rules]]
        name = "rolling"
        limit = { algorithm = "rolling_window", limit = 10, buckets = 6, interval = "10s", lockout = "30s" }
        key = "global"
    "#;
    let config = parse(text);
    let written = toml::to_string(&config).unwrap();
    let again: RulesConfig = toml::from_str(&written).unwrap();
    assert_eq!(again, config, "{written}");
    for form in [
        "align = \"+05:30\"",
        "lockout = \"15m\"",
        "week_starts = \"sunday\"",
        "zone = \"Europe/Berlin\"",
        "calendar = \"month\"",
        "lifetime = \"100ms\"",
        "reject = 401",
    ] {
        assert!(written.contains(form), "{form} in {written}");
    }
    config.build().expect("every form builds");
}

/// `missing_key` reads alike in TOML, JSON and YAML (issue 53, item 2): serde_yaml 0.9
/// refused YAML's map form `{reject: 401}`, the form the docs show, and took only its
/// own tag form `!reject 401`. Both are read now, and a form that cannot be is an error
/// that names the forms.
#[test]
fn missing_key_reads_alike_in_toml_json_and_yaml() {
    let toml_rule = |missing: &str| {
        parse(&format!(
            "[[rules]]\nname = \"r\"\nlimit = {{ algorithm = \"period\", quota = 5, period = \"1m\" }}\nmissing_key = {missing}\n"
        ))
    };
    let json_rule = |missing: &str| -> RulesConfig {
        serde_json::from_str(&format!(
            r#"{{"rules": [{{"name": "r", "limit": {{"algorithm": "period", "quota": 5, "period": "1m"}}, "missing_key": {missing}}}]}}"#
        ))
        .unwrap_or_else(|error| panic!("{missing}: {error}"))
    };
    let yaml_rule = |missing: &str| -> Result<RulesConfig, serde_yaml::Error> {
        serde_yaml::from_str(&format!(
            "rules:\n  - name: r\n    limit: {{algorithm: period, quota: 5, period: 1m}}\n    missing_key: {missing}\n"
        ))
    };
    let cases = [
        (
            "{ reject = 401 }",
            r#"{"reject": 401}"#,
            ["{reject: 401}", "!reject 401"],
        ),
        ("\"allow\"", r#""allow""#, ["allow", "!allow"]),
        (
            "{ key = \"anonymous\" }",
            r#"{"key": "anonymous"}"#,
            ["{key: anonymous}", "!key anonymous"],
        ),
    ];
    for (toml_text, json_text, yaml_texts) in cases {
        let want = toml_rule(toml_text);
        assert_eq!(json_rule(json_text), want, "{json_text}");
        for yaml_text in yaml_texts {
            let got = yaml_rule(yaml_text).unwrap_or_else(|error| panic!("{yaml_text}: {error}"));
            assert_eq!(got, want, "{yaml_text}");
        }
    }
    // The status is checked as in TOML, and an unknown form names the known ones.
    let status = yaml_rule("{reject: 200}").unwrap_err().to_string();
    assert!(status.contains("not an HTTP error status"), "{status}");
    let unknown = yaml_rule("{refuse: 401}").unwrap_err().to_string();
    assert!(unknown.contains("reject"), "{unknown}");
    let two = yaml_rule("{reject: 401, allow: null}")
        .unwrap_err()
        .to_string();
    assert!(two.contains("not several"), "{two}");
}
