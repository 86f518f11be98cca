//! The load of a `tokenizer.json` by `Bpe::from_json`, timed (for callgrind:
//! `valgrind --tool=callgrind target/release/examples/bpe_load FILE`).
use std::time::Instant;

fn main() {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: bpe_load tokenizer.json");
        return;
    };
    let Ok(data) = std::fs::read(&path) else {
        eprintln!("cannot read {path}");
        return;
    };
    let t = Instant::now();
    match sparseety_core::bpe::Bpe::from_json(&data) {
        Ok(b) => println!("from_json {:?}, vocab {}", t.elapsed(), b.vocab_size()),
        Err(e) => eprintln!("{e}"),
    }
}
