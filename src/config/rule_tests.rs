//! The tests of `rule.rs`.

use super::parse_offset;

#[test]
fn offsets_read_back_as_written() {
    for text in ["UTC", "+05:30", "-08:00", "+14:00", "-00:30"] {
        let offset = parse_offset(text).unwrap();
        assert_eq!(super::format_offset(offset), text);
    }
}

#[test]
fn offsets() {
    assert_eq!(parse_offset("UTC").unwrap().seconds(), 0);
    assert_eq!(parse_offset("+05:30").unwrap().seconds(), 19_800);
    assert_eq!(parse_offset("-08").unwrap().seconds(), -28_800);
    for bad in ["", "5", "+5:60", "+123", "+aa", "++1"] {
        assert!(parse_offset(bad).is_err(), "{bad}");
    }
}
