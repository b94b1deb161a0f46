//! A Lua script as the server runs it ([`Scripts`]): in both time versions (see
//! [`TimeSource`]), as a script for `EVALSHA` each and as one library of Redis
//! Functions holding both, from a text in the parts the two paths arrange ([`Body`]).
//!
//! The engine runs on one of two paths, the same Lua either way:
//!
//! - Redis Functions (Redis 7 and later): one library holds both time versions, loaded
//!   once per server with `FUNCTION LOAD`; each check is one `FCALL`. The algorithms'
//!   functions and tables are built once, when the library loads.
//! - `EVALSHA` (Redis before 7, and servers that refuse `FUNCTION`): the script runs
//!   the whole body per call, then returns.

use deadpool_redis::redis::{self, Script};

use super::time::{prelude, TimeSource};

/// A script in both time versions (reading `TIME`, or the caller's time): as a script
/// for `EVALSHA` each, and as one library of Redis Functions holding both.
#[derive(Debug)]
pub(crate) struct Scripts {
    server: Script,
    caller: Script,
    /// The two scripts' texts (the server's version, then the caller's), which
    /// [`Script`] does not give back: for tests/dialect.rs.
    texts: [String; 2],
    library: Library,
    read: ReadReply,
}

/// A library of Redis Functions: its text (for `FUNCTION LOAD`) and its functions'
/// names, one per time version. The names carry a hash of the text, so that instances
/// running different versions of the crate on one server each call their own.
#[derive(Debug)]
pub(crate) struct Library {
    pub(crate) text: String,
    server: String,
    caller: String,
    /// The same functions registered with the `no-writes` flag, for calls that write
    /// nothing (peeks): a server refuses a function without it on a read-only replica and
    /// while out of memory, before it runs.
    server_read_only: String,
    caller_read_only: String,
}

impl Library {
    /// The name of the function for `time`.
    pub(crate) fn function(&self, time: TimeSource) -> &str {
        match time {
            TimeSource::Server => &self.server,
            TimeSource::Caller => &self.caller,
        }
    }

    /// The name of the function for `time` registered with the `no-writes` flag (called
    /// by `FCALL_RO`), for a call that writes nothing.
    pub(crate) fn read_only_function(&self, time: TimeSource) -> &str {
        match time {
            TimeSource::Server => &self.server_read_only,
            TimeSource::Caller => &self.caller_read_only,
        }
    }
}

/// A script's text in the parts that the two paths arrange differently. By `EVALSHA`,
/// each call runs `head`, `entry`, `tail` then `last` (so an `entry` that returns
/// spares the call defining `tail`); as Redis Functions, `head` and `tail` run once
/// when the library loads and each call runs `entry` then `last`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Body<'a> {
    pub(crate) head: &'a str,
    pub(crate) entry: &'a str,
    pub(crate) tail: &'a str,
    /// The statement that returns the reply.
    pub(crate) last: &'a str,
}

impl<'a> Body<'a> {
    /// A script whose `body` defines `engine(KEYS, ARGV)`, which each call returns.
    pub(crate) fn standalone(body: &'a str) -> Self {
        Self {
            head: body,
            entry: "",
            tail: "",
            last: "return engine(KEYS, ARGV)\n",
        }
    }

    /// The script for `EVALSHA` that reads the time from `time`.
    pub(crate) fn source(&self, time: TimeSource) -> String {
        [prelude(time), self.head, self.entry, self.tail, self.last].concat()
    }
}

impl Scripts {
    /// Both versions of `body`, whose replies `read` reads.
    pub(crate) fn new(body: Body<'_>, read: ReadReply) -> Self {
        // The library's name tells its whole text apart: a library of another text
        // (another version's, in a fleet mid-upgrade) keeps its own name.
        let whole = [
            prelude(TimeSource::Server),
            prelude(TimeSource::Caller),
            body.head,
            body.entry,
            body.tail,
            body.last,
        ];
        let hash = Script::new(&whole.concat()).get_hash().to_owned();
        let tag = &hash[..16];
        let server = format!("tower_redis_ratelimit_{tag}_server");
        let caller = format!("tower_redis_ratelimit_{tag}_caller");
        let mut text = format!("#!lua name=tower_redis_ratelimit_{tag}\n");
        for (time, name) in [(TimeSource::Server, &server), (TimeSource::Caller, &caller)] {
            text.push_str("do\n");
            text.push_str(prelude(time));
            text.push_str(body.head);
            text.push_str(body.tail);
            // The function, and the same one flagged `no-writes` (for calls that write
            // nothing, which a read-only replica or a server out of memory still runs).
            text.push_str(&format!(
                "redis.register_function('{name}', function(KEYS, ARGV)\n{entry}{last}end)\n\
                 redis.register_function{{function_name = '{name}_ro', \
                 callback = function(KEYS, ARGV)\n{entry}{last}end, flags = {{'no-writes'}}}}\n\
                 end\n",
                entry = body.entry,
                last = body.last
            ));
        }
        let texts = [
            body.source(TimeSource::Server),
            body.source(TimeSource::Caller),
        ];
        Self {
            server: Script::new(&texts[0]),
            caller: Script::new(&texts[1]),
            texts,
            library: Library {
                text,
                server_read_only: format!("{server}_ro"),
                caller_read_only: format!("{caller}_ro"),
                server,
                caller,
            },
            read,
        }
    }

    /// Both versions of a script of its own, apart from the engine, whose `body` defines
    /// `engine(KEYS, ARGV)` (the [in-flight](crate::in_flight) slots): the same two
    /// paths as the engine's, a library of Redis Functions loaded on first use, or the
    /// script by `EVALSHA`.
    pub(crate) fn standalone(body: &str) -> Self {
        Self::new(Body::standalone(body), plain_numbers)
    }

    /// The script for `time`.
    pub(crate) fn get(&self, time: TimeSource) -> &Script {
        match time {
            TimeSource::Server => &self.server,
            TimeSource::Caller => &self.caller,
        }
    }

    /// The text of the script for `time`, as `EVALSHA` runs it.
    pub(crate) fn text(&self, time: TimeSource) -> &str {
        match time {
            TimeSource::Server => &self.texts[0],
            TimeSource::Caller => &self.texts[1],
        }
    }

    /// Whether `script` is one of these scripts.
    pub(crate) fn holds(&self, script: &Script) -> bool {
        std::ptr::eq(script, &self.server) || std::ptr::eq(script, &self.caller)
    }

    /// The library of Redis Functions.
    pub(crate) fn library(&self) -> &Library {
        &self.library
    }

    /// How the replies of these scripts are read.
    pub(crate) fn read(&self) -> ReadReply {
        self.read
    }
}

/// How a script's reply is read as numbers: a table of integers for most scripts
/// ([`plain_numbers`]); the engine packs some replies tighter and reads them back.
pub(crate) type ReadReply = fn(redis::Value) -> redis::RedisResult<Vec<i64>>;

/// A script's reply read as it is: a table of integers (or one integer).
pub(crate) fn plain_numbers(value: redis::Value) -> redis::RedisResult<Vec<i64>> {
    Ok(<Vec<i64> as redis::FromRedisValue>::from_redis_value(
        value,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A library's name tells its whole text apart: two versions of the engine that
    /// differ only in what each call runs first (`entry`) or last (`last`) must not
    /// share a name, or one instance of a fleet mid-upgrade would call the other's.
    #[test]
    fn a_library_of_another_text_has_another_name() {
        let body = Body {
            head: "local function engine() return 1 end\n",
            entry: "local x = 1\n",
            tail: "",
            last: "return engine()\n",
        };
        let names = |body| {
            let scripts = Scripts::new(body, plain_numbers);
            let library = &scripts.library;
            [TimeSource::Server, TimeSource::Caller].map(|t| library.function(t).to_owned())
        };
        let entry = Body {
            entry: "local x = 2\n",
            ..body
        };
        let last = Body {
            last: "return engine() + 0\n",
            ..body
        };
        assert_eq!(names(body), names(body));
        assert_ne!(names(body), names(entry));
        assert_ne!(names(body), names(last));
    }
}
