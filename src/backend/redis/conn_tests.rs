//! The tests of `conn.rs`.

use super::*;

/// The error a server answers with `line` (without its `-` and `\r\n`).
fn replied(line: &str) -> redis::RedisError {
    let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).unwrap();
    value.extract_error().unwrap_err()
}

/// What a server's answer to `FUNCTION LOAD` says about its Functions (the lines are
/// Redis 6.2.5's and 7.0.15's own).
#[test]
fn the_answer_to_function_load_tells_whether_the_server_has_functions() {
    for line in [
        "ERR unknown command `function`, with args beginning with: `load`, `#!lua`, ",
        "ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' '#!lua' ",
        "NOPERM this user has no permissions to run the 'function|load' command",
        "ERR Error registering functions",
    ] {
        assert!(lacks_functions(&replied(line)), "{line}");
    }
    let refused = "ERR Error registering functions: ERR user_function:16: Script \
                   attempted to access nonexistent global variable 'tostring'";
    assert!(lacks_functions(&replied(refused)) && refused_library(&replied(refused)));
    for line in [
        "ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' '#!lua' ",
        "NOPERM this user has no permissions to run the 'function|load' command",
    ] {
        assert!(!refused_library(&replied(line)), "{line}");
    }
    for line in [
        "OOM command not allowed when used memory > 'maxmemory'.",
        "READONLY You can't write against a read only replica.",
        "LOADING Redis is loading the dataset in memory",
        "BUSY Redis is busy running a script.",
        "MASTERDOWN Link with MASTER is down",
    ] {
        assert!(!lacks_functions(&replied(line)), "{line}");
    }
    let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    assert!(!lacks_functions(&io));
}

#[test]
fn a_refused_fcall_is_told_from_a_refused_key() {
    for line in [
        "ERR unknown command 'FCALL', with args beginning with: 'f' '1' 'k' ",
        "NOPERM this user has no permissions to run the 'fcall' command",
        "NOPERM User limiter has no permissions to run the 'fcall' command",
    ] {
        assert!(fcall_refused(&replied(line)), "{line}");
    }
    for line in [
        "NOPERM this user has no permissions to access one of the keys used as arguments",
        "ERR Function not found",
        "WRONGTYPE Operation against a key holding the wrong kind of value",
    ] {
        assert!(!fcall_refused(&replied(line)), "{line}");
    }
}

#[test]
fn the_path_once_known_off_stays_off() {
    let functions = Functions::new(true);
    assert!(functions.fcall() && !functions.is_on());
    functions.on();
    assert!(functions.fcall() && functions.is_on());
    functions.off(&"test");
    assert!(!functions.fcall());
    functions.on();
    assert!(
        !functions.fcall(),
        "a late FUNCTION LOAD does not turn it back on"
    );
    assert!(!Functions::new(false).fcall());
}
