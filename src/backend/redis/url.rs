//! Redis URLs checked before the Redis client parses them, so that a wrong one fails when
//! the backend is built with a message that names what is wrong (the scheme, the host,
//! the port, a cargo feature), never the URL's password.

use crate::error::ConfigError;

/// The Redis client's refusal of a URL as a [`ConfigError`], without what it quotes of
/// the URL: the client's detail is the part it could not read, which may be a password
/// or any query value (issue 53: a `?` typed for `&` put `password=...` into one). What
/// is left is scrubbed of everything in `urls` that may be a secret.
pub(crate) fn refused(error: &deadpool_redis::redis::RedisError, urls: &[&str]) -> ConfigError {
    let mut reason = error.to_string();
    if let Some(detail) = error.detail().filter(|detail| !detail.is_empty()) {
        reason = reason.replace(detail, "(the value is not shown: it may hold a secret)");
    }
    let mut secrets: Vec<&str> = urls.iter().flat_map(|url| secrets(url)).collect();
    // The longest first, so that a password is hidden whole before a part of it.
    secrets.sort_by_key(|secret| std::cmp::Reverse(secret.len()));
    for secret in secrets {
        reason = reason.replace(secret, "***");
    }
    ConfigError::InvalidRedisUrl {
        reason: format!("the Redis client refused it: {reason}"),
    }
}

/// What in `url` may be a secret: the user information (everything before the last `@`,
/// as `redact` hides it) and every query value, at least three bytes long (shorter ones
/// would hide letters of the message; the client's detail is gone already).
fn secrets(url: &str) -> impl Iterator<Item = &str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let info = rest.rfind('@').map(|at| &rest[..at]);
    let user_parts = info
        .into_iter()
        .flat_map(|info| std::iter::once(info).chain(info.split(':')));
    let query = rest.split_once('?').map_or("", |(_, query)| query);
    let values = query
        .split(['&', '?', '#'])
        .filter_map(|pair| pair.split_once('=').map(|(_, value)| value));
    user_parts.chain(values).filter(|secret| secret.len() >= 3)
}

/// Checks a Redis URL before the Redis client parses it, so that its error says what is
/// wrong (the scheme, the host, the port, a cargo feature) instead of "did not parse".
/// `which` names one URL of several (`cluster URL`, its index). Never puts the URL's
/// user information (a password) into the message.
pub(crate) fn check_url(url: &str, which: Option<(&str, usize)>) -> Result<(), ConfigError> {
    url_problem(url, cfg!(feature = "tls")).map_or(Ok(()), |reason| {
        Err(ConfigError::InvalidRedisUrl {
            reason: match which {
                Some((what, i)) => format!("{what} #{}: {reason}", i + 1),
                None => reason,
            },
        })
    })
}

/// The schemes the Redis client accepts, for messages.
const SCHEMES: &str = "`redis://`, `rediss://` (TLS), `valkey://`, `valkeys://` (TLS), \
                       `redis+unix://`, `valkey+unix://` or `unix://`";

/// What is wrong with `url`, if something is; `tls`: whether the `tls` feature is on.
fn url_problem(url: &str, tls: bool) -> Option<String> {
    let url = url.trim();
    if url.is_empty() {
        return Some(format!(
            "the URL is empty; expected `redis://host:6379` (schemes: {SCHEMES})"
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Some(format!(
            "no scheme: expected `redis://host:6379`, `rediss://host:6380` or \
             `redis+unix:///path/to/redis.sock` (schemes: {SCHEMES})"
        ));
    };
    let scheme = scheme.to_ascii_lowercase();
    match scheme.as_str() {
        "redis" | "valkey" => {}
        "rediss" | "valkeys" if tls => {}
        "rediss" | "valkeys" => {
            return Some(format!(
                "`{scheme}://` (TLS) needs the `tls` cargo feature of tower-redis-ratelimit: \
                 `features = [\"tls\"]` in Cargo.toml"
            ));
        }
        "redis+unix" | "valkey+unix" | "unix" => {
            let path = rest.split(['?', '#']).next().unwrap_or_default();
            return (!path.starts_with('/')).then(|| {
                format!(
                    "`{scheme}://` needs the socket's absolute path: \
                     `{scheme}:///path/to/redis.sock`"
                )
            });
        }
        "redis+cluster" | "redis-cluster" => {
            return Some(
                "Redis Cluster: give the nodes' `redis://` URLs to `redis_cluster_urls` \
                 (cargo feature `cluster`)"
                    .to_owned(),
            );
        }
        "redis+sentinel" | "redis-sentinel" | "sentinel" => {
            return Some(
                "Redis Sentinel: give the master's name and the sentinels' `redis://` URLs \
                 to `redis_sentinel` (cargo feature `sentinel`)"
                    .to_owned(),
            );
        }
        _ => {
            // The scheme is shown only when it looks like one (never a mangled secret).
            let shown = if !scheme.is_empty()
                && scheme.len() <= 16
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'+' || b == b'-' || b == b'.')
            {
                format!("`{scheme}://`")
            } else {
                "the scheme".to_owned()
            };
            return Some(format!("{shown} is not a Redis scheme; expected {SCHEMES}"));
        }
    }
    if rest.contains(",redis") || rest.contains(", redis") {
        return Some(
            "several URLs in one: give a cluster's nodes to `redis_cluster_urls` (cargo \
             feature `cluster`)"
                .to_owned(),
        );
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    // A password with `/`, `?` or `#` cuts the authority short: then nothing of it is
    // shown, since what looks like a host or a port may be part of the password.
    let has_userinfo = url.contains('@');
    let host_port = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        match v6.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, port)) => match port.strip_prefix(':') {
                Some(port) => (host, Some(port)),
                None => return Some("unexpected text after the IPv6 address `]`".to_owned()),
            },
            None => return Some("an IPv6 address without its closing `]`".to_owned()),
        }
    } else {
        match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        }
    };
    if host.is_empty() {
        return Some("no host: expected `redis://host:6379`".to_owned());
    }
    if let Some(port) = port {
        let secret = |text: String| {
            if has_userinfo {
                format!("{text} (a password with `/`, `?`, `#` or `@` must be percent-encoded)")
            } else {
                text
            }
        };
        if port.is_empty() {
            return Some("empty port after `:`; expected 1 to 65535".to_owned());
        }
        if !port.bytes().all(|b| b.is_ascii_digit()) {
            return Some(secret(
                "the port is not a number; expected 1 to 65535".to_owned(),
            ));
        }
        if !matches!(port.parse::<u32>(), Ok(1..=65_535)) {
            let shown = if has_userinfo {
                "the port".to_owned()
            } else {
                format!("port {port}")
            };
            return Some(secret(format!(
                "{shown} is out of range: expected 1 to 65535"
            )));
        }
    }
    let path = rest[authority.len()..]
        .split(['?', '#'])
        .next()
        .unwrap_or_default();
    let db = path.trim_matches('/');
    if !db.is_empty() && db.parse::<u32>().is_err() {
        return Some(
            "the path must be a database number (`redis://host:6379/2`), or nothing".to_owned(),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::url_problem;

    fn problem(url: &str) -> String {
        url_problem(url, true).unwrap_or_else(|| panic!("{url} was accepted"))
    }

    #[test]
    fn valid_urls_pass() {
        for url in [
            "redis://127.0.0.1:6379",
            "redis://127.0.0.1",
            "redis://localhost:6379/2",
            "redis://user:p%40ss@redis.internal:6380/0",
            "redis://:secret@[::1]:6379",
            "rediss://redis.internal:6380#insecure",
            "valkey://h:1",
            "redis+unix:///run/redis.sock",
            "unix:///run/redis.sock?db=2",
        ] {
            assert_eq!(url_problem(url, true), None, "{url}");
        }
    }

    #[test]
    fn each_problem_is_named() {
        assert!(problem("").contains("empty"));
        let scheme = problem("http://127.0.0.1:6379");
        assert!(
            scheme.contains("`http://` is not a Redis scheme"),
            "{scheme}"
        );
        assert!(
            scheme.contains("`redis://`") && scheme.contains("`rediss://`"),
            "{scheme}"
        );
        assert!(scheme.contains("`redis+unix://`"), "{scheme}");
        assert!(problem("127.0.0.1:6379").starts_with("no scheme"));
        assert!(problem("localhost").starts_with("no scheme"));
        let port = problem("redis://127.0.0.1:99999");
        assert_eq!(port, "port 99999 is out of range: expected 1 to 65535");
        assert!(problem("redis://h:0").contains("out of range"));
        assert!(problem("redis://h:abc").contains("not a number"));
        assert!(problem("redis://:6379").starts_with("no host"));
        assert!(problem("redis://").starts_with("no host"));
        assert!(problem("redis://h:6379/x").contains("database number"));
        assert!(problem("unix://run/redis.sock").contains("absolute path"));
        assert!(problem("redis://a:1,redis://b:2").contains("redis_cluster_urls"));
        assert!(problem("redis+sentinel://h:26379").contains("`sentinel`"));
        assert!(problem("redis+cluster://h:7000").contains("`cluster`"));
        let tls = url_problem("rediss://h:6380", false).unwrap();
        assert!(tls.contains("the `tls` cargo feature"), "{tls}");
        assert!(url_problem("valkeys://h:6380", false)
            .unwrap()
            .contains("`tls`"));
    }

    #[test]
    fn no_message_shows_a_password() {
        for url in [
            "redis://user:s3cr3t/x@host:6379",
            "redis://user:99999/x@host:6379",
            "redis://user:s3cr3t@host:99999",
            "redis://user:s3cr3t@host:port",
            "redis://user:s3cr3t@:6379",
            "http://user:s3cr3t@host:6379",
            "redis://user:s3cr3t@host:6379/db",
            "rediss://user:s3cr3t@host:6379",
        ] {
            let message = url_problem(url, false).unwrap_or_default();
            for secret in ["s3cr3t", "99999", "user"] {
                assert!(!message.contains(secret), "{url}: {message}");
            }
        }
    }
}
