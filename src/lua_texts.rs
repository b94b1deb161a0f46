//! Every Lua text the crate sends to a server, gathered for tests/dialect.rs (which
//! checks that they are one portable dialect). Not part of the API.

use crate::backend::decide::engine::ENGINE;
use crate::backend::redis::probe;
use crate::backend::TimeSource;
use crate::in_flight::host::SCRIPTS as IN_FLIGHT;

/// Not part of the API: every Lua text the crate sends to a server, by name: each
/// script in both time versions as `EVALSHA` runs it (`engine.server`,
/// `engine.caller`, `in_flight.server`, `in_flight.caller`), each library of Redis
/// Functions as `FUNCTION LOAD` loads it (`engine.library`, `in_flight.library`), and
/// the probes (`probe`, and `probe_time` at start-up on the server's clock).
#[doc(hidden)]
#[must_use]
pub fn lua_texts() -> Vec<(String, String)> {
    let mut texts = Vec::new();
    for (name, scripts) in [("engine", &*ENGINE), ("in_flight", &*IN_FLIGHT)] {
        for (time, label) in [
            (TimeSource::Server, "server"),
            (TimeSource::Caller, "caller"),
        ] {
            texts.push((format!("{name}.{label}"), scripts.text(time).to_owned()));
        }
        texts.push((format!("{name}.library"), scripts.library().text.clone()));
    }
    texts.push(("probe".to_owned(), probe::TEXT.to_owned()));
    texts.push(("probe_time".to_owned(), probe::TIME_TEXT.to_owned()));
    texts
}
