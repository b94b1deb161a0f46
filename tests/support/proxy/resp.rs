//! RESP framing for the proxy: where each reply starts and ends in a byte stream read
//! in arbitrary chunks, so that faults apply per reply.

/// Finds where RESP replies (RESP2 and RESP3) start and end in a server-to-client byte
/// stream read in arbitrary chunks.
#[derive(Debug, Default)]
pub(super) struct ReplySplitter {
    /// The bytes of a reply not complete yet, from earlier chunks.
    carry: Vec<u8>,
    /// Set once something that is not RESP was seen: every chunk then counts as one
    /// reply.
    lost_track: bool,
}

impl ReplySplitter {
    /// Where in `chunk` each reply that ends in it starts (0 for a reply that began in
    /// an earlier chunk).
    pub(super) fn split(&mut self, chunk: &[u8]) -> Vec<usize> {
        if self.lost_track {
            return vec![0];
        }
        let carried = self.carry.len();
        self.carry.extend_from_slice(chunk);
        let mut replies = Vec::new();
        let mut pos = 0;
        loop {
            match resp_len(&self.carry[pos..]) {
                Ok(Some(len)) => {
                    replies.push(pos.saturating_sub(carried));
                    pos += len;
                }
                Ok(None) => break,
                Err(()) => {
                    self.lost_track = true;
                    self.carry.clear();
                    return vec![0];
                }
            }
        }
        self.carry.drain(..pos);
        replies
    }
}

/// The length of the first complete RESP value in `buf`: `Ok(None)` if it is not
/// complete yet, `Err` if `buf` does not start with RESP.
fn resp_len(buf: &[u8]) -> Result<Option<usize>, ()> {
    let Some(&kind) = buf.first() else {
        return Ok(None);
    };
    let Some(eol) = buf.windows(2).position(|w| w == b"\r\n") else {
        return Ok(None);
    };
    let header = eol + 2;
    let number = || -> Result<i64, ()> {
        std::str::from_utf8(&buf[1..eol])
            .map_err(|_| ())?
            .parse()
            .map_err(|_| ())
    };
    match kind {
        // Simple string, error, integer, null, double, boolean, big number.
        b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => Ok(Some(header)),
        // Bulk string, bulk error, verbatim string.
        b'$' | b'!' | b'=' => {
            let Ok(len) = usize::try_from(number()?) else {
                return Ok(Some(header)); // $-1: null
            };
            let total = header + len + 2;
            Ok((buf.len() >= total).then_some(total))
        }
        // Array, set, push; map and attribute (pairs).
        b'*' | b'~' | b'>' | b'%' | b'|' => {
            let Ok(count) = usize::try_from(number()?) else {
                return Ok(Some(header)); // *-1: null
            };
            let mut elements = if matches!(kind, b'%' | b'|') {
                count * 2
            } else {
                count
            };
            // An attribute is followed by the value it describes.
            if kind == b'|' {
                elements += 1;
            }
            let mut pos = header;
            for _ in 0..elements {
                match resp_len(&buf[pos..])? {
                    Some(len) => pos += len,
                    None => return Ok(None),
                }
            }
            Ok(Some(pos))
        }
        _ => Err(()),
    }
}
