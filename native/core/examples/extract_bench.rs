//! Instruction counts of the OpenAI chunk extraction on real items, for
//! callgrind (`bench/bench_native_openai.py` measures the same through Python).
//!
//! The input file holds the items of a capture, each as one byte (`C` chat,
//! `P` completions), a little-endian u32 length and the item's UTF-8 text
//! (written by `bench/dump_openai_items.py`). Each item is extracted once:
//!
//!     cargo build --release --example extract_bench -p sparseety-core
//!     valgrind --tool=callgrind --toggle-collect='*openai*extract*' \
//!         target/release/examples/extract_bench ITEMS
//!
//! and the `Ir` divided by the item count is the cost of one chunk's extraction.

use std::hint::black_box;

use sparseety_core::openai::{extract, Endpoint};

fn main() {
    let path = std::env::args().nth(1).expect("usage: extract_bench ITEMS");
    let bytes = std::fs::read(&path).expect("readable items file");
    let mut rest = bytes.as_slice();
    let (mut items, mut taken, mut deltas) = (0_usize, 0_usize, 0_usize);
    while let Some((&tag, tail)) = rest.split_first() {
        let (len, tail) = tail.split_at(4);
        let len = u32::from_le_bytes(len.try_into().expect("4 bytes")) as usize;
        let (text, tail) = tail.split_at(len);
        rest = tail;
        let text = std::str::from_utf8(text).expect("UTF-8 items");
        let endpoint = if tag == b'C' {
            Endpoint::Chat
        } else {
            Endpoint::Completions
        };
        items = items.wrapping_add(1);
        if let Some(chunk) = black_box(extract(black_box(text), endpoint, false)) {
            taken = taken.wrapping_add(1);
            deltas = deltas.wrapping_add(chunk.deltas.len());
        }
    }
    println!("{items} items, {taken} taken, {deltas} deltas");
}
