//! Configuration as data (feature `serde`); the docs are on [`RulesConfig`].

mod backend;
mod key;
mod rule;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

pub use self::backend::BackendConfig;
pub use self::key::KeyConfig;
pub use self::rule::RuleConfig;
pub(crate) use self::rule::{MissingKeyFile, PeriodFile, RollingFile, TokenBucketFile};
use crate::backend::Backend;
use crate::error::ConfigError;
use crate::key::KeyExtractor;
use crate::limit::LimitLayer;
use crate::limiter::Limiter;

/// A backend and the rules on it: the whole of a rule file. Configuration as data
/// (feature `serde`): the backend and the rate-limit rules from a TOML, YAML or JSON file, or the environment, through the loader of your choice.
///
/// [`RulesConfig`] is a [`BackendConfig`] and a list of [`RuleConfig`]s. Every type
/// implements `serde::Deserialize` (and `Serialize`), refuses unknown fields (a typo
/// fails loudly) and builds through the same builders as code does
/// ([`BackendBuilder`](crate::BackendBuilder), [`LayerBuilder`](crate::LayerBuilder)),
/// so a setting that cannot work is the same [`ConfigError`] when the layers are built,
/// never a surprise at request time.
///
/// Every rule builds a `LimitLayer<Arc<dyn Limiter>, Box<dyn KeyExtractor>>`, one type
/// whatever its algorithm and key, so the layers of a file fit in one `Vec`; [`Rules::apply`] stacks them on an axum router.
///
/// | setting | TOML |
/// |---|---|
/// | the backend | [`BackendConfig`]: `url`, `cluster_urls`, `sentinel`, `tls`, `prefix`, `call_timeout`, `probe_interval`, `breaker`, `failure_policy`, `fallback_share`, `fallback_rounding`, `max_local_keys`, `deny_cache` |
/// | a rule | [`RuleConfig`]: `name`, `limit`, `key`, `cost`, `failure_policy`, `fallback_share`, `fallback_rounding`, `shadow`, `headers`, `decision_extension`, `missing_key`, `max_key_len` |
/// | an algorithm | [`LimitConfig`](crate::LimitConfig), holding the algorithm's own config type: `{ algorithm = "period", quota, period, align, lockout }` or with `calendar`, `zone`, `week_starts` ([`PeriodConfig`](crate::PeriodConfig)), `{ algorithm = "token_bucket", rate, per, burst, lockout, lease }` ([`TokenBucketConfig`](crate::TokenBucketConfig)), `{ algorithm = "rolling_window", limit, buckets, interval, lockout }` ([`RollingConfig`](crate::RollingConfig)) |
/// | a key | [`KeyConfig`]: `"global"`, `"peer_ip"`, `{ forwarded_ip = { trusted = [..] } }`, `{ header = ".." }`, `"path"`, `"matched_path"`, `{ or = [..] }`, `{ and = [..] }` |
///
/// Durations are [`humantime`](https://docs.rs/humantime) strings (`"100ms"`, `"2s"`,
/// `"1h 30m"`), read with the `humantime-serde` crate.
///
/// # Example
///
/// ```
/// use axum::{routing::get, Router};
/// use tower_redis_ratelimit::RulesConfig;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config: RulesConfig = toml::from_str(r#"
///     [backend]
///     # url = "redis://127.0.0.1:6379"   # without it, limits stay in this process
///     prefix = "myapp"
///     failure_policy = "fallback"
///
///     [[rules]]
///     name = "per-client"
///     limit = { algorithm = "token_bucket", rate = 10, per = "1s", burst = 20 }
///     key = { or = [{ header = "x-api-key" }, { forwarded_ip = { trusted = ["10.0.0.0/8"] } }] }
///
///     [[rules]]
///     name = "everybody"
///     limit = { algorithm = "rolling_window", limit = 1000, buckets = 10, interval = "100ms" }
///     key = "global"
///     shadow = true
/// "#)?;
///
/// let rules = config.build()?;
/// let app: Router = rules.apply(Router::new().route("/", get(|| async { "hello" })));
/// # let _ = app; Ok(()) }
/// ```
///
/// # Overriding from the environment
///
/// The file is yours to load, so is the environment: change a backend setting on the
/// file's [`builder`](BackendConfig::builder) before building (or merge sources with a
/// loader such as `figment` or `config`).
///
/// ```
/// # use tower_redis_ratelimit::RulesConfig;
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config: RulesConfig = toml::from_str("[[rules]]\nname = \"a\"\nlimit = { algorithm = \"period\", quota = 5, period = \"1m\" }")?;
/// let mut backend = config.backend.builder()?;
/// if let Ok(url) = std::env::var("REDIS_URL") {
///     backend = backend.redis_url(url); // `Debug` of a backend never shows its password
/// }
/// let rules = config.build_on(&backend.build()?)?;
/// # let _ = rules; Ok(()) }
/// ```

#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct RulesConfig {
    /// Where limits are kept (default: in this process).
    #[serde(default)]
    pub backend: BackendConfig,
    /// The rules, outermost first.
    #[serde(default)]
    pub rules: Vec<RuleConfig>,
}

impl RulesConfig {
    /// Builds the backend, then every rule's layer on it.
    ///
    /// # Errors
    ///
    /// The first [`ConfigError`] of the backend or a rule, or
    /// [`ConfigError::Conflict`] when two rules share a name (they would share their
    /// counters).
    pub fn build(&self) -> Result<Rules, ConfigError> {
        let backend = self.backend.build()?;
        self.build_on(&backend)
    }

    /// Builds every rule's layer on a backend of your own (or one built from
    /// [`BackendConfig`] once and shared).
    ///
    /// # Errors
    ///
    /// As [`build`](Self::build), the backend aside.
    pub fn build_on(&self, backend: &Backend) -> Result<Rules, ConfigError> {
        for (i, rule) in self.rules.iter().enumerate() {
            if self.rules[..i].iter().any(|other| other.name == rule.name) {
                return Err(ConfigError::Conflict {
                    reason: "two rules have the same name (they would share their counters)",
                });
            }
        }
        let layers = self
            .rules
            .iter()
            .map(|rule| rule.build(backend))
            .collect::<Result<_, _>>()?;
        Ok(Rules {
            backend: backend.clone(),
            layers,
        })
    }
}

/// The built backend and layers of a [`RulesConfig`], in the order of the file.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Rules {
    /// The backend every layer runs on.
    pub backend: Backend,
    /// One layer per rule, outermost first.
    pub layers: Vec<LimitLayer<Arc<dyn Limiter>, Box<dyn KeyExtractor>>>,
}

impl Rules {
    /// Wraps `router` in every layer, the first rule outermost (it sees requests first);
    /// a request rejected by one rule is not counted by the rules after it.
    ///
    /// Without axum, stack the [`layers`](Self::layers) yourself, e.g. with
    /// `tower::ServiceBuilder::layer` for each or by boxing the service
    /// (`tower::util::BoxCloneService`) after each layer.
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn apply<S>(&self, router: axum::Router<S>) -> axum::Router<S>
    where
        S: Clone + Send + Sync + 'static,
    {
        // `Router::layer` wraps what is already there: add the innermost rule first.
        self.layers
            .iter()
            .rev()
            .fold(router, |router, layer| router.layer(layer.clone()))
    }
}
