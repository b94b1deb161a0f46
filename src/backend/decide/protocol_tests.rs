use super::*;

/// A limit's admit packed as `fast.lua` packs it.
fn packed(n: i64, t: i64, shape: i64, bits: i64) -> i64 {
    -((((t << bits) + n) << 7) + (shape << 6) + bits) - 1
}

#[test]
fn packed_admits_read_back_into_the_engine_table() {
    // A fixed window (count 7 of a quota of 100: 7 bits; 59 s left).
    assert_eq!(
        reply_numbers(Value::Int(packed(7, 59_000, 0, 7))).unwrap(),
        [1, 0, 1, 7, 59_000]
    );
    // A token bucket (no tokens left of a burst of 1: 1 bit; 1 s until full).
    assert_eq!(
        reply_numbers(Value::Int(packed(0, 1_000_000, 1, 1))).unwrap(),
        [1, 0, 1, 0, 0, 1_000_000]
    );
    // A set: each limit packed, in order; the largest values that fit.
    let (n, t) = ((1 << 20) - 1, (1 << 26) - 1);
    assert_eq!(
        reply_numbers(Value::Array(vec![
            Value::Int(packed(5, 2, 1, 3)),
            Value::Int(packed(n, t, 0, 20)),
        ]))
        .unwrap(),
        [1, 0, 1, 5, 0, 2, 1, n, t]
    );
}

#[test]
fn wide_admits_read_back_into_the_engine_table() {
    // A daily window of 2^40 (too large to pack): -(shape * 64) - 1, n, t; in a set
    // after a packed token bucket, and alone.
    let (n, t) = (1 << 40, 86_400_000);
    let wide = |shape: i64| [-(shape << 6) - 1, n, t].map(Value::Int);
    let mut set = vec![Value::Int(packed(5, 2, 1, 3))];
    set.extend(wide(0));
    assert_eq!(
        reply_numbers(Value::Array(set)).unwrap(),
        [1, 0, 1, 5, 0, 2, 1, n, t]
    );
    assert_eq!(
        reply_numbers(Value::Array(wide(1).to_vec())).unwrap(),
        [1, 0, 1, n, 0, t]
    );
    // (A wide admit cut short is not the engine's.)
    assert_eq!(
        reply_numbers(Value::Array(wide(0)[..2].to_vec())).unwrap(),
        [1, 0, 0]
    );
}

#[test]
fn a_batch_reads_back_into_each_checks_reply() {
    // Two limits: an admit (packed, then wide), a refusal's table, an item that
    // raised an error, an admit (both packed).
    let items = [
        Value::Int(2),
        Value::Int(packed(5, 2, 1, 3)),
        Value::Int(-1),
        Value::Int(1 << 40),
        Value::Int(7),
        Value::Array([0, 0, 0, 0, 9, 2, 1, 3, 5].map(Value::Int).to_vec()),
        Value::Nil,
        Value::Int(packed(4, 1, 1, 3)),
        Value::Int(packed(3, 9, 0, 7)),
    ];
    assert_eq!(
        batch_numbers(Value::Array(items.to_vec())).unwrap(),
        [
            [9, 1, 0, 1, 5, 0, 2, 1, 1 << 40, 7].as_slice(),
            &[9, 0, 0, 0, 0, 9, 2, 1, 3, 5],
            &[0],
            &[9, 1, 0, 1, 4, 0, 1, 1, 3, 9],
        ]
        .concat()
    );
    // Not a batch's reply (no count of limits, an admit cut short): no check's.
    assert!(batch_numbers(Value::Array(items[1..].to_vec()))
        .unwrap()
        .is_empty());
    assert!(batch_numbers(Value::Array(items[..3].to_vec()))
        .unwrap()
        .is_empty());
}

#[test]
fn tables_pass_through() {
    let table = || Value::Array(vec![Value::Int(0), Value::Int(250), Value::Int(1)]);
    assert_eq!(reply_numbers(table()).unwrap(), [0, 250, 1]);
    // (No script answers a number that is not a packed admit: an error, as before.)
    assert!(reply_numbers(Value::Int(5)).is_err());
    assert!(reply_numbers(Value::Nil).unwrap().is_empty());
}

#[test]
fn admits_are_told_from_refusals() {
    assert!(engine_admits(&[1, 0, 1, 5, 100]));
    assert!(engine_admits(&[packed(5, 100, 0, 3)]));
    assert!(!engine_admits(&[0, 0, 0, 5, 100]));
    assert!(!engine_admits(&[]));
}

/// Each reply layout this module reads, by the name the Lua files give it.
const LAYOUTS: [(&str, &[&str]); 4] = [
    ("Reply", Reply::SLOTS),
    ("WindowReply", WindowReply::SLOTS),
    ("BucketReply", BucketReply::SLOTS),
    ("RollingReply", RollingReply::SLOTS),
];

/// Each algorithm's step and the layout its every `return {...}` has.
const STEPS: [(&str, &str); 3] = [
    ("period_step", "WindowReply"),
    ("token_bucket_step", "BucketReply"),
    ("rolling_step", "RollingReply"),
];

/// The quoted words that follow each of `patterns` in `lua`.
fn quoted_after(lua: &str, patterns: &[&str]) -> std::collections::BTreeSet<String> {
    let mut words = std::collections::BTreeSet::new();
    for pattern in patterns {
        for (at, _) in lua.match_indices(pattern) {
            let rest = &lua[at + pattern.len()..];
            if let Some(end) = rest.find('\'') {
                words.insert(rest[..end].to_owned());
            }
        }
    }
    words
}

/// The top-level elements of the table literal at the start of `text` (`{...}`).
fn table_len(text: &str) -> Option<usize> {
    let (mut depth, mut commas) = (0_i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '{' | '(' | '[' => depth += 1,
            '}' | ')' | ']' => {
                depth -= 1;
                if depth == 0 {
                    let empty = text[1..i].trim().is_empty();
                    return Some(if empty { 0 } else { commas + 1 });
                }
            }
            ',' if depth == 1 => commas += 1,
            _ => {}
        }
    }
    None
}

/// Where the Lua of `files` disagrees with this module: operations it names or handles,
/// limit letters, head format, declared reply layouts, and the arity of each step's
/// replies.
fn disagreements(files: &[&str]) -> Vec<String> {
    let lua = files.concat();
    let mut out = Vec::new();
    // Operations: every word the Lua compares the head's first word with is one of
    // `Op`'s, and it handles every one of them.
    let ops = quoted_after(
        &lua,
        &["op == '", "op ~= '", "H[1] == '", "H[1] ~= '", "op = '"],
    );
    let words: std::collections::BTreeSet<String> =
        Op::ALL.iter().map(|op| op.word().to_owned()).collect();
    for word in ops.difference(&words) {
        out.push(format!(
            "the Lua names an operation '{word}' that Op does not"
        ));
    }
    for word in words.difference(&ops) {
        out.push(format!("the Lua never handles Op's '{word}'"));
    }
    // The head: `op:count:param`, as `write_head` writes it.
    if !lua.contains("'^(%a+):(%-?%d+):(%d+)$'") {
        out.push("the Lua reads the head in another format than write_head's".to_owned());
    }
    // Limits: the letters the Lua tells apart are `Limit`'s (or their capitals).
    let letters: std::collections::BTreeSet<String> = quoted_after(
        &lua,
        &["kind == '", "kind ~= '", "letter == '", "letter ~= '"],
    )
    .into_iter()
    .map(|letter| letter.to_lowercase())
    .collect();
    let ours: std::collections::BTreeSet<String> = [
        Limit::Window {
            quota: 1,
            period_ms: 1,
            offset_ms: None,
        },
        Limit::Calendar {
            quota: 1,
            period_ms: 1,
        },
        Limit::TokenBucket {
            interval_us: 1.0,
            burst: 1,
            epoch_secs: 0,
        },
        Limit::Rolling {
            limit: 1,
            buckets: 1,
            interval_ms: 1,
        },
    ]
    .iter()
    .map(|limit| limit.letter().to_owned())
    .collect();
    if letters != ours {
        out.push(format!(
            "the Lua's limit letters {letters:?} are not Limit's {ours:?}"
        ));
    }
    // Reply layouts: each declared once, slot for slot as this module reads it.
    for (name, slots) in LAYOUTS {
        let tail = format!(" (src/backend/decide/protocol.rs: {name})");
        let declared: Vec<Vec<&str>> = lua
            .lines()
            .filter_map(|line| line.strip_prefix("-- Reply: ")?.strip_suffix(&*tail))
            .map(|list| list.split(", ").collect())
            .collect();
        match declared.as_slice() {
            [one] if one == slots => {}
            [one] => out.push(format!(
                "the Lua's {name} is {one:?}, protocol.rs reads {slots:?}"
            )),
            _ => out.push(format!("the Lua declares {name} {} times", declared.len())),
        }
    }
    // Each step's replies have its layout's slots.
    for (step, name) in STEPS {
        let slots = LAYOUTS
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(0, |(_, s)| s.len());
        let Some(start) = lua.find(&format!("local function {step}(")) else {
            out.push(format!("the Lua has no {step}"));
            continue;
        };
        let body = &lua[start..];
        let body = &body[..body.find("\nend\n").unwrap_or(body.len())];
        for (at, _) in body.match_indices("return {") {
            let len = table_len(&body[at + "return ".len()..]);
            if len != Some(slots) {
                out.push(format!("{step} returns {len:?} slots, {name} has {slots}"));
            }
        }
    }
    out
}

#[test]
fn the_lua_speaks_this_protocol() {
    let found = disagreements(&super::super::engine::FILES);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn a_mismatched_copy_of_the_lua_is_caught() {
    let files = super::super::engine::FILES;
    let with = |from: &str, to: &str| {
        let copy: Vec<String> = files.iter().map(|f| f.replace(from, to)).collect();
        assert_ne!(copy.concat(), files.concat(), "`{from}` is in the Lua");
        let copy: Vec<&str> = copy.iter().map(String::as_str).collect();
        disagreements(&copy)
    };
    // An operation renamed on the Lua side only.
    assert_eq!(
        with("op == 'v'", "op == 'q'"),
        [
            "the Lua names an operation 'q' that Op does not",
            "the Lua never handles Op's 'v'"
        ]
    );
    // A step that drops a slot of its reply.
    assert_eq!(
        with("return {1, s.count, s.ttl}", "return {1, s.ttl}"),
        ["period_step returns Some(2) slots, WindowReply has 3"]
    );
    // Two slots swapped in a declared layout.
    assert_eq!(
        with(
            "-- Reply: admitted, sum, retry_ms",
            "-- Reply: admitted, retry_ms, sum"
        ),
        [
            "the Lua's RollingReply is [\"admitted\", \"retry_ms\", \"sum\", \"reset_ms\"], \
          protocol.rs reads [\"admitted\", \"sum\", \"retry_ms\", \"reset_ms\"]"
        ]
    );
    // A limit letter the Rust does not write.
    assert_eq!(
        with("kind == 'r'", "kind == 'g'").len(),
        1,
        "a limit letter of the Lua's own"
    );
}

#[test]
fn the_head_is_written_as_the_lua_reads_it() {
    for op in Op::ALL {
        let mut out = Vec::new();
        write_head(&mut out, op, -3, 250);
        assert_eq!(out, format!("{}:-3:250", op.word()).into_bytes());
        assert!(op.word().chars().all(|c| c.is_ascii_alphabetic()));
    }
    assert!(!Op::Peek.writes() && Op::Check.writes());
}
