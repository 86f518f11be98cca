use std::time::Instant;
fn main() {
    let p = std::env::args().nth(1).unwrap();
    let data = std::fs::read(&p).unwrap();
    for _ in 0..3 {
        let t = Instant::now();
        let v: serde_json::Value = serde_json::from_slice(&data).unwrap();
        println!("value parse {:?}", t.elapsed());
        drop(v);
        let t = Instant::now();
        let b = sparseety_core::bpe::Bpe::from_json(&data).unwrap();
        println!("from_json {:?}", t.elapsed());
        drop(b);
    }
}
