//! TLS and ACL users: a real `redis-server` with a TLS port, certificates the test makes
//! (a CA, the server's, a client's), and an ACL user with a password.
#![cfg(feature = "tls")]

mod support;

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use support::RedisServer;
use tower_redis_ratelimit::{Backend, FailurePolicy, Limiter, Source};
use tower_redis_ratelimit::{PeriodConfig, PeriodLimiter};

const ONE: NonZeroU32 = NonZeroU32::MIN;
const PASSWORD: &str = "wonderland-7f3a";

/// A CA, a server certificate for 127.0.0.1 and a client certificate, as PEM files.
struct Pki {
    dir: PathBuf,
    ca: String,
    client_cert: String,
    client_key: String,
}

fn pki() -> Pki {
    let dir = support::make_temp_dir("pki");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "tower-redis-ratelimit test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    // Each certificate has a subject of its own (OpenSSL takes a certificate whose
    // subject is its issuer's for a self-signed one).
    let leaf = |names: Vec<String>| {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, names[0].as_str());
        let cert = params.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
    let (client_cert, client_key) = leaf(vec!["client".into()]);
    std::fs::write(dir.join("ca.crt"), ca.pem()).unwrap();
    std::fs::write(dir.join("server.crt"), server_cert).unwrap();
    std::fs::write(dir.join("server.key"), server_key).unwrap();
    Pki {
        dir,
        ca: ca.pem(),
        client_cert,
        client_key,
    }
}

/// A server with a plain port (for the harness) and a TLS port (returned), and the ACL
/// user `alice`; `None` (the test skipped, with the server's reason) where the server's
/// build has no TLS.
fn tls_server(pki: &Pki, client_certificates: bool) -> Option<(RedisServer, u16)> {
    let tls_port = support::free_port();
    let path = |name: &str| pki.dir.join(name).to_string_lossy().into_owned();
    let args = [
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &path("server.crt"),
        "--tls-key-file",
        &path("server.key"),
        "--tls-ca-cert-file",
        &path("ca.crt"),
        "--tls-auth-clients",
        if client_certificates { "yes" } else { "no" },
        "--user",
        "alice",
        "on",
        &format!(">{PASSWORD}"),
        "~*",
        "&*",
        "+@all",
    ];
    match RedisServer::start_with_tls(args.iter().map(|s| (*s).to_owned()).collect()) {
        Ok(server) => Some((server, tls_port)),
        Err(reason) => {
            support::skip(reason);
            None
        }
    }
}

fn limiter(backend: &Backend) -> PeriodLimiter {
    PeriodLimiter::new(
        backend,
        "tls",
        PeriodConfig::new(3, Duration::from_secs(60)),
    )
    .unwrap()
}

async fn admitted(limiter: &PeriodLimiter, n: usize) -> (usize, Vec<Source>) {
    let mut admitted = 0;
    let mut sources = Vec::new();
    for _ in 0..n {
        let d = limiter.check(b"k", ONE).await;
        admitted += usize::from(d.is_admitted());
        sources.push(d.source);
    }
    (admitted, sources)
}

#[tokio::test]
async fn rediss_with_an_acl_user_and_a_custom_ca_limits_on_redis() {
    let pki = pki();
    let Some((redis, port)) = tls_server(&pki, false) else {
        return;
    };
    let backend = support::backend_builder()
        .redis_url(format!("rediss://alice:{PASSWORD}@127.0.0.1:{port}"))
        .tls_ca_pem(pki.ca.clone())
        // (The probe's key lives a probe interval: a minute, so that it is still there
        // when counted below however busy the machine; the checks wait 2 s for a call.)
        .probe_interval(Duration::from_secs(60))
        .call_timeout(support::CALL_TIMEOUT)
        .build()
        .unwrap();
    backend.warm_up().await.unwrap();
    let (admitted, sources) = admitted(&limiter(&backend), 5).await;
    assert_eq!(admitted, 3);
    assert!(
        sources
            .iter()
            .all(|s| matches!(s, Source::Redis | Source::DenyCache)),
        "{sources:?}"
    );
    assert_eq!(
        redis.cmd(&["DBSIZE"]),
        "2",
        "the limit's key and the probe's"
    );
    // The change subscription is made alike: over TLS, with the CA, as alice.
    assert_eq!(support::subscribed_clients(&redis, 1).await, 1);
    let clients = redis.cmd(&["CLIENT", "LIST"]);
    let subscribed = clients.lines().find(|line| line.contains(" sub=1 "));
    assert!(
        subscribed.is_some_and(|line| line.contains(" user=alice ")),
        "{clients}"
    );
}

#[tokio::test]
async fn mutual_tls_needs_the_client_certificate() {
    let pki = pki();
    let Some((_redis, port)) = tls_server(&pki, true) else {
        return;
    };
    let url = format!("rediss://alice:{PASSWORD}@127.0.0.1:{port}");
    let without = support::backend_builder()
        .redis_url(&url)
        .tls_ca_pem(pki.ca.clone())
        .build()
        .unwrap();
    let error = without.warm_up().await.unwrap_err();
    assert!(!error.is_refusal(), "the handshake fails: {error}");
    let with = support::backend_builder()
        .redis_url(&url)
        .tls_ca_pem(pki.ca.clone())
        .tls_client_auth_pem(pki.client_cert.clone(), pki.client_key.clone())
        .build()
        .unwrap();
    with.warm_up().await.unwrap();
    assert_eq!(admitted(&limiter(&with), 4).await.0, 3);
}

#[tokio::test]
async fn a_server_signed_by_an_unknown_authority_is_refused() {
    let pki = pki();
    let Some((_redis, port)) = tls_server(&pki, false) else {
        return;
    };
    let backend = support::backend_builder()
        .redis_url(format!("rediss://alice:{PASSWORD}@127.0.0.1:{port}"))
        .build()
        .unwrap();
    assert!(backend.warm_up().await.is_err());
    // The failure policy answers; nothing fails open by surprise.
    assert_eq!(
        limiter(&backend).check(b"k", ONE).await.source,
        Source::Fallback
    );
}

#[tokio::test]
async fn a_wrong_password_is_a_clear_error_and_never_shown() {
    let pki = pki();
    let Some((_redis, port)) = tls_server(&pki, false) else {
        return;
    };
    let wrong = "not-the-password-91c2";
    let builder = support::backend_builder()
        .redis_url(format!("rediss://alice:{wrong}@127.0.0.1:{port}"))
        .tls_ca_pem(pki.ca.clone())
        .tls_client_auth_pem(pki.client_cert.clone(), pki.client_key.clone())
        .failure_policy(FailurePolicy::FailClosed);
    let shown = format!("{builder:?}");
    let backend = builder.build().unwrap();
    let shown = format!("{shown} {backend:?}");
    assert!(
        !shown.contains(wrong) && !shown.contains("PRIVATE KEY"),
        "{shown}"
    );
    let error = backend.warm_up().await.unwrap_err();
    assert!(error.is_refusal(), "redis refused the login: {error}");
    assert!(!error.to_string().contains(wrong), "{error}");
    let limiter = limiter(&backend);
    for _ in 0..3 {
        let d = limiter.check(b"k", ONE).await;
        assert_eq!(d.source, Source::FailClosed);
        assert!(!d.is_admitted());
    }
}

/// A backend from configuration (feature `serde`): the CA, the client certificate and
/// its key are file paths read when the backend is built, and mutual TLS works.
#[cfg(feature = "serde")]
#[tokio::test]
async fn mutual_tls_from_configuration_files() {
    let pki = pki();
    let Some((_redis, port)) = tls_server(&pki, true) else {
        return;
    };
    std::fs::write(pki.dir.join("client.crt"), &pki.client_cert).unwrap();
    std::fs::write(pki.dir.join("client.key"), &pki.client_key).unwrap();
    let text = format!(
        "url = \"rediss://alice:{PASSWORD}@127.0.0.1:{port}\"\n\
         tls = {{ ca_file = {:?}, client_cert_file = {:?}, client_key_file = {:?} }}\n",
        pki.dir.join("ca.crt"),
        pki.dir.join("client.crt"),
        pki.dir.join("client.key"),
    );
    let config: tower_redis_ratelimit::BackendConfig = toml::from_str(&text).unwrap();
    assert!(!format!("{config:?}").contains(PASSWORD));
    let backend = config.build().unwrap();
    backend.warm_up().await.unwrap();
    assert_eq!(admitted(&limiter(&backend), 4).await.0, 3);
}

/// `rediss://` to a server that does not speak TLS on that port: the probe says the TLS
/// handshake did not complete and asks whether the server speaks TLS there, instead of a
/// bare timeout (the plaintext server waits for the end of a command that never comes).
#[tokio::test]
async fn rediss_to_a_plaintext_port_says_the_handshake_did_not_complete() {
    let plain = RedisServer::start();
    let backend = support::backend_builder()
        .redis_url(format!(
            "rediss://alice:{PASSWORD}@127.0.0.1:{}",
            plain.port()
        ))
        .build()
        .unwrap();
    let error = backend.warm_up().await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("TLS handshake"), "{message}");
    assert!(message.contains("speak TLS"), "{message}");
    assert!(!message.contains(PASSWORD), "{message}");
}
