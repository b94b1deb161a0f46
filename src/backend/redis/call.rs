//! A script call as it goes to Redis ([`Call`]: an `FCALL` of the engine's function or
//! an `EVALSHA` of its script, keys and arguments written straight into one buffer), and
//! the arguments a limiter encodes once ([`Args`]).

use std::fmt;

use deadpool_redis::redis::{self, Script, ToRedisArgs};

use super::script::{plain_numbers, Library, ReadReply, Scripts};
use super::time::TimeSource;

/// A script call as it goes to Redis: `EVALSHA`, the script's hash, the number of keys,
/// the keys, then the arguments, each written into one buffer as it is added (redis-rs's
/// `Cmd`: two allocations per call, where a `ScriptInvocation` makes one per argument and
/// copies them all again), and the script to load on `NOSCRIPT`. Its `Debug` shows the
/// script's hash only: keys may be secrets (API keys).
pub(crate) struct Call {
    pub(super) script: &'static Script,
    /// The library the call's function is in, for an `FCALL`.
    pub(super) library: Option<&'static Library>,
    pub(super) cmd: redis::Cmd,
    /// Reads the script's reply as numbers.
    pub(super) read: ReadReply,
}

impl fmt::Debug for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Call")
            .field("script", &self.script.get_hash())
            .finish_non_exhaustive()
    }
}

impl Call {
    /// A call of `script` with `keys` keys (added next, before any argument), with room
    /// for `args` keys and arguments of `bytes` bytes in all, so that a call whose size
    /// is known is written without growing its buffers.
    pub(crate) fn new(script: &'static Script, keys: usize, args: usize, bytes: usize) -> Self {
        let hash = script.get_hash();
        let mut cmd = redis::Cmd::with_capacity(3 + args, "EVALSHA".len() + hash.len() + 4 + bytes);
        cmd.arg("EVALSHA").arg(hash).arg(keys);
        Self {
            script,
            library: None,
            cmd,
            read: plain_numbers,
        }
    }

    /// A call of the engine for `time` with `keys` keys (see [`new`](Self::new)): an
    /// `FCALL` of its function with `functions` (for a call that writes nothing,
    /// `read_only`, an `FCALL_RO` of the function flagged `no-writes`), else an
    /// `EVALSHA` of its script.
    pub(crate) fn engine(
        scripts: &'static Scripts,
        time: TimeSource,
        functions: bool,
        read_only: bool,
        keys: usize,
        args: usize,
        bytes: usize,
    ) -> Self {
        if !functions {
            let mut call = Self::new(scripts.get(time), keys, args, bytes);
            call.read = scripts.read();
            return call;
        }
        let library = scripts.library();
        let (command, name) = if read_only {
            ("FCALL_RO", library.read_only_function(time))
        } else {
            ("FCALL", library.function(time))
        };
        let mut cmd = redis::Cmd::with_capacity(3 + args, command.len() + name.len() + 4 + bytes);
        cmd.arg(command).arg(name).arg(keys);
        Self {
            script: scripts.get(time),
            library: Some(library),
            cmd,
            read: scripts.read(),
        }
    }

    /// The same call as an `EVALSHA` of the script.
    pub(super) fn as_evalsha(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash());
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(arg) = arg {
                cmd.arg(arg);
            }
        }
        cmd
    }

    /// Adds a key: every key comes before the first argument.
    pub(crate) fn key(&mut self, key: &[u8]) -> &mut Self {
        self.cmd.arg(key);
        self
    }

    /// Adds a key or an argument that `write` writes straight into the call (no copy of
    /// it is built first).
    pub(crate) fn written(&mut self, write: impl Fn(&mut dyn std::io::Write)) -> &mut Self {
        self.cmd.arg(WrittenBy(write));
        self
    }

    /// Adds arguments encoded beforehand.
    pub(crate) fn args(&mut self, args: &Args) -> &mut Self {
        for arg in &args.0 {
            self.cmd.arg(&arg[..]);
        }
        self
    }

    /// Adds an argument.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Reads the call's reply with `read` (a batch's: see `protocol::batch_numbers`).
    pub(crate) fn reading(&mut self, read: ReadReply) -> &mut Self {
        self.read = read;
        self
    }

    pub(crate) fn script(&self) -> &'static Script {
        self.script
    }
}

/// One argument, written by a function straight into the command's buffer.
struct WrittenBy<F>(F);

impl<F: Fn(&mut dyn std::io::Write)> ToRedisArgs for WrittenBy<F> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let mut arg = out.writer_for_next_arg();
        (self.0)(&mut arg);
    }
}

/// Arguments encoded once (a limiter's part of a script's arguments, which never
/// changes), then added to every call as bytes.
#[derive(Debug, Default)]
pub(crate) struct Args(Vec<Vec<u8>>);

impl Args {
    /// Adds an argument.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        self.0.extend(arg.to_redis_args());
        self
    }

    /// How many arguments.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// Writes the argument at `index` in capitals (a set's member that counts requests:
    /// its algorithm's letter).
    pub(crate) fn capitalize(&mut self, index: usize) {
        if let Some(arg) = self.0.get_mut(index) {
            arg.make_ascii_uppercase();
        }
    }

    /// The arguments as one, separated by `separator`.
    pub(crate) fn joined(&self, separator: u8) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, arg) in self.0.iter().enumerate() {
            if i > 0 {
                out.push(separator);
            }
            out.extend_from_slice(arg);
        }
        out
    }

    /// How many arguments, and their bytes in all.
    pub(crate) fn size(&self) -> (usize, usize) {
        (self.0.len(), self.0.iter().map(Vec::len).sum())
    }
}
