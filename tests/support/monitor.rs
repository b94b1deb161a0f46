//! `MONITOR` by `redis-cli`: what a server ran, scripts' commands included (their
//! client is `lua`), for tests that check what the engine sends and touches.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::raw_cmd;

/// `MONITOR` on `port` (by `redis-cli`): the lines it printed, until dropped.
pub(crate) struct Monitor {
    child: std::process::Child,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    pub(crate) fn start(port: u16) -> Monitor {
        let cli = std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned());
        let mut child = Command::new(cli)
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "monitor"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli monitor");
        let stdout = child.stdout.take().expect("piped");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                sink.lock().expect("not poisoned").push(line);
            }
        });
        Monitor { child, lines }
    }

    /// Waits until a line holds `marker` (sent as `ECHO`), then the lines before it.
    pub(crate) fn until(&self, port: u16, marker: &str) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            raw_cmd(port, &["ECHO", marker]).expect("ECHO");
            let lines = self.lines.lock().expect("not poisoned").clone();
            if let Some(at) = lines.iter().position(|line| line.contains(marker)) {
                return lines[..at].to_vec();
            }
            assert!(Instant::now() < deadline, "MONITOR printed no {marker}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The words of each script call (`FCALL`, `EVALSHA`) a client made among `lines`: not
/// the commands a script ran.
pub(crate) fn script_calls(lines: &[String]) -> Vec<Vec<Vec<u8>>> {
    lines
        .iter()
        .filter_map(|line| monitor_words(line))
        .filter(|(client, words)| {
            !client.contains("lua")
                && words.first().is_some_and(|w| {
                    w.eq_ignore_ascii_case(b"FCALL") || w.eq_ignore_ascii_case(b"EVALSHA")
                })
        })
        .map(|(_, words)| words)
        .collect()
}

/// The words of one `MONITOR` line after its `[db client]` part, unquoted (`redis-cli`
/// writes them as `sdscatrepr` does: `\"`, `\\`, `\n`, `\r`, `\t`, `\a`, `\b`, `\xHH`).
pub(crate) fn monitor_words(line: &str) -> Option<(String, Vec<Vec<u8>>)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let client = line[open + 1..close].to_owned();
    let bytes = &line.as_bytes()[close + 1..];
    let mut words = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'"' {
            i += 1;
            continue;
        }
        i += 1;
        let mut word = Vec::new();
        while bytes[i] != b'"' {
            if bytes[i] == b'\\' {
                i += 1;
                match bytes[i] {
                    b'n' => word.push(b'\n'),
                    b'r' => word.push(b'\r'),
                    b't' => word.push(b'\t'),
                    b'a' => word.push(7),
                    b'b' => word.push(8),
                    b'x' => {
                        let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).expect("ascii");
                        word.push(u8::from_str_radix(hex, 16).expect("hex"));
                        i += 2;
                    }
                    other => word.push(other),
                }
            } else {
                word.push(bytes[i]);
            }
            i += 1;
        }
        i += 1;
        words.push(word);
    }
    Some((client, words))
}
