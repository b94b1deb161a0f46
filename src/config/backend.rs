//! The backend as data: [`BackendConfig`].

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::backend::{Backend, BackendBuilder, FailurePolicy, ShareRounding};
use crate::error::ConfigError;

/// Where limits are kept and how Redis trouble is handled; every setting left out keeps
/// the default of [`BackendBuilder`]. Without `url`, `cluster_urls` or `sentinel`, limits
/// stay in this process.
///
/// Durations are [`humantime`](https://docs.rs/humantime) strings (`"100ms"`, `"2s"`).
/// `Debug` shows URLs without their user and password, and never the sentinel master's
/// password; `Serialize` writes them as they are (it is your own file).
///
/// ```toml
/// url = "redis://limiter:secret@127.0.0.1:6379/0"  # or cluster_urls = [...], or [backend.sentinel]
/// prefix = "myapp"
/// call_timeout = "100ms"
/// probe_interval = "500ms"
/// failure_policy = "fallback"
/// fallback_share = 0.25
/// max_local_keys = 100000
/// deny_cache = 10000
/// deny_cache_max_age = "1s"
/// time_source = "server"
/// breaker = { window = "2s", min_calls = 20, failure_ratio = 0.5, recovery = "1s" }
/// tls = { ca_file = "ca.pem", client_cert_file = "client.pem", client_key_file = "client.key" }
/// ```
///
/// | setting | in code |
/// |---|---|
/// | `url` | [`BackendBuilder::redis_url`] |
/// | `cluster_urls` | `BackendBuilder::redis_cluster_urls` (feature `cluster`) |
/// | `sentinel = { master_name, urls, username, password }` | `BackendBuilder::redis_sentinel` and `sentinel_master_auth` (feature `sentinel`) |
/// | `tls = { ca_file, client_cert_file, client_key_file }` | `BackendBuilder::tls_ca_pem` and `tls_client_auth_pem` (feature `tls`), from these files when the backend is built |
/// | `prefix`, `call_timeout`, `probe_interval` | [`BackendBuilder::prefix`], [`call_timeout`](BackendBuilder::call_timeout), [`probe_interval`](BackendBuilder::probe_interval) |
/// | `breaker = { window, min_calls, failure_ratio, recovery }` | [`BackendBuilder::breaker_window`], [`breaker_min_calls`](BackendBuilder::breaker_min_calls), [`breaker_failure_ratio`](BackendBuilder::breaker_failure_ratio), [`recovery`](BackendBuilder::recovery) |
/// | `failure_policy`, `fallback_share`, `fallback_rounding` | [`BackendBuilder::failure_policy`], [`fallback_share`](BackendBuilder::fallback_share), [`fallback_rounding`](BackendBuilder::fallback_rounding) (`at_least_one` or `within_limit`) |
/// | `max_local_keys`, `deny_cache`, `deny_cache_max_age` | [`BackendBuilder::max_local_keys`], [`deny_cache`](BackendBuilder::deny_cache), [`deny_cache_max_age`](BackendBuilder::deny_cache_max_age) |
/// | `time_source` | [`BackendBuilder::time_source`]: `"server"` (the default) or `"caller"` |
///
/// The settings are read from the file only; to change one in code (a URL from the
/// environment), take the file's [`builder`](Self::builder) and call the setter on it.
#[derive(Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct BackendConfig {
    /// [`BackendBuilder::redis_url`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) url: Option<String>,
    /// `BackendBuilder::redis_cluster_urls` (feature `cluster`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) cluster_urls: Vec<String>,
    /// `BackendBuilder::redis_sentinel` (feature `sentinel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sentinel: Option<SentinelConfig>,
    /// Certificates for `rediss://` (feature `tls`), read from files when the backend
    /// is built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) tls: Option<TlsConfig>,
    /// [`BackendBuilder::prefix`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) prefix: Option<String>,
    /// [`BackendBuilder::call_timeout`].
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) call_timeout: Option<Duration>,
    /// [`BackendBuilder::probe_interval`].
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) probe_interval: Option<Duration>,
    /// The breaker's settings.
    #[serde(default)]
    pub(crate) breaker: BreakerSettings,
    /// [`BackendBuilder::failure_policy`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failure_policy: Option<FailurePolicy>,
    /// [`BackendBuilder::fallback_share`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fallback_share: Option<f64>,
    /// [`BackendBuilder::fallback_rounding`]: `at_least_one` or `within_limit`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fallback_rounding: Option<ShareRounding>,
    /// [`BackendBuilder::max_local_keys`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) max_local_keys: Option<u64>,
    /// [`BackendBuilder::deny_cache`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) deny_cache: Option<usize>,
    /// [`BackendBuilder::deny_cache_max_age`].
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) deny_cache_max_age: Option<Duration>,
    /// [`BackendBuilder::time_source`]: `"server"` (the default) or `"caller"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) time_source: Option<crate::backend::TimeSource>,
}

/// The breaker of a [`BackendConfig`]: `window`, `min_calls`, `failure_ratio`,
/// `recovery` ([`BackendBuilder::breaker_window`] and the next ones).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BreakerSettings {
    /// [`BackendBuilder::breaker_window`].
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) window: Option<Duration>,
    /// [`BackendBuilder::breaker_min_calls`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) min_calls: Option<u32>,
    /// [`BackendBuilder::breaker_failure_ratio`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) failure_ratio: Option<f64>,
    /// [`BackendBuilder::recovery`].
    #[serde(
        default,
        with = "humantime_serde",
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) recovery: Option<Duration>,
}

/// Redis Sentinel: the master's name, the sentinels' URLs (`redis://host:26379`) and the
/// master's ACL user and password.
#[derive(Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SentinelConfig {
    /// The name the sentinels know the master by.
    pub(crate) master_name: String,
    /// The sentinels.
    pub(crate) urls: Vec<String>,
    /// The master's ACL user (default `default` when a password is given).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) username: Option<String>,
    /// The master's password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) password: Option<String>,
}

/// PEM files for `rediss://`: a CA bundle to trust instead of the system's, and a client
/// certificate and key for mutual TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TlsConfig {
    /// [`BackendBuilder::tls_ca_pem`](crate::BackendBuilder), read from this file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ca_file: Option<PathBuf>,
    /// The client certificate (with `client_key_file`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_cert_file: Option<PathBuf>,
    /// The client certificate's private key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) client_key_file: Option<PathBuf>,
}

/// A URL without its credentials: `redis://***@host:6379/0`.
///
/// A password may hold `/`, `?`, `#` or `@` unescaped, so the end of the authority cannot
/// be trusted before the credentials are gone: everything between the scheme and the
/// *last* `@` of the URL is hidden (an `@` in a path or query hides a little more than
/// needed, never less). The values of the query parameters that carry credentials
/// (`pass`, `password`, `user`, `username`, `token`, as `redis+unix://` URLs do) are
/// hidden too.
pub(crate) fn redact(url: &str) -> String {
    // A credential parameter hides the rest of the URL (its value may hold `&`, `#` or
    // `@` unescaped); then the credentials of the authority, up to the last `@` left.
    let mut shown = url;
    let mut tail = "";
    let lower = url.to_ascii_lowercase();
    for name in ["pass=", "password=", "user=", "username=", "token="] {
        for separator in ['?', '&'] {
            let pattern = format!("{separator}{name}");
            if let Some(at) = lower.find(&pattern) {
                let end = at + pattern.len();
                if end <= shown.len() {
                    shown = &url[..end];
                    tail = "***";
                }
            }
        }
    }
    let rest_at = shown.find("://").map_or(0, |i| i + 3);
    let (head, rest) = shown.split_at(rest_at);
    match rest.rfind('@') {
        Some(at) => format!("{head}***{}{tail}", &rest[at..]),
        None => format!("{shown}{tail}"),
    }
}

struct Redacted<'a>(&'a [String]);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|url| redact(url)))
            .finish()
    }
}

impl fmt::Debug for BackendConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendConfig")
            .field("url", &self.url.as_deref().map(redact))
            .field("cluster_urls", &Redacted(&self.cluster_urls))
            .field("sentinel", &self.sentinel)
            .field("tls", &self.tls)
            .field("prefix", &self.prefix)
            .field("call_timeout", &self.call_timeout)
            .field("probe_interval", &self.probe_interval)
            .field("breaker", &self.breaker)
            .field("failure_policy", &self.failure_policy)
            .field("fallback_share", &self.fallback_share)
            .field("fallback_rounding", &self.fallback_rounding)
            .field("max_local_keys", &self.max_local_keys)
            .field("deny_cache", &self.deny_cache)
            .field("deny_cache_max_age", &self.deny_cache_max_age)
            .field("time_source", &self.time_source)
            .finish()
    }
}

impl fmt::Debug for SentinelConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SentinelConfig")
            .field("master_name", &self.master_name)
            .field("urls", &Redacted(&self.urls))
            .field("username", &self.username.as_ref().map(|_| "***"))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

#[cfg(not(all(feature = "cluster", feature = "sentinel", feature = "tls")))]
fn needs(setting: &'static str, feature: &str) -> ConfigError {
    ConfigError::InvalidValue {
        setting,
        reason: format!("needs the `{feature}` cargo feature"),
    }
}

#[cfg(feature = "tls")]
fn read(setting: &'static str, path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|error| ConfigError::InvalidValue {
        setting,
        reason: format!("cannot read {}: {error}", path.display()),
    })
}

impl BackendConfig {
    /// The [`BackendBuilder`] this configuration sets up (TLS files are read here), for
    /// settings a file cannot hold (a pool of your own).
    ///
    /// # Errors
    ///
    /// [`ConfigError::InvalidValue`] for a TLS file that cannot be read, a client
    /// certificate without its key (or the reverse), or a setting whose cargo feature
    /// (`cluster`, `sentinel`, `tls`) is off.
    pub fn builder(&self) -> Result<BackendBuilder, ConfigError> {
        let mut builder = Backend::builder();
        if let Some(url) = &self.url {
            builder = builder.redis_url(url.clone());
        }
        if !self.cluster_urls.is_empty() {
            #[cfg(feature = "cluster")]
            {
                builder = builder.redis_cluster_urls(self.cluster_urls.iter().cloned());
            }
            #[cfg(not(feature = "cluster"))]
            return Err(needs("cluster_urls", "cluster"));
        }
        if let Some(sentinel) = &self.sentinel {
            #[cfg(feature = "sentinel")]
            {
                builder = builder.redis_sentinel(&sentinel.master_name, sentinel.urls.iter());
                match (&sentinel.username, &sentinel.password) {
                    (user, Some(password)) => {
                        let user = user.as_deref().unwrap_or("default");
                        builder = builder.sentinel_master_auth(user, password.clone());
                    }
                    (Some(_), None) => {
                        return Err(ConfigError::Missing {
                            setting: "sentinel.password",
                        })
                    }
                    (None, None) => {}
                }
            }
            #[cfg(not(feature = "sentinel"))]
            {
                let _ = sentinel;
                return Err(needs("sentinel", "sentinel"));
            }
        }
        if let Some(tls) = &self.tls {
            #[cfg(feature = "tls")]
            {
                if let Some(path) = &tls.ca_file {
                    builder = builder.tls_ca_pem(read("tls.ca_file", path)?);
                }
                match (&tls.client_cert_file, &tls.client_key_file) {
                    (Some(cert), Some(key)) => {
                        builder = builder.tls_client_auth_pem(
                            read("tls.client_cert_file", cert)?,
                            read("tls.client_key_file", key)?,
                        );
                    }
                    (None, None) => {}
                    _ => {
                        return Err(ConfigError::Conflict {
                            reason: "a TLS client certificate needs both `client_cert_file` and `client_key_file`",
                        })
                    }
                }
            }
            #[cfg(not(feature = "tls"))]
            {
                let _ = tls;
                return Err(needs("tls", "tls"));
            }
        }
        if let Some(prefix) = &self.prefix {
            builder = builder.prefix(prefix.clone());
        }
        if let Some(timeout) = self.call_timeout {
            builder = builder.call_timeout(timeout);
        }
        if let Some(interval) = self.probe_interval {
            builder = builder.probe_interval(interval);
        }
        let breaker = &self.breaker;
        if let Some(window) = breaker.window {
            builder = builder.breaker_window(window);
        }
        if let Some(calls) = breaker.min_calls {
            builder = builder.breaker_min_calls(calls);
        }
        if let Some(ratio) = breaker.failure_ratio {
            builder = builder.breaker_failure_ratio(ratio);
        }
        if let Some(recovery) = breaker.recovery {
            builder = builder.recovery(recovery);
        }
        if let Some(policy) = self.failure_policy {
            builder = builder.failure_policy(policy);
        }
        if let Some(share) = self.fallback_share {
            builder = builder.fallback_share(share);
        }
        if let Some(rounding) = self.fallback_rounding {
            builder = builder.fallback_rounding(rounding);
        }
        if let Some(keys) = self.max_local_keys {
            builder = builder.max_local_keys(keys);
        }
        if let Some(capacity) = self.deny_cache {
            builder = builder.deny_cache(capacity);
        }
        if let Some(max_age) = self.deny_cache_max_age {
            builder = builder.deny_cache_max_age(max_age);
        }
        if let Some(source) = self.time_source {
            builder = builder.time_source(source);
        }
        Ok(builder)
    }

    /// Checks every setting with [`BackendBuilder::build`]'s own checks and builds the
    /// backend.
    ///
    /// # Errors
    ///
    /// See [`builder`](Self::builder) and [`BackendBuilder::build`].
    pub fn build(&self) -> Result<Backend, ConfigError> {
        self.builder()?.build()
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(redact("redis://u:p@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("rediss://:p@h"), "rediss://***@h");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
        assert_eq!(redact("redis://u:p@ss@h"), "redis://***@h");
        // An `@` after the authority hides more than needed, never less.
        assert_eq!(redact("redis://h:1/0?x=a@b"), "redis://***@b");
        assert_eq!(
            redact("redis+unix:///run/redis.sock?db=1&pass=s3cret&user=me"),
            "redis+unix:///run/redis.sock?db=1&pass=***"
        );
    }

    /// Passwords made of the characters that end a URL's authority (`/`, `?`, `#`, `@`)
    /// and others, written unescaped or escaped, in every place a URL holds them.
    #[test]
    fn generated_passwords_never_show() {
        let alphabet: Vec<char> = "aZ09/?#@:%+=&-_.~!$*'()[],;".chars().collect();
        // A small deterministic generator (xorshift): many passwords, same every run.
        let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..5_000 {
            let len = 4 + (next() % 28) as usize;
            let password: String = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let escaped: String = password
                .bytes()
                .map(|b| {
                    if b.is_ascii_alphanumeric() {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    }
                })
                .collect();
            for secret in [&password, &escaped] {
                for url in [
                    format!("redis://user:{secret}@redis.internal:6379/0"),
                    format!("rediss://:{secret}@10.0.0.1:6380"),
                    format!("redis://{secret}@h"),
                    format!("redis://user:{secret}@h:1/2?protocol=resp3#x"),
                    format!("redis+unix:///tmp/r.sock?db=0&pass={secret}"),
                ] {
                    let shown = redact(&url);
                    // The longest run of the secret that could be mistaken for it.
                    assert!(
                        !shown.contains(secret.as_str()),
                        "{secret:?} shows in {shown:?} (from {url:?})"
                    );
                }
            }
        }
    }
}
