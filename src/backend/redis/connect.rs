//! Where the backend's connection comes from: a user's `deadpool-redis` pool, or a client
//! the backend builds itself from URLs (one node, a cluster, or the master a group of
//! Redis Sentinels names), with `TCP_NODELAY` and, with the `tls` feature, a custom CA and
//! client certificates.

use std::fmt;
#[cfg(feature = "sentinel")]
use std::sync::Arc;
use std::time::Duration;

use deadpool_redis::redis;

use super::conn::Conn;
use super::credentials::Rotation;
use super::fault::ScriptError;

/// Certificates for TLS connections (`rediss://`); never shown by `Debug`.
#[derive(Clone, Default)]
pub(crate) struct Tls {
    /// PEM certificates of the authorities to trust instead of the system's.
    pub(crate) ca: Option<Vec<u8>>,
    /// PEM certificate and key of this client, for mutual TLS.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("ca", &self.ca.is_some())
            .field("client_certificate", &self.client.is_some())
            .finish()
    }
}

impl Tls {
    fn is_empty(&self) -> bool {
        self.ca.is_none() && self.client.is_none()
    }

    #[cfg(feature = "tls")]
    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

/// Refuses certificates when the crate was built without TLS.
#[cfg(not(feature = "tls"))]
fn without_tls(tls: &Tls) -> Result<(), redis::RedisError> {
    if tls.is_empty() {
        Ok(())
    } else {
        Err(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "TLS certificates need the `tls` feature",
        )))
    }
}

/// Where Redis is, as given to the backend's builder: the connector of a pool, or the
/// URLs to make one from.
pub(crate) enum Target {
    Pool(Connector),
    Url(String),
    #[cfg(feature = "cluster")]
    ClusterUrls(Vec<String>),
    #[cfg(feature = "sentinel")]
    Sentinel {
        master: String,
        urls: Vec<String>,
    },
}

impl Target {
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Pool(_) => "pool",
            Self::Url(_) => "url",
            #[cfg(feature = "cluster")]
            Self::ClusterUrls(_) => "cluster urls",
            #[cfg(feature = "sentinel")]
            Self::Sentinel { .. } => "sentinel",
        }
    }
}

/// Where connections come from.
#[derive(Clone)]
pub(crate) enum Connector {
    /// A user's pool; the backend takes one connection out of it and keeps it. The
    /// client of its change subscription, when given one (the pool does not tell its
    /// address).
    Pool(deadpool_redis::Pool, Option<Box<redis::Client>>),
    /// A client the backend built from a URL, and the credentials its connections
    /// authenticate with when they rotate.
    Client(Box<redis::Client>, Option<Rotation>),
    /// A user's cluster pool, and the client of one node for the change subscription,
    /// when given one.
    #[cfg(feature = "cluster")]
    ClusterPool(deadpool_redis::cluster::Pool, Option<Box<redis::Client>>),
    /// A cluster client the backend built from URLs, a client for each of those
    /// nodes (the change subscription is made on one of them) and the credentials
    /// their connections authenticate with when they rotate.
    #[cfg(feature = "cluster")]
    Cluster(
        Box<redis::cluster::ClusterClient>,
        Box<[redis::Client]>,
        Option<Rotation>,
    ),
    /// The master a group of sentinels names, asked again for every new connection.
    #[cfg(feature = "sentinel")]
    Sentinel(
        Arc<tokio::sync::Mutex<redis::sentinel::SentinelClient>>,
        Option<Rotation>,
    ),
}

impl Connector {
    /// Whether its connections go to a Redis Cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        #[cfg(feature = "cluster")]
        if matches!(self, Self::ClusterPool(..) | Self::Cluster(..)) {
            return true;
        }
        false
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the URLs: they may hold passwords.
        let kind = match self {
            Self::Pool(..) => "pool",
            Self::Client(..) => "url",
            #[cfg(feature = "cluster")]
            Self::ClusterPool(..) => "cluster pool",
            #[cfg(feature = "cluster")]
            Self::Cluster(..) => "cluster urls",
            #[cfg(feature = "sentinel")]
            Self::Sentinel(..) => "sentinel",
        };
        f.debug_struct("Connector").field("kind", &kind).finish()
    }
}

impl Connector {
    /// A user's pool whose change subscription connects to `url` (the pool's Redis, or
    /// one node of its cluster), with `TCP_NODELAY` and the certificates of `tls`.
    pub(crate) fn with_subscription(self, url: &str, tls: &Tls) -> Result<Self, redis::RedisError> {
        let client = Some(Box::new(client(url, tls)?));
        Ok(match self {
            Self::Pool(pool, _) => Self::Pool(pool, client),
            #[cfg(feature = "cluster")]
            Self::ClusterPool(pool, _) => Self::ClusterPool(pool, client),
            other => other,
        })
    }
}

/// `TCP_NODELAY` on: a check is one small request, which Nagle's algorithm would hold
/// back while an earlier one is unacknowledged.
fn nodelay() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

impl Connector {
    /// A client for `url` (`redis://` or, with the `tls` feature, `rediss://`), whose
    /// connections authenticate with `credentials` when given.
    pub(crate) fn from_url(
        url: &str,
        tls: &Tls,
        credentials: Option<Rotation>,
    ) -> Result<Self, redis::RedisError> {
        Ok(Self::Client(Box::new(client(url, tls)?), credentials))
    }

    /// A cluster client for the nodes at `urls`.
    #[cfg(feature = "cluster")]
    pub(crate) fn from_cluster_urls(
        urls: &[String],
        tls: &Tls,
        credentials: Option<Rotation>,
    ) -> Result<Self, redis::RedisError> {
        let nodes = urls
            .iter()
            .map(|url| client(url, tls))
            .collect::<Result<Box<[_]>, _>>()?;
        let mut builder =
            redis::cluster::ClusterClientBuilder::new(urls.iter().map(String::as_str))
                .tcp_settings(nodelay());
        if let Some(credentials) = credentials.clone() {
            builder = builder.set_credentials_provider(credentials);
        }
        #[cfg(feature = "tls")]
        let builder = if tls.is_empty() {
            builder
        } else {
            builder.certs(tls.certificates())
        };
        #[cfg(not(feature = "tls"))]
        without_tls(tls)?;
        Ok(Self::Cluster(
            Box::new(builder.build()?),
            nodes,
            credentials,
        ))
    }

    /// A client for the master named `master` by the sentinels at `urls`. The sentinels'
    /// credentials come from their URLs, the master's from `master_auth`; TLS to the
    /// master when the sentinels are reached with `rediss://`.
    #[cfg(feature = "sentinel")]
    pub(crate) fn from_sentinels(
        master: &str,
        urls: &[String],
        master_auth: Option<&(String, String)>,
        tls: &Tls,
        credentials: Option<Rotation>,
    ) -> Result<Self, redis::RedisError> {
        use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
        let infos = urls
            .iter()
            .map(|url| redis::IntoConnectionInfo::into_connection_info(url.as_str()))
            .collect::<Result<Vec<_>, _>>()?;
        let secure = infos
            .iter()
            .any(|info| matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }));
        let first = infos.first().map(|info| info.redis_settings().clone());
        let mut builder = SentinelClientBuilder::new(
            infos.iter().map(|info| info.addr().clone()),
            master,
            SentinelServerType::Master,
        )?
        .set_client_to_sentinel_tcp_settings(nodelay())
        .set_client_to_redis_tcp_settings(nodelay());
        if let Some(settings) = &first {
            if let Some(username) = settings.username() {
                builder = builder.set_client_to_sentinel_username(username);
            }
            if let Some(password) = settings.password() {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        if let Some((username, password)) = master_auth {
            builder = builder
                .set_client_to_redis_username(username)
                .set_client_to_redis_password(password);
        }
        if secure {
            builder = builder
                .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure)
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure);
        }
        #[cfg(feature = "tls")]
        if !tls.is_empty() {
            builder = builder
                .set_client_to_sentinel_certificates(tls.certificates())
                .set_client_to_redis_certificates(tls.certificates());
        }
        #[cfg(not(feature = "tls"))]
        without_tls(tls)?;
        Ok(Self::Sentinel(
            Arc::new(tokio::sync::Mutex::new(builder.build()?)),
            credentials,
        ))
    }

    /// Whether connections are made with TLS (`rediss://`), as far as the connector
    /// tells (a pool given by the user does not).
    pub(crate) fn is_tls(&self) -> bool {
        match self {
            Self::Client(client, _) => matches!(
                client.get_connection_info().addr(),
                redis::ConnectionAddr::TcpTls { .. }
            ),
            _ => false,
        }
    }

    /// A new multiplexed connection, owned by the backend (taken out of a pool, so the
    /// pool never recycles it with a `PING`): clones share one socket and pipeline
    /// requests, so one of them serves every concurrent check.
    pub(crate) async fn connect(&self, timeout: Duration) -> Result<Conn, ScriptError> {
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            // Every call has its own deadline.
            .set_response_timeout(None);
        let with_credentials = |credentials: &Option<Rotation>| match credentials {
            Some(credentials) => config.clone().set_credentials_provider(credentials.clone()),
            None => config.clone(),
        };
        Ok(match self {
            Self::Pool(pool, _) => Conn::Single(deadpool_redis::Connection::take(
                pool.get().await.map_err(ScriptError::from_pool)?,
            )),
            Self::Client(client, credentials) => Conn::Single(
                client
                    .get_multiplexed_async_connection_with_config(&with_credentials(credentials))
                    .await
                    .map_err(|error| {
                        // A TLS connection that times out most often waits for a
                        // handshake a plaintext server never answers: say so.
                        if error.is_timeout() && self.is_tls() {
                            ScriptError::TlsHandshake(timeout)
                        } else {
                            ScriptError::Redis(error)
                        }
                    })?,
            ),
            #[cfg(feature = "cluster")]
            Self::ClusterPool(pool, _) => Conn::Cluster(deadpool_redis::cluster::Connection::take(
                pool.get().await.map_err(ScriptError::from_pool)?,
            )),
            #[cfg(feature = "cluster")]
            Self::Cluster(client, ..) => Conn::Cluster(client.get_async_connection().await?),
            #[cfg(feature = "sentinel")]
            Self::Sentinel(client, credentials) => Conn::Single(
                client
                    .lock()
                    .await
                    .get_async_connection_with_config(&with_credentials(credentials))
                    .await?,
            ),
        })
    }
}

impl Connector {
    /// A connection subscribed to `channel`, whose messages go to `messages` (see
    /// `changes.rs`): made as a check connection is, with the same address, TLS and
    /// credentials (rotated on it too), but in RESP3, where a multiplexed connection
    /// takes messages beside replies. On a cluster, on one node (`attempt` picks which,
    /// in turn): a `PUBLISH` on any node reaches the subscribers of every node. For a
    /// user's pool, from the client of its
    /// [`subscription_url`](crate::BackendBuilder::subscription_url); `None` without one
    /// (deadpool-redis keeps a pool's address and credentials to itself).
    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        timeout: Duration,
        messages: tokio::sync::mpsc::UnboundedSender<redis::PushInfo>,
        attempt: usize,
    ) -> Result<Option<redis::aio::MultiplexedConnection>, redis::RedisError> {
        // (Without the `cluster` feature, only a cluster's nodes take turns.)
        #[cfg(not(feature = "cluster"))]
        let _ = attempt;
        let (client, credentials) = match self {
            Self::Pool(_, None) => return Ok(None),
            Self::Pool(_, Some(client)) => (resp3(client)?, None),
            #[cfg(feature = "cluster")]
            Self::ClusterPool(_, None) => return Ok(None),
            #[cfg(feature = "cluster")]
            Self::ClusterPool(_, Some(client)) => (resp3(client)?, None),
            Self::Client(client, credentials) => (resp3(client)?, credentials.clone()),
            #[cfg(feature = "cluster")]
            Self::Cluster(_, nodes, credentials) => {
                let Some(node) = nodes.get(attempt % nodes.len().max(1)) else {
                    return Ok(None);
                };
                (resp3(node)?, credentials.clone())
            }
            #[cfg(feature = "sentinel")]
            Self::Sentinel(client, credentials) => {
                let master = client.lock().await.async_get_client().await?;
                (resp3(&master)?, credentials.clone())
            }
        };
        let mut config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            // The subscription's `PING`s have their own deadline.
            .set_response_timeout(None)
            .set_push_sender(messages);
        if let Some(credentials) = credentials {
            config = config.set_credentials_provider(credentials);
        }
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        conn.subscribe(channel).await?;
        Ok(Some(conn))
    }
}

/// A client for `url` (`redis://` or, with the `tls` feature, `rediss://`), with
/// `TCP_NODELAY` and the certificates of `tls`.
fn client(url: &str, tls: &Tls) -> Result<redis::Client, redis::RedisError> {
    let info = redis::IntoConnectionInfo::into_connection_info(url)?.set_tcp_settings(nodelay());
    #[cfg(feature = "tls")]
    let client = if tls.is_empty() {
        redis::Client::open(info)?
    } else {
        redis::Client::build_with_tls(info, tls.certificates())?
    };
    #[cfg(not(feature = "tls"))]
    let client = {
        without_tls(tls)?;
        redis::Client::open(info)?
    };
    Ok(client)
}

/// `client` speaking RESP3 (its address, TLS and settings kept).
fn resp3(client: &redis::Client) -> Result<redis::Client, redis::RedisError> {
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(redis::ProtocolVersion::RESP3);
    redis::Client::open(info.set_redis_settings(settings))
}

#[cfg(test)]
#[path = "connect_tests.rs"]
mod tests;
