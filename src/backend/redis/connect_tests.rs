//! The tests of `connect.rs`.

use super::*;

#[test]
fn clients_built_from_urls_set_tcp_nodelay() {
    let Connector::Client(client, _) =
        Connector::from_url("redis://127.0.0.1:6379", &Tls::default(), None).unwrap()
    else {
        panic!("a URL makes a client");
    };
    assert!(client.get_connection_info().tcp_settings().nodelay());
}

#[test]
fn the_subscription_of_a_pool_has_tcp_nodelay() {
    let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    let connector = Connector::Pool(pool, None)
        .with_subscription("redis://127.0.0.1:6379", &Tls::default())
        .unwrap();
    let Connector::Pool(_, Some(client)) = connector else {
        panic!("a pool with a subscription client");
    };
    assert!(client.get_connection_info().tcp_settings().nodelay());
    // In RESP3 for the subscription, the settings kept.
    let resp3 = resp3(&client).unwrap();
    assert!(resp3.get_connection_info().tcp_settings().nodelay());
}

#[test]
fn certificates_never_show_in_debug() {
    let tls = Tls {
        ca: Some(b"-----BEGIN CERTIFICATE----- secret".to_vec()),
        client: Some((b"cert".to_vec(), b"private key".to_vec())),
    };
    let shown = format!("{tls:?}");
    assert!(
        !shown.contains("secret") && !shown.contains("private"),
        "{shown}"
    );
}
