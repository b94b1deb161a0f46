//! An axum app whose rate limits and backend come from a rule file, `examples/rules.toml`.
//!
//! ```text
//! cargo run --example rules --features serde                                   # in-process
//! REDIS_URL=redis://127.0.0.1:6379 cargo run --example rules --features serde  # on Redis
//! RULES_FILE=my-rules.toml cargo run --example rules --features serde
//! ```
//!
//! The file is read with the `toml` crate; the environment overrides it where it says
//! so (`REDIS_URL`), which is all a loader of your own has to do (a crate such as
//! `figment` or `config` can merge files and environment variables the same way, since
//! the config types are plain `serde` types). `PORT` overrides the port (3000). Try
//! `curl -i -H 'x-api-key: me' localhost:3000/`.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::{routing::get, Router};
use tower_redis_ratelimit::{Rules, RulesConfig};

/// Reads the rule file at `path`.
pub(crate) fn load(path: &std::path::Path) -> Result<RulesConfig, Box<dyn std::error::Error>> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    Ok(toml::from_str(&text).map_err(|error| format!("{}: {error}", path.display()))?)
}

/// Builds the rules on the file's backend, with `REDIS_URL` (when set) in place of the
/// file's URL: the environment overrides the file through the backend's builder.
pub(crate) fn build(config: &RulesConfig) -> Result<Rules, Box<dyn std::error::Error>> {
    let mut backend = config.backend.builder()?;
    if let Ok(url) = std::env::var("REDIS_URL") {
        backend = backend.redis_url(url);
    }
    Ok(config.build_on(&backend.build()?)?)
}

/// The example's routes under every rule of `rules`.
pub(crate) fn app(rules: &Rules) -> Router {
    let routes = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .route("/search", get(|| async { "results\n" }));
    rules.apply(routes)
}

/// The rule file: `$RULES_FILE`, or `examples/rules.toml` of this crate.
pub(crate) fn rules_file() -> PathBuf {
    std::env::var_os("RULES_FILE").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/rules.toml"),
        PathBuf::from,
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = rules_file();
    let config = load(&path)?;
    // `Debug` of the config shows URLs without their credentials.
    println!("backend from {}: {:?}", path.display(), config.backend);
    let rules = build(&config)?;
    for layer in &rules.layers {
        println!("rule {:?}", layer.limiter().policy());
    }
    if rules.backend.is_redis() {
        // Wrong credentials or an unreachable server show up now, not at the first request.
        if let Err(error) = rules.backend.warm_up().await {
            eprintln!("Redis is not usable yet ({error}); the failure policy answers meanwhile");
        }
    }
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app(&rules).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
