//! Unit tests of the reassembler; the differential tests against the Python
//! reference are in tests/test_native_reassembly.py.
#![allow(clippy::arithmetic_side_effects)]

use super::*;

const C: Addr = Addr::V4([127, 0, 0, 1]);
const S: Addr = Addr::V4([127, 0, 0, 2]);

fn seg(from_client: bool, seq: u32, ack: u32, flags: u8, payload: &[u8]) -> Seg<'_> {
    let (src, sport, dst, dport) = if from_client {
        (C, 50000, S, 8000)
    } else {
        (S, 8000, C, 50000)
    };
    Seg {
        src,
        sport,
        dst,
        dport,
        seq,
        ack,
        flags,
        payload,
    }
}

fn run(r: &mut Reassembler, segs: &[(f64, Seg<'_>)]) -> Vec<Event> {
    let mut out = Vec::new();
    for (ts, s) in segs {
        r.feed(*ts, s, None, &mut out).unwrap();
    }
    out
}

fn data_of(events: &[Event], client: bool) -> Vec<u8> {
    let mut v = Vec::new();
    for e in events {
        if let Event::Data {
            from_client, data, ..
        } = e
        {
            if *from_client == client {
                v.extend(data);
            }
        }
    }
    v
}

#[test]
fn handshake_data_and_fin_near_the_sequence_wrap() {
    let isn = u32::MAX - 2;
    let mut r = Reassembler::new(Config::default());
    let ev = run(
        &mut r,
        &[
            (1.0, seg(true, isn, 0, SYN, b"")),
            (1.1, seg(false, 7, isn.wrapping_add(1), SYN | ACK, b"")),
            (1.2, seg(true, isn.wrapping_add(1), 8, ACK, b"GET / ")),
            (1.3, seg(true, isn.wrapping_add(7), 8, ACK, b"HTTP/1.1")),
            (1.4, seg(false, 8, isn.wrapping_add(15), ACK | FIN, b"ok")),
            (1.5, seg(true, isn.wrapping_add(15), 11, ACK | FIN, b"")),
        ],
    );
    assert!(matches!(
        ev[0],
        Event::Opened {
            conn: 1,
            syn_seen: true,
            ..
        }
    ));
    assert_eq!(data_of(&ev, true), b"GET / HTTP/1.1");
    assert_eq!(data_of(&ev, false), b"ok");
    assert!(matches!(
        ev.last(),
        Some(Event::Closed { reason: "fin", .. })
    ));
    assert_eq!(r.open_connections(), 0);
}

#[test]
fn reordered_duplicate_and_mismatching_overlap() {
    let mut r = Reassembler::new(Config::default());
    let ev = run(
        &mut r,
        &[
            (1.0, seg(true, 100, 0, SYN, b"")),
            (1.1, seg(true, 106, 0, ACK, b"world")),
            (1.2, seg(true, 101, 0, ACK, b"hello")),
            (1.3, seg(true, 101, 0, ACK, b"hellO")),
        ],
    );
    assert_eq!(data_of(&ev, true), b"helloworld");
    assert_eq!(r.stats.out_of_order, 1);
    assert_eq!(r.stats.retransmissions, 1);
    assert_eq!(r.stats.overlaps_inconsistent, 1);
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::Anomaly {
            kind: "overlap-mismatch",
            offset: 0,
            length: 5,
            ..
        }
    )));
}

#[test]
fn a_hole_acked_by_the_peer_is_lost_at_the_next_segment() {
    let mut r = Reassembler::new(Config::default());
    let ev = run(
        &mut r,
        &[
            (1.0, seg(true, 100, 0, SYN, b"")),
            (1.1, seg(false, 500, 101, SYN | ACK, b"")),
            (1.2, seg(true, 101, 501, ACK, b"abc")),
            // the server acknowledges 10 bytes; 7 were never captured
            (1.3, seg(false, 501, 111, ACK, b"")),
            (1.4, seg(true, 111, 501, ACK, b"xyz")),
        ],
    );
    let gaps: Vec<_> = ev
        .iter()
        .filter_map(|e| match e {
            Event::Gap { nbytes, reason, .. } => Some((*nbytes, reason.to_string())),
            _ => None,
        })
        .collect();
    assert_eq!(gaps, vec![(Some(7), "lost".to_owned())]);
    assert_eq!(data_of(&ev, true), b"abcxyz");
}

#[test]
fn midstream_is_oriented_by_server_ports_then_port_order() {
    let mut cfg = Config::default();
    cfg.server_ports.insert(50000);
    let mut r = Reassembler::new(cfg);
    let ev = run(&mut r, &[(1.0, seg(false, 9, 0, ACK, b"data"))]);
    match &ev[0] {
        Event::Opened {
            client,
            server,
            syn_seen: false,
            ..
        } => {
            assert_eq!((*client, *server), ((S, 8000), (C, 50000)));
        }
        e => panic!("{e:?}"),
    }
    assert!(matches!(&ev[1], Event::Gap { nbytes: None, reason, .. } if reason == "midstream"));
}

#[test]
fn port_reuse_ends_the_old_connection_as_idle() {
    let mut r = Reassembler::new(Config::default());
    let ev = run(
        &mut r,
        &[
            (1.0, seg(true, 100, 0, SYN, b"")),
            (1.1, seg(true, 101, 0, ACK, b"a")),
            (2.0, seg(true, 9000, 0, SYN, b"")),
        ],
    );
    assert_eq!(r.stats.port_reuse, 1);
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::Closed {
            conn: 1,
            reason: "idle",
            ..
        }
    )));
    assert!(matches!(ev.last(), Some(Event::Opened { conn: 2, .. })));
}

#[test]
fn an_id_source_error_drops_the_segment_and_its_events() {
    let mut r = Reassembler::new(Config::default());
    let mut out = Vec::new();
    let mut fail = || -> Result<i64, String> { Err("IdsUnavailable: no ids".to_owned()) };
    let s = seg(true, 1, 0, SYN, b"");
    assert_eq!(
        r.feed(1.0, &s, Some(&mut fail), &mut out),
        Err("IdsUnavailable: no ids".into())
    );
    assert!(out.is_empty());
    let mut next = 41;
    let mut ok = || -> Result<i64, String> {
        next += 1;
        Ok(next)
    };
    r.feed(1.0, &s, Some(&mut ok), &mut out).unwrap();
    assert!(matches!(out[0], Event::Opened { conn: 42, .. }));
}

#[test]
fn the_buffer_cap_declares_holes_lost() {
    let cfg = Config {
        max_buffer: 10,
        ..Config::default()
    };
    let mut r = Reassembler::new(cfg);
    let ev = run(
        &mut r,
        &[
            (1.0, seg(true, 0, 0, SYN, b"")),
            (1.1, seg(true, 11, 0, ACK, b"0123456789")),
            (1.2, seg(true, 21, 0, ACK, b"abc")),
        ],
    );
    assert_eq!(r.stats.buffer_cap_hits, 1);
    assert!(ev.iter().any(|e| matches!(
        e,
        Event::Gap {
            nbytes: Some(10),
            ..
        }
    )));
    assert_eq!(data_of(&ev, true), b"0123456789abc");
}

#[test]
fn checkpoint_forget_and_adopt() {
    let mut r = Reassembler::new(Config::default());
    run(
        &mut r,
        &[
            (1.0, seg(true, 100, 0, SYN, b"")),
            (1.1, seg(false, 500, 101, SYN | ACK, b"")),
            (1.2, seg(true, 101, 501, ACK, b"abc")),
        ],
    );
    assert_eq!(r.checkpoint(1, None), Some((104, 501)));
    r.forget(1);
    assert_eq!(r.open_connections(), 0);
    let mut r2 = Reassembler::new(Config::default());
    r2.adopt(7, 5.0, (C, 50000), (S, 8000), 104, 501);
    let ev = run(&mut r2, &[(5.5, seg(false, 511, 104, ACK, b"late"))]);
    assert!(
        matches!(&ev[0], Event::Gap { conn: 7, nbytes: Some(10), reason, .. } if reason == "restart")
    );
    assert_eq!(data_of(&ev, false), b"late");
}

/// What a `Hash` writes to its hasher, call by call.
#[derive(Default)]
struct Writes(Vec<Vec<u8>>);

impl Hasher for Writes {
    fn finish(&self) -> u64 {
        0
    }
    fn write(&mut self, bytes: &[u8]) {
        self.0.push(bytes.to_vec());
    }
}

fn writes(key: Key) -> Vec<Vec<u8>> {
    let mut w = Writes::default();
    HalfKey(key).hash(&mut w);
    w.0
}

#[test]
fn a_direction_key_is_hashed_in_one_write_that_tells_every_key_apart() {
    let v6 = |a: [u8; 4]| {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&a);
        Addr::V6(b)
    };
    let keys: Vec<Key> = vec![
        (C, 50000, S, 8000),
        (S, 8000, C, 50000),
        (C, 50001, S, 8000),
        (C, 50000, S, 8001),
        (v6([127, 0, 0, 1]), 50000, S, 8000), // the same bytes, another variant
        (C, 50000, v6([127, 0, 0, 2]), 8000),
        (Addr::V4([0; 4]), 0, Addr::Invalid, 0),
        (Addr::Invalid, 0, Addr::V4([0; 4]), 0),
        (Addr::Invalid, 0, Addr::Invalid, 0),
        (Addr::V6([0; 16]), 0, Addr::Invalid, 0),
    ];
    let mut seen = HashSet::new();
    for key in &keys {
        let w = writes(*key);
        assert_eq!(w.len(), 1, "one write per key");
        assert_eq!(w[0].len(), 38);
        assert_eq!(writes(*key), w, "the same key, the same bytes");
        assert!(seen.insert(w[0].clone()), "{key:?} hashed like another key");
    }
    // and the table finds each direction as the tuple did
    let mut m = HashMap::new();
    for (i, key) in keys.iter().enumerate() {
        m.insert(HalfKey(*key), i);
    }
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(m.get(&HalfKey(*key)), Some(&i));
    }
}
