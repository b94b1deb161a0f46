//! Configuration as data: values the builders refuse are the builders' own errors, and
//! typos fail when the file is read.

use std::time::Duration;

use tower_redis_ratelimit::key::{GlobalKey, KeyExtractor};
use tower_redis_ratelimit::RulesConfig;
use tower_redis_ratelimit::{Backend, Calendar, ConfigError};
use tower_redis_ratelimit::{
    InFlightConfig, LimitLayer, LimitSet, PeriodConfig, RollingConfig, TokenBucketConfig,
};

fn parse(text: &str) -> RulesConfig {
    toml::from_str(text).unwrap_or_else(|error| panic!("{error}"))
}

/// The message of a file that does not read: what only a file can get wrong (a
/// calendar unit, a missing zone, an offset, a status) fails when it is read, with the
/// setting named.
fn read_error(text: &str) -> String {
    toml::from_str::<RulesConfig>(text)
        .expect_err("the configuration must not read")
        .to_string()
}

fn build_error(text: &str) -> ConfigError {
    parse(text)
        .build()
        .expect_err("the configuration must not build")
}

/// Values the builders refuse are refused with the builders' own errors; values that
/// only a file can get wrong are `InvalidValue`s naming their setting.
#[test]
fn invalid_values_are_the_builders_errors() {
    let backend = Backend::in_process();
    let rule = |limit: &str| format!("[[rules]]\nname = \"r\"\nlimit = {limit}\n");
    let zero_quota = build_error(&rule(
        r#"{ algorithm = "period", quota = 0, period = "1s" }"#,
    ));
    let builder = LimitLayer::builder(&backend, PeriodConfig::new(0, Duration::from_secs(1)))
        .name("r")
        .build()
        .unwrap_err();
    assert_eq!(zero_quota, builder);
    assert!(matches!(
        zero_quota,
        ConfigError::Zero {
            setting: "quota",
            ..
        }
    ));

    let zero_burst = build_error(&rule(
        r#"{ algorithm = "token_bucket", rate = 1, burst = 0 }"#,
    ));
    let builder = LimitLayer::builder(
        &backend,
        TokenBucketConfig::new(1, Duration::from_secs(1), 0),
    )
    .name("r")
    .build()
    .unwrap_err();
    assert_eq!(zero_burst, builder);

    let buckets = build_error(&rule(
        r#"{ algorithm = "rolling_window", limit = 1, buckets = 100000, interval = "1s" }"#,
    ));
    let builder = LimitLayer::builder(
        &backend,
        RollingConfig::new(1, 100_000, Duration::from_secs(1)),
    )
    .name("r")
    .build()
    .unwrap_err();
    assert_eq!(buckets, builder);

    let offset = build_error(&rule(
        r#"{ algorithm = "period", quota = 1, period = "1day", align = "+19:00" }"#,
    ));
    let builder = LimitLayer::builder(
        &backend,
        PeriodConfig::new(1, Duration::from_secs(86_400))
            .align(tower_redis_ratelimit::UtcOffset::from_hours(19)),
    )
    .name("r")
    .build()
    .unwrap_err();
    assert_eq!(offset, builder);

    let period = r#"{ algorithm = "period", quota = 1, period = "1s" }"#;
    let name = build_error(&rule(period).replace("\"r\"", "\"a{b}\""));
    let builder = LimitLayer::builder(&backend, PeriodConfig::new(1, Duration::from_secs(1)))
        .name("a{b}")
        .build()
        .unwrap_err();
    assert_eq!(name, builder);

    let share = build_error(&format!("{}fallback_share = 1.5\n", rule(period)));
    let builder = LimitLayer::builder(&backend, PeriodConfig::new(1, Duration::from_secs(1)))
        .name("r")
        .fallback_share(1.5)
        .build()
        .unwrap_err();
    assert_eq!(share, builder);

    // The backend's checks.
    let cases: [(&str, ConfigError); 5] = [
        (
            "prefix = \"\"",
            Backend::builder().prefix("").build().unwrap_err(),
        ),
        (
            "max_local_keys = 0",
            Backend::builder().max_local_keys(0).build().unwrap_err(),
        ),
        (
            "call_timeout = \"0s\"",
            Backend::builder()
                .call_timeout(Duration::ZERO)
                .build()
                .unwrap_err(),
        ),
        (
            "breaker = { failure_ratio = 0.0 }",
            Backend::builder()
                .breaker_failure_ratio(0.0)
                .build()
                .unwrap_err(),
        ),
        (
            "url = \"nonsense://\"",
            Backend::builder()
                .redis_url("nonsense://")
                .build()
                .unwrap_err(),
        ),
    ];
    for (text, builder) in cases {
        assert_eq!(
            build_error(&format!("[backend]\n{text}\n")),
            builder,
            "{text}"
        );
    }

    // What only text can get wrong.
    let key = |key: &str| build_error(&format!("{}key = {key}\n", rule(period)));
    for bad in [
        r#"{ forwarded_ip = { trusted = ["10.0.0.0/33"] } }"#,
        r#"{ forwarded_ip = { trusted = ["proxy.internal"] } }"#,
        r#"{ header = "x api key" }"#,
        r#"{ or = ["peer_ip"] }"#,
        r#"{ peer_ip = { ipv6_prefix = 129 } }"#,
    ] {
        assert!(
            matches!(key(bad), ConfigError::InvalidValue { setting: "key", .. }),
            "{bad}: {:?}",
            key(bad)
        );
    }
    let align = read_error(&rule(
        r#"{ algorithm = "period", quota = 1, period = "1s", align = "noon" }"#,
    ));
    assert!(align.contains("invalid `align`"), "{align}");
    let missing = read_error(&format!(
        "{}missing_key = {{ reject = 200 }}\n",
        rule(period)
    ));
    assert!(missing.contains("invalid `missing_key`"), "{missing}");
    let free = build_error(&format!("{}cost = 0\n", rule(period)));
    assert!(
        matches!(
            free,
            ConfigError::Zero {
                setting: "cost",
                ..
            }
        ),
        "{free:?}"
    );
    let twice = build_error(&format!("{}{}", rule(period), rule(period)));
    assert!(matches!(twice, ConfigError::Conflict { .. }), "{twice:?}");
    let no_file = build_error(
        "[backend]\nurl = \"rediss://h\"\ntls = { ca_file = \"/nonexistent/ca.pem\" }\n",
    );
    assert!(
        matches!(no_file, ConfigError::InvalidValue { .. }),
        "{no_file:?}"
    );
}

/// Typos fail when the file is read: unknown fields, algorithms, extractors, policies
/// and durations, with serde's message naming them.
#[test]
fn typos_fail_loudly() {
    let cases = [
        ("[backend]\nprefx = \"a\"", "unknown field `prefx`"),
        ("[backend]\nbreaker = { windw = \"1s\" }", "unknown field `windw`"),
        ("[backend]\nfailure_policy = \"fail_opn\"", "unknown variant `fail_opn`"),
        ("[backend]\ncall_timeout = \"10 parsecs\"", "expected a duration"),
        ("[[rule]]\nname = \"r\"", "unknown field `rule`"),
        ("[[rules]]\nname = \"r\"\nlimit = { algorithm = \"leaky_bucket\", rate = 1 }", "unknown variant `leaky_bucket`"),
        ("[[rules]]\nname = \"r\"\nlimit = { algorithm = \"period\", quota = 1, period = \"1s\", burst = 3 }", "unknown field `burst`"),
        ("[[rules]]\nname = \"r\"\nlimit = { algorithm = \"period\", period = \"1s\" }", "missing field `quota`"),
        ("[[rules]]\nname = \"r\"\nlimit = { algorithm = \"period\", quota = 1, period = \"1s\" }\nshadw = true", "unknown field `shadw`"),
        ("[[rules]]\nname = \"r\"\nlimit = { algorithm = \"period\", quota = 1, period = \"1s\" }\nkey = \"peer_iq\"", "unknown variant `peer_iq`"),
        ("[[rules]]\nname = \"r\"\nlimit = { algorithm = \"period\", quota = 1, period = \"1s\" }\nkey = { heder = \"x\" }", "unknown variant `heder`"),
        ("[[rules]]\nname = \"r\"\nlimit = { algorithm = \"period\", quota = 1, period = \"1s\" }\nkey = { forwarded_ip = { trustd = [] } }", "unknown field `trustd`"),
        ("[[rules]]\nname = \"r\"\nlimit = { algorithm = \"period\", quota = 1, period = \"1s\" }\nkey = { header = \"a\", path = {} }", "names one extractor"),
    ];
    for (text, message) in cases {
        let error = toml::from_str::<RulesConfig>(text)
            .expect_err(text)
            .to_string();
        assert!(error.contains(message), "{text}\n---\n{error}");
    }
}

/// A fixed cost above what a limit can ever hold would refuse every request with a 429
/// and no `Retry-After`: it is a build error on every layer type, naming the policy.
#[test]
fn a_fixed_cost_above_the_capacity_is_refused_when_built() {
    use tower_redis_ratelimit::FailurePolicy;
    use tower_redis_ratelimit::PeriodConfig;
    use tower_redis_ratelimit::TokenBucketConfig;

    let backend = Backend::in_process();
    let second = Duration::from_secs(1);
    let above = |error: ConfigError, policy: &str, capacity: u64| {
        let text = error.to_string();
        assert!(
            matches!(&error, ConfigError::CostAboveCapacity { cost: 5, capacity: c, fallback: false, .. } if *c == capacity),
            "{error:?}"
        );
        assert!(text.contains(&format!("\"{policy}\"")), "{text}");
        assert!(text.contains("fixed cost of 5"), "{text}");
    };
    let error = LimitLayer::builder(&backend, TokenBucketConfig::new(1, second, 2))
        .name("tb")
        .cost(5)
        .build()
        .unwrap_err();
    above(error, "tb", 2);
    let error = LimitLayer::builder(&backend, PeriodConfig::new(4, second))
        .name("p")
        .cost(5)
        .build()
        .unwrap_err();
    above(error, "p", 4);
    let error = LimitLayer::builder(&backend, RollingConfig::new(3, 2, second))
        .name("r")
        .cost(5)
        .build()
        .unwrap_err();
    above(error, "r", 3);
    // A set: above its smallest member, whichever it is.
    let error = LimitLayer::builder(
        &backend,
        LimitSet::new()
            .limit("day", PeriodConfig::new(1_000, 86_400 * second))
            .limit("burst", TokenBucketConfig::new(1, second, 2)),
    )
    .name("s")
    .cost(5)
    .build()
    .unwrap_err();
    above(error, "s.burst", 2);

    // At the capacity it builds.
    LimitLayer::builder(&backend, TokenBucketConfig::new(1, second, 5))
        .name("tb")
        .key(GlobalKey)
        .cost(5)
        .build()
        .unwrap();

    // On Redis, the in-process fallback holds the share of each limit: a cost above it
    // would refuse everything while Redis is unreachable.
    let redis = Backend::builder()
        .redis_url("redis://127.0.0.1:1")
        .fallback_share(0.25)
        .build()
        .unwrap();
    let shared = || {
        LimitLayer::builder(&redis, TokenBucketConfig::new(10, second, 10))
            .name("tb")
            .key(GlobalKey)
            .cost(5)
    };
    let error = shared().build().unwrap_err();
    assert!(
        matches!(
            error,
            ConfigError::CostAboveCapacity {
                cost: 5,
                capacity: 2,
                fallback: true,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(error.to_string().contains("fallback_share"), "{error}");
    // Failing open or closed, the fallback's limits never apply.
    shared()
        .failure_policy(FailurePolicy::FailOpen)
        .build()
        .unwrap();
    shared().fallback_share(0.5).build().unwrap();

    // A maximum key length shorter than any key the extractor makes refuses everything
    // as keyless.
    for max in [5, 14] {
        let error = LimitLayer::builder(&backend, PeriodConfig::new(1, second))
            .name("p")
            .key(tower_redis_ratelimit::key::HeaderKey::from_static(
                "x-api-key",
            ))
            .max_key_len(max)
            .build()
            .unwrap_err();
        assert!(matches!(error, ConfigError::Conflict { .. }), "{error:?}");
    }
    let error = LimitLayer::builder(&backend, PeriodConfig::new(1, second))
        .name("p")
        .max_key_len(5)
        .build()
        .unwrap_err();
    assert!(error.to_string().contains("max_key_len"), "{error}");
    LimitLayer::builder(&backend, PeriodConfig::new(1, second))
        .name("p")
        .key(tower_redis_ratelimit::key::HeaderKey::from_static(
            "x-api-key",
        ))
        .max_key_len(15)
        .build()
        .unwrap();

    // The same check sees through combinators and rule files (it once skipped every
    // extractor but a bare `GlobalKey` or `HeaderKey`).
    let wrapped = LimitLayer::builder(&backend, PeriodConfig::new(1, second))
        .name("p")
        .key(
            tower_redis_ratelimit::key::HeaderKey::from_static("x-api-key")
                .or(tower_redis_ratelimit::key::GlobalKey),
        )
        .max_key_len(5)
        .build()
        .unwrap_err();
    assert!(
        matches!(wrapped, ConfigError::Conflict { .. }),
        "{wrapped:?}"
    );
    let from_file = build_error(
        "[[rules]]\nname = \"r\"\nlimit = { algorithm = \"period\", quota = 1, period = \"1s\" }\n\
         key = { header = \"x-api-key\" }\nmax_key_len = 10\n",
    );
    assert!(
        matches!(from_file, ConfigError::Conflict { .. }),
        "{from_file:?}"
    );
}

/// A Redis URL that cannot work says what is wrong (the scheme, the host, the port),
/// never "did not parse", and never shows its password.
#[test]
fn redis_url_errors_say_what_is_wrong() {
    let error = |url: &str| {
        let error = Backend::builder().redis_url(url).build().unwrap_err();
        assert!(
            matches!(error, ConfigError::InvalidRedisUrl { .. }),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(!text.contains("did not parse"), "{text}");
        text
    };
    assert!(
        error("http://127.0.0.1:6379")
            .contains("`http://` is not a Redis scheme; expected `redis://`"),
        "{}",
        error("http://127.0.0.1:6379")
    );
    assert!(error("127.0.0.1:6379").contains("no scheme"));
    assert!(error("").contains("the URL is empty"));
    assert_eq!(
        error("redis://127.0.0.1:99999"),
        "invalid Redis URL: port 99999 is out of range: expected 1 to 65535"
    );
    let secret = error("redis://app:hunter2/x@10.0.0.1:6379");
    assert!(!secret.contains("hunter2"), "{secret}");
    assert!(secret.contains("percent-encoded"), "{secret}");
    #[cfg(feature = "cluster")]
    {
        let error = Backend::builder()
            .redis_cluster_urls(["redis://10.0.0.1:7000", "redis://10.0.0.2:70000"])
            .build()
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid Redis URL: cluster URL #2: port 70000 is out of range: expected 1 to 65535"
        );
    }
}

/// No error about a Redis URL shows a secret the URL holds, wherever the URL goes wrong
/// (issue 53, item 1): the Redis client's own text echoes the value it could not read,
/// so the crate never passes that text on as it is.
#[test]
fn no_redis_url_error_shows_a_secret() {
    let urls = [
        // A `?` typed for `&`: the client's error quoted `resp3?password=s3cret`.
        "redis://127.0.0.1:6379/2?protocol=resp3?password=s3cret",
        "redis://127.0.0.1:6379/2?protocol=s3cret",
        "redis://:s3cret@127.0.0.1:6379/2?protocol=resp9",
        "redis://user:s3cret@127.0.0.1:6379/not-a-db",
        "redis://127.0.0.1:6379/0?password=s3cret&protocol=x",
        "redis://s3cret@127.0.0.1:6379/0?protocol=s3cret",
        "redis://127.0.0.1:6379/s3cret",
    ];
    let mut refused = 0;
    for url in urls {
        if let Err(error) = Backend::builder().redis_url(url).build() {
            refused += 1;
            let text = error.to_string();
            let debug = format!("{error:?}");
            assert!(!text.contains("s3cret"), "{url}: {text}");
            assert!(!debug.contains("s3cret"), "{url}: {debug}");
            assert!(text.starts_with("invalid Redis URL: "), "{url}: {text}");
        }
    }
    assert!(
        refused >= 4,
        "only {refused} of the broken URLs were refused"
    );
}

/// Calendar windows from a file: a zone the database does not know is the builder's own
/// error naming it; the calendar's names are checked when the file is built.
#[test]
fn calendar_windows_from_a_file() {
    let rule = |limit: &str| format!("[[rules]]\nname = \"sms\"\nlimit = {limit}\n");
    let ok = parse(&rule(
        r#"{ algorithm = "period", quota = 5, calendar = "day", zone = "America/New_York" }"#,
    ));
    ok.build().expect("a day in New York builds");
    let week = parse(&rule(
        r#"{ algorithm = "period", quota = 5, calendar = "week", zone = "Europe/Berlin", week_starts = "sunday" }"#,
    ));
    week.build().expect("a week from Sunday builds");

    let unknown = build_error(&rule(
        r#"{ algorithm = "period", quota = 5, calendar = "day", zone = "America/Gotham" }"#,
    ));
    let builder = LimitLayer::builder(
        &Backend::in_process(),
        PeriodConfig::calendar(5, Calendar::day("America/Gotham")),
    )
    .name("sms")
    .build()
    .unwrap_err();
    assert_eq!(unknown, builder);
    assert!(unknown.to_string().contains("America/Gotham"), "{unknown}");
    assert!(matches!(
        unknown,
        ConfigError::InvalidValue {
            setting: "zone",
            ..
        }
    ));

    // What only the file can get wrong fails when it is read.
    for (limit, message) in [
        (
            r#"{ algorithm = "period", quota = 5, calendar = "day" }"#,
            "`zone` is required",
        ),
        (
            r#"{ algorithm = "period", quota = 5, calendar = "fortnight", zone = "UTC" }"#,
            "\"fortnight\"",
        ),
        (
            r#"{ algorithm = "period", quota = 5, calendar = "week", zone = "UTC", week_starts = "caturday" }"#,
            "\"caturday\"",
        ),
        (
            r#"{ algorithm = "period", quota = 5, calendar = "day", zone = "UTC", week_starts = "monday" }"#,
            "`week_starts`",
        ),
        (
            r#"{ algorithm = "period", quota = 5, zone = "UTC" }"#,
            "`calendar` is required",
        ),
    ] {
        let error = read_error(&rule(limit));
        assert!(error.contains(message), "{limit}: {error}");
    }
    // What the period limiter refuses is its own error, when the rule is built.
    for (limit, message) in [
        (
            r#"{ algorithm = "period", quota = 5, calendar = "day", zone = "UTC", period = "1day" }"#,
            "`period`, not both",
        ),
        (
            r#"{ algorithm = "period", quota = 5, calendar = "day", zone = "UTC", align = "+01:00" }"#,
            "`align`, not both",
        ),
    ] {
        let error = build_error(&rule(limit)).to_string();
        assert!(error.contains(message), "{limit}: {error}");
    }
}

/// The rule file the `rules` example serves (a calendar day in Paris among its rules)
/// reads and builds.
#[test]
fn the_example_rule_file_builds() {
    let config = parse(include_str!("../examples/rules.toml"));
    config.build().expect("examples/rules.toml builds");
}

/// A layer built without `.key(..)` does not build: one limit shared by every request
/// is spelled `.key(GlobalKey)`, never a silent default (issue 51).
#[test]
fn a_layer_without_a_key_does_not_build() {
    let backend = Backend::in_process();
    let minute = Duration::from_secs(60);
    let layer = || LimitLayer::builder(&backend, PeriodConfig::new(10, minute)).name("api");
    let error = layer().build().unwrap_err();
    assert!(
        matches!(error, ConfigError::Missing { setting: "key", .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains("`.key(..)`"), "{message}");
    assert!(
        message.contains("`.key(GlobalKey)` is one limit shared by every request"),
        "{message}"
    );
    layer().key(GlobalKey).build().unwrap();

    let in_flight = || LimitLayer::builder(&backend, InFlightConfig::new(2)).name("exports");
    let error = in_flight().build().unwrap_err();
    assert!(
        matches!(error, ConfigError::Missing { setting: "key", .. }),
        "{error:?}"
    );
    in_flight().key(GlobalKey).build().unwrap();
    // What only a rate limit does fails to build, never ignored.
    for error in [
        in_flight()
            .key(GlobalKey)
            .wait(std::time::Duration::from_secs(1))
            .build(),
        in_flight().key(GlobalKey).priority(|_| 0.5).build(),
    ]
    .map(Result::unwrap_err)
    {
        assert!(matches!(error, ConfigError::Conflict { .. }), "{error:?}");
    }

    // A rule file without `key` keeps its documented default, the global key.
    parse(
        "[[rules]]\nname = \"r\"\nlimit = { algorithm = \"period\", quota = 1, period = \"1s\" }\n",
    )
    .build()
    .unwrap();
}

/// A fixed cost above a set's smallest member is refused for a set wrapped in plans
/// too: the check asks the limiter (`Limiter::bounding_policy`), not its type.
#[test]
fn a_fixed_cost_above_a_wrapped_sets_smallest_member_does_not_build() {
    use tower_redis_ratelimit::limit::{ExtensionPlan, Plans};
    use tower_redis_ratelimit::LimitSet;
    use tower_redis_ratelimit::PeriodConfig;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum Plan {
        Free,
    }
    let backend = Backend::in_process();
    let minute = Duration::from_secs(60);
    let set = || {
        LimitSet::new()
            .limit("rpm", PeriodConfig::new(100, minute))
            .limit("burst", PeriodConfig::new(3, Duration::from_secs(1)))
    };
    let layer = |cost: u32| {
        let plans = Plans::new(ExtensionPlan::<Plan>::new()).plan(Plan::Free, "free", set());
        LimitLayer::builder(&backend, plans)
            .name("api")
            .key(GlobalKey)
            .cost(cost)
            .build()
    };
    let error = layer(5).unwrap_err();
    assert!(
        matches!(
            &error,
            ConfigError::CostAboveCapacity {
                cost: 5,
                capacity: 3,
                fallback: false,
                ..
            }
        ),
        "{error:?}"
    );
    layer(3).unwrap();
}
