//! What the crate logs on the test's thread, collected for the test to read.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Everything logged on this thread while its guard lives.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// The lines logged so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

/// Collects what is logged on this thread at `level` and above, until the guard drops
/// (a current-thread runtime's tasks all log here).
pub(crate) fn capture(level: tracing::Level) -> (Captured, tracing::subscriber::DefaultGuard) {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(level)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}
