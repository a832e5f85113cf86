//! The rendezvous's messages on the wire. Every message is a frame: its length (u64,
//! little-endian), then its bytes; a frame longer than the limit of its place is
//! refused before anything is allocated for it, and a frame's bytes are stored as they
//! arrive, so a length that claims more than is sent costs nothing.
//!
//! A rank's first message is its greeting, one short line of text:
//! `labs-rendezvous/2 rank=R world=W token=T` (the magic, the protocol's version, the
//! rank, the world size and the job's token, `-` for none). Rank 0's answers (the id,
//! a collective's result) start with a tag byte: 0 and the payload, or 1 and why not.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

use crate::error::{Error, Result};

/// The first word of every greeting.
pub(crate) const MAGIC: &str = "labs-rendezvous";

/// The rendezvous protocol's version, in every greeting after the magic.
pub(crate) const VERSION: u32 = 2;

/// The longest greeting, in bytes.
pub const MAX_GREETING_BYTES: u64 = 256;

/// The longest refusal or error line rank 0 sends back, in bytes.
pub(crate) const MAX_REPLY_LINE_BYTES: u64 = 1024;

/// The longest message of a barrier or a collective on the simulator, in bytes (1 GiB):
/// a rank's input, or rank 0's reply with every rank's input.
pub const MAX_MESSAGE_BYTES: u64 = 1 << 30;

/// How many bytes of a peer's message an error or log line quotes.
const QUOTED_BYTES: usize = 48;

pub(crate) fn lost(who: &str, e: std::io::Error) -> Error {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => {
            Error::Distributed(format!("timed out waiting for {who}"))
        }
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            Error::Distributed(format!("{who} closed its connection (it exited or failed)"))
        }
        _ => Error::Distributed(format!("talking to {who}: {e}")),
    }
}

/// Sends one frame.
pub(crate) fn send(stream: &mut TcpStream, who: &str, bytes: &[u8]) -> Result<()> {
    let mut frame = (bytes.len() as u64).to_le_bytes().to_vec();
    frame.extend_from_slice(bytes);
    stream.write_all(&frame).map_err(|e| lost(who, e))
}

/// Receives one frame of at most `limit` bytes.
pub(crate) fn recv(stream: &mut TcpStream, who: &str, limit: u64) -> Result<Vec<u8>> {
    let mut len = [0u8; 8];
    stream.read_exact(&mut len).map_err(|e| lost(who, e))?;
    let len =
        check_length(&len, limit).map_err(|why| Error::Distributed(format!("{who} {why}")))?;
    let mut bytes = Vec::with_capacity(len.min(1 << 16) as usize);
    (&mut *stream)
        .take(len)
        .read_to_end(&mut bytes)
        .map_err(|e| lost(who, e))?;
    if (bytes.len() as u64) < len {
        return Err(lost(who, ErrorKind::UnexpectedEof.into()));
    }
    Ok(bytes)
}

/// A frame's length from its first 8 bytes, or why it is refused (a phrase following
/// the sender's name).
pub(crate) fn check_length(first: &[u8; 8], limit: u64) -> std::result::Result<u64, String> {
    let len = u64::from_le_bytes(*first);
    if len > limit {
        return Err(format!(
            "sent a frame that starts {} and claims {len} bytes, more than the limit of \
             {limit}",
            quote(first)
        ));
    }
    Ok(len)
}

/// At most a short line of what a peer sent: its first bytes, escaped, in quotes,
/// followed by how many bytes there were when that is more than shown.
pub(crate) fn quote(bytes: &[u8]) -> String {
    let shown: String = bytes
        .iter()
        .take(QUOTED_BYTES)
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    if bytes.len() > QUOTED_BYTES {
        format!("\"{shown}\"… ({} bytes)", bytes.len())
    } else {
        format!("\"{shown}\"")
    }
}

/// A message line from the other side, as one line of at most 300 characters: control
/// characters replaced, the rest cut.
pub(crate) fn one_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut line: String = text
        .chars()
        .take(300)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().count() > 300 {
        line.push('…');
    }
    line
}

/// A rank's greeting.
pub(crate) fn greeting(rank: usize, world: usize, token: Option<&str>) -> Vec<u8> {
    let token = token.unwrap_or("-");
    format!("{MAGIC}/{VERSION} rank={rank} world={world} token={token}").into_bytes()
}

/// What a greeting says.
#[derive(Debug)]
pub(crate) struct Greeting {
    pub rank: usize,
    pub world: usize,
    pub token: Option<String>,
}

/// A greeting's fields, or why it is not one (a phrase following the sender's name).
pub(crate) fn parse_greeting(bytes: &[u8]) -> std::result::Result<Greeting, String> {
    let not_one = || format!("sent no rendezvous greeting: {}", quote(bytes));
    let text = std::str::from_utf8(bytes).map_err(|_| not_one())?;
    let mut words = text.split(' ');
    let head = words.next().unwrap_or_default();
    let Some(version) = head.strip_prefix(MAGIC) else {
        return Err(not_one());
    };
    if version != format!("/{VERSION}") {
        return Err(format!(
            "speaks another version of the rendezvous protocol ({}; this program speaks \
             {MAGIC}/{VERSION}): is it an older or newer build?",
            quote(head.as_bytes())
        ));
    }
    let mut field = |name: &str| {
        words
            .next()
            .and_then(|w| w.strip_prefix(name))
            .and_then(|w| w.strip_prefix('='))
            .ok_or_else(not_one)
    };
    let rank = field("rank")?.parse().map_err(|_| not_one())?;
    let world = field("world")?.parse().map_err(|_| not_one())?;
    let token = match field("token")? {
        "-" => None,
        t => Some(t.to_string()),
    };
    if words.next().is_some() {
        return Err(not_one());
    }
    Ok(Greeting { rank, world, token })
}

/// Whether two tokens are the same (both absent, or equal), in time that depends on
/// the lengths only, not on where they differ.
pub(crate) fn same_token(expected: Option<&str>, given: Option<&str>) -> bool {
    match (expected, given) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            let (a, b) = (a.as_bytes(), b.as_bytes());
            let mut diff = (a.len() != b.len()) as u8;
            for (i, x) in a.iter().enumerate() {
                diff |= x ^ b.get(i).copied().unwrap_or(!x);
            }
            std::hint::black_box(diff) == 0
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_round_trip_and_strangers_are_named_briefly() {
        let g = parse_greeting(&greeting(3, 8, Some("abc"))).unwrap();
        assert_eq!((g.rank, g.world, g.token.as_deref()), (3, 8, Some("abc")));
        assert_eq!(parse_greeting(&greeting(1, 2, None)).unwrap().token, None);
        let long = vec![b'x'; 1 << 20];
        let e = parse_greeting(&long).unwrap_err();
        assert!(e.len() < 200 && e.contains("1048576 bytes"), "{e}");
        let e = parse_greeting(b"labs-rendezvous rank=1 world=2").unwrap_err();
        assert!(e.contains("another version"), "{e}");
        assert!(same_token(Some("abc"), Some("abc")));
        assert!(!same_token(Some("abc"), Some("abd")));
        assert!(!same_token(Some("abc"), Some("ab")));
        assert!(!same_token(Some("abc"), None));
        assert!(!same_token(None, Some("abc")));
    }
}
