//! Mutations of valid inputs, as a fuzzer makes them: bytes flipped, inserted, deleted
//! and repeated, and numbers or words swapped for the values that break parsers (limits
//! of integer types, huge exponents, separators, nothing at all).

use proptest::prelude::*;
use proptest::sample::Index;

/// Text that parsers meet at their edges.
pub const TOKENS: &[&str] = &[
    "0",
    "-1",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775808",
    "340282366920938463463374607431768211456",
    "1e400",
    "-0",
    "0x",
    "0xffffffffffffffff",
    "NaN",
    "inf",
    ",",
    ":",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "\n",
    "\r\n",
    "\0",
    "\u{feff}",
    "é",
    "null",
    "true",
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "oom",
    "action,addr,size,stream",
];

#[derive(Debug, Clone)]
pub enum Mutation {
    Flip(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Repeat(Index, usize, usize),
    Token(Index, usize, Index),
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Flip(i, b)),
        (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..8))
            .prop_map(|(i, v)| Mutation::Insert(i, v)),
        (any::<Index>(), 1usize..64).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<Index>(), 1usize..64, 1usize..200).prop_map(|(i, n, k)| Mutation::Repeat(i, n, k)),
        (any::<Index>(), 0usize..12, any::<Index>()).prop_map(|(i, n, t)| Mutation::Token(i, n, t)),
    ]
}

/// Up to `max` mutations.
pub fn mutations(max: usize) -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(mutation(), 1..=max)
}

/// `seed` with `mutations` applied in order.
pub fn apply(seed: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for m in mutations {
        let at = |i: &Index, len: usize| if len == 0 { 0 } else { i.index(len + 1) };
        match m {
            Mutation::Flip(i, x) if !b.is_empty() => {
                let k = i.index(b.len());
                b[k] ^= x | 1;
            }
            Mutation::Flip(..) => {}
            Mutation::Insert(i, v) => {
                let k = at(i, b.len());
                b.splice(k..k, v.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let k = at(i, b.len());
                let end = (k + n).min(b.len());
                b.drain(k..end);
            }
            Mutation::Repeat(i, n, times) => {
                let k = at(i, b.len());
                let end = (k + n).min(b.len());
                let piece = b[k..end].to_vec();
                for _ in 0..*times {
                    b.splice(end..end, piece.iter().copied());
                }
            }
            Mutation::Token(i, n, t) => {
                // Replaces up to `n` bytes with a token: often a number by another.
                let k = at(i, b.len());
                let end = (k + n).min(b.len());
                let token = TOKENS[t.index(TOKENS.len())].as_bytes();
                b.splice(k..end, token.iter().copied());
            }
        }
    }
    b
}
