//! Where Redis is, as given to the [`BackendBuilder`] (a URL, cluster URLs, sentinels or
//! a pool of the user's, with TLS certificates and credentials), made into the
//! connector the backend connects with when it is built.

use super::BackendBuilder;
use crate::backend::redis::connect::{Connector, Target};
use crate::backend::redis::credentials::{CredentialsProvider, Rotation};
use crate::backend::redis::url::{check_url, refused};
use crate::error::ConfigError;

impl BackendBuilder {
    fn target(mut self, target: Target) -> Self {
        self.target = Some(target);
        self.targets += 1;
        self
    }

    /// Keeps limits in the Redis at `url`: `redis://[user:password@]host:port/db`, or
    /// with the `tls` feature `rediss://` (the system's certificate authorities, or the
    /// ones given to [`tls_ca_pem`](Self::tls_ca_pem)). The backend connects itself, with
    /// `TCP_NODELAY` on its socket (a pool built with `deadpool_redis::Config` leaves it
    /// off, which costs about a round trip per request under concurrency); this is the
    /// recommended way to reach a single Redis. Nothing connects until the first check:
    /// [`Backend::warm_up`](crate::Backend::warm_up) tells at start-up whether
    /// Redis accepts the credentials.
    ///
    /// ```
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .prefix("myapp")
    ///     .build()?;
    /// assert!(backend.is_redis());
    /// # Ok(()) }
    /// ```
    pub fn redis_url(self, url: impl Into<String>) -> Self {
        self.target(Target::Url(url.into()))
    }

    /// Keeps limits in Redis through this pool (without it, limits stay in-process).
    ///
    /// The backend takes one connection out of the pool and keeps it (every check is
    /// pipelined on it), replacing it when it fails. Given a pool whose connections have
    /// `TCP_NODELAY` on and the pool's URL for its change subscription
    /// ([`subscription_url`](Self::subscription_url)), it has every property of a
    /// backend that connects itself ([`redis_url`](Self::redis_url)):
    ///
    /// ```no_run
    /// use tower_redis_ratelimit::{deadpool_redis::{self, redis, Runtime}, Backend};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "redis://127.0.0.1:6379";
    /// // `TCP_NODELAY` on the pool's connections: a check is one small request, which
    /// // Nagle's algorithm would hold back while an earlier one is unacknowledged.
    /// let info = redis::IntoConnectionInfo::into_connection_info(url)?
    ///     .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    /// let pool = deadpool_redis::Pool::builder(deadpool_redis::Manager::new(info)?)
    ///     .runtime(Runtime::Tokio1)
    ///     .build()?;
    /// let backend = Backend::builder()
    ///     .redis(pool.clone())
    ///     // Resets and blocks made on other instances reach this one at once.
    ///     .subscription_url(url)
    ///     .build()?;
    /// # let _ = backend; Ok(()) }
    /// ```
    ///
    /// What the backend cannot do for a pool (deadpool-redis 0.23, redis 1.x): turn
    /// `TCP_NODELAY` on, or subscribe without being told where. A pool's manager keeps
    /// its client (address, credentials, socket settings) private, a connection taken
    /// from it exposes no socket, and a pool made by `deadpool_redis::Config` always has
    /// `TCP_NODELAY` off (its `Config` has no TCP setting): under concurrency that costs
    /// about a round trip per request. Without a subscription URL, resets and blocks
    /// made on other instances reach this one within the deny cache's
    /// [max age](Self::deny_cache_max_age).
    pub fn redis(self, pool: deadpool_redis::Pool) -> Self {
        self.target(Target::Pool(Connector::Pool(pool, None)))
    }

    /// For a backend on a pool of yours ([`redis`](Self::redis), or
    /// [`redis_cluster`](Self::redis_cluster) with one node's URL): the URL of the pool's
    /// Redis, which the backend's change subscription connects to, so that resets and
    /// blocks made on other instances reach this one within about a round trip (see
    /// [Changes on every instance](crate::guide::operations#changes-on-every-instance)),
    /// exactly as for a backend that connects itself. deadpool-redis does not tell a
    /// pool's address, hence this setting. The subscription's connection has
    /// `TCP_NODELAY`, speaks RESP3, and trusts the certificates of
    /// [`tls_ca_pem`](Self::tls_ca_pem); its credentials are those of the URL. Without it
    /// (the default) a backend on a pool has no subscription; [`build`](Self::build)
    /// refuses it for a backend without a pool.
    pub fn subscription_url(mut self, url: impl Into<String>) -> Self {
        self.subscription_url = Some(url.into());
        self
    }

    /// Keeps limits in the Redis Cluster whose nodes (some or all of them) are at `urls`.
    /// The backend connects itself, with `TCP_NODELAY` on every socket; this is the
    /// recommended way to reach a cluster. Every script touches the keys of one hash slot
    /// (a check's limits and its block share the limited key's hash tag), so each check
    /// runs on the node that owns the key's slot. Nothing connects until the first check.
    ///
    /// ```
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_cluster_urls(["redis://10.0.0.1:7000", "redis://10.0.0.2:7000"])
    ///     .build()?;
    /// assert!(backend.is_redis());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn redis_cluster_urls<I, U>(self, urls: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        self.target(Target::ClusterUrls(
            urls.into_iter().map(Into::into).collect(),
        ))
    }

    /// Keeps limits in the master that the Redis Sentinels at `sentinel_urls` name
    /// `master` (`redis://[user:password@]host:port` of each sentinel; `rediss://` with
    /// the `tls` feature, for the sentinels and the master alike). Every new connection
    /// asks the sentinels for the current master, so after a failover the backend
    /// follows the new one (its connection to the old one fails, and the failure policies
    /// answer until then). The master's own credentials are
    /// [`sentinel_master_auth`](Self::sentinel_master_auth).
    ///
    /// Counts that the old master had not yet replicated when it failed are lost with
    /// it: those keys may admit up to that many requests again.
    ///
    /// ```
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_sentinel("mymaster", ["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"])
    ///     .sentinel_master_auth("limiter", "secret")
    ///     .build()?;
    /// assert!(backend.is_redis());
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn redis_sentinel<I, U>(self, master: impl Into<String>, sentinel_urls: I) -> Self
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        self.target(Target::Sentinel {
            master: master.into(),
            urls: sentinel_urls.into_iter().map(Into::into).collect(),
        })
    }

    /// The ACL user and password of the master found through
    /// [`redis_sentinel`](Self::redis_sentinel) (`default` as the user for a
    /// `requirepass` password).
    #[cfg(feature = "sentinel")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sentinel")))]
    pub fn sentinel_master_auth(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.master_auth = Some((username.into(), password.into()));
        self
    }

    /// Authenticates every connection the backend makes with credentials from
    /// `provider`, for short-lived tokens (AWS ElastiCache and MemoryDB IAM auth, Azure
    /// Entra ID) or passwords that rotate. A new connection uses credentials at most
    /// three quarters through their lifetime (asking the provider for new ones if
    /// needed); before they expire, the backend asks again and every kept connection
    /// re-authenticates (`AUTH`, pipelined with its checks: no decision fails at the
    /// switch). One backend asks the provider once per renewal, however many
    /// connections it has (a cluster's nodes).
    ///
    /// A provider that fails is asked again with a backoff (100 ms doubling to 30 s)
    /// and logged at most every ten seconds; kept connections stay on their current
    /// credentials meanwhile, and a new connection fails, which the layers'
    /// [failure policy](crate::FailurePolicy) answers for.
    ///
    /// For connections the backend makes ([`redis_url`](Self::redis_url),
    /// [`redis_cluster_urls`](Self::redis_cluster_urls), the master of
    /// [`redis_sentinel`](Self::redis_sentinel)); credentials in a URL are replaced.
    /// [`build`](Self::build) refuses it with a pool (configure the pool's own
    /// connections) or with [`sentinel_master_auth`](Self::sentinel_master_auth).
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use tower_redis_ratelimit::{Credentials, Backend};
    ///
    /// # fn main() -> Result<(), tower_redis_ratelimit::ConfigError> {
    /// let backend = Backend::builder()
    ///     .redis_url("redis://127.0.0.1:6379")
    ///     .credentials(|| async {
    ///         let token = std::env::var("REDIS_TOKEN")?;
    ///         Ok::<_, std::env::VarError>(
    ///             Credentials::new("limiter", token).expires_in(Duration::from_secs(900)),
    ///         )
    ///     })
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn credentials(mut self, provider: impl CredentialsProvider) -> Self {
        self.credentials = Some(Box::new(provider));
        self
    }

    /// Trusts the certificate authorities in `pem` (one or more PEM certificates) for
    /// `rediss://` connections, instead of the system's.
    ///
    /// ```no_run
    /// use tower_redis_ratelimit::Backend;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = Backend::builder()
    ///     .redis_url("rediss://limiter:secret@redis.internal:6380")
    ///     .tls_ca_pem(std::fs::read("ca.pem")?)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Presents this client certificate and key (PEM) on `rediss://` connections, for
    /// servers that require mutual TLS (`tls-auth-clients yes`).
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_auth_pem(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.client = Some((certificate.into(), key.into()));
        self
    }

    /// Keeps limits in a Redis Cluster through this pool. Every script touches the keys of
    /// one hash slot,
    /// so each check runs on the node that owns the key's slot. The pool's connections
    /// keep the pool's socket settings (`TCP_NODELAY` off unless the pool was built with
    /// it, as for [`redis`](Self::redis));
    /// [`redis_cluster_urls`](Self::redis_cluster_urls) turns it on. Give the URL of one
    /// node to [`subscription_url`](Self::subscription_url) for the change subscription
    /// (a `PUBLISH` on any node reaches the subscribers of every node).
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    pub fn redis_cluster(self, pool: deadpool_redis::cluster::Pool) -> Self {
        self.target(Target::Pool(Connector::ClusterPool(pool, None)))
    }

    /// The connector for the place of Redis given, if one was; refuses more than one,
    /// and credentials where they cannot apply.
    pub(super) fn connector(&mut self) -> Result<Option<Connector>, ConfigError> {
        if self.targets > 1 {
            return Err(ConfigError::Conflict {
                reason:
                    "more than one of a Redis URL, cluster URLs, sentinels and a pool were given",
            });
        }
        if self.credentials.is_some() && matches!(self.target, Some(Target::Pool(_))) {
            return Err(ConfigError::Conflict {
                reason: "credentials apply to connections the backend makes from URLs, not to \
                         a pool's: give the pool's own configuration the credentials",
            });
        }
        #[cfg(feature = "sentinel")]
        if self.credentials.is_some() && self.master_auth.is_some() {
            return Err(ConfigError::Conflict {
                reason: "both sentinel_master_auth and a credentials provider were given",
            });
        }
        let credentials = self.credentials.take().map(Rotation::new);
        let subscription = self.subscription_url.take();
        // Every URL given, for scrubbing the Redis client's errors of their secrets.
        let mut given: Vec<String> = subscription.iter().cloned().collect();
        match &self.target {
            Some(Target::Url(url)) => given.push(url.clone()),
            #[cfg(feature = "cluster")]
            Some(Target::ClusterUrls(urls)) => given.extend(urls.iter().cloned()),
            #[cfg(feature = "sentinel")]
            Some(Target::Sentinel { urls, .. }) => given.extend(urls.iter().cloned()),
            _ => {}
        }
        let given: Vec<&str> = given.iter().map(String::as_str).collect();
        let invalid = |error: deadpool_redis::redis::RedisError| refused(&error, &given);
        if subscription.is_some() && !matches!(self.target, Some(Target::Pool(_))) {
            return Err(ConfigError::Conflict {
                reason: "`subscription_url` is for a backend on a pool of yours: a backend \
                         that connects itself subscribes through its own connections",
            });
        }
        Ok(match self.target.take() {
            None => None,
            Some(Target::Pool(connector)) => Some(match subscription {
                None => connector,
                Some(url) => {
                    check_url(&url, None)?;
                    connector
                        .with_subscription(&url, &self.tls)
                        .map_err(invalid)?
                }
            }),
            Some(Target::Url(url)) => {
                check_url(&url, None)?;
                Some(Connector::from_url(&url, &self.tls, credentials).map_err(invalid)?)
            }
            #[cfg(feature = "cluster")]
            Some(Target::ClusterUrls(urls)) => {
                if urls.is_empty() {
                    return Err(ConfigError::Missing {
                        setting: "redis_cluster_urls",
                    });
                }
                for (i, url) in urls.iter().enumerate() {
                    check_url(url, Some(("cluster URL", i)))?;
                }
                Some(Connector::from_cluster_urls(&urls, &self.tls, credentials).map_err(invalid)?)
            }
            #[cfg(feature = "sentinel")]
            Some(Target::Sentinel { master, urls }) => {
                for (i, url) in urls.iter().enumerate() {
                    check_url(url, Some(("sentinel URL", i)))?;
                }
                Some(
                    Connector::from_sentinels(
                        &master,
                        &urls,
                        self.master_auth.as_ref(),
                        &self.tls,
                        credentials,
                    )
                    .map_err(invalid)?,
                )
            }
        })
    }
}
