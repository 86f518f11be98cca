//! Unit tests and the no-panic property test of the HTTP/1 parser.

use super::*;
use proptest::prelude::*;

fn run(events: &[FlowEvent<'_>]) -> Vec<HttpEvent> {
    let mut p = HttpParser::default();
    let mut out = Vec::new();
    for ev in events {
        p.feed(ev, &mut out);
    }
    out
}

fn exchange(req: &[u8], resp: &[u8]) -> Vec<HttpEvent> {
    run(&[
        FlowEvent::Opened {
            conn: 1,
            ts: 0.0,
            syn_seen: true,
        },
        FlowEvent::Data {
            conn: 1,
            ts: 1.0,
            from_client: true,
            data: req,
        },
        FlowEvent::Data {
            conn: 1,
            ts: 2.0,
            from_client: false,
            data: resp,
        },
        FlowEvent::Closed {
            conn: 1,
            ts: 3.0,
            reason: "fin",
        },
    ])
}

fn bodies(out: &[HttpEvent]) -> Vec<u8> {
    out.iter()
        .filter_map(|e| match e {
            HttpEvent::Body {
                from_client: false,
                data,
                ..
            } => Some(data.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn chunked_sse_response() {
    let out = exchange(
        b"POST /v1/chat HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6;x=y\r\ndata: \r\n0\r\nT: 1\r\n\r\n",
    );
    assert_eq!(bodies(&out), b"data: ");
    assert!(out.iter().any(|e| matches!(
        e,
        HttpEvent::End {
            from_client: false,
            reason: EndReason::Complete,
            ..
        }
    )));
}

#[test]
fn content_length_over_u64_is_framing_error() {
    let out = exchange(
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999999999999\r\n\r\nabc",
    );
    assert!(out.iter().any(|e| matches!(e, HttpEvent::Error { kind: "framing", message, .. } if message == "Content-Length out of range")));
}

#[test]
fn head_and_304_have_no_body() {
    let out = exchange(
        b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nHTTP/1.1 304 Not Modified\r\n\r\n",
    );
    let ends = out
        .iter()
        .filter(|e| {
            matches!(
                e,
                HttpEvent::End {
                    from_client: false,
                    reason: EndReason::Complete,
                    ..
                }
            )
        })
        .count();
    assert_eq!(ends, 2);
}

#[test]
fn gzip_body_is_decoded() {
    use std::io::Write;
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(b"hello world").unwrap();
    let gz = enc.finish().unwrap();
    let mut resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: {}\r\n\r\n",
        gz.len()
    )
    .into_bytes();
    resp.extend_from_slice(&gz);
    let out = exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", &resp);
    assert_eq!(bodies(&out), b"hello world");
}

#[test]
fn preface_hands_over() {
    let out = run(&[
        FlowEvent::Opened {
            conn: 1,
            ts: 0.0,
            syn_seen: true,
        },
        FlowEvent::Data {
            conn: 1,
            ts: 1.0,
            from_client: true,
            data: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        },
    ]);
    let n = out.len();
    assert!(matches!(
        &out[n - 2],
        HttpEvent::H2Handover {
            mode: H2Mode::Preface,
            base: 0,
            ..
        }
    ));
    assert!(matches!(
        &out[n - 1],
        HttpEvent::H2Feed {
            event: HeldEvent::Data { from_client: true, data, .. },
            ..
        } if data.starts_with(b"PRI * HTTP/2.0")
    ));
}

fn conn_run(steps: &[(bool, &[u8])]) -> Vec<HttpEvent> {
    let mut evs = vec![FlowEvent::Opened {
        conn: 1,
        ts: 0.0,
        syn_seen: true,
    }];
    for (k, (from_client, data)) in steps.iter().enumerate() {
        evs.push(FlowEvent::Data {
            conn: 1,
            ts: k as f64,
            from_client: *from_client,
            data,
        });
    }
    run(&evs)
}

fn h2c_errors(out: &[HttpEvent]) -> Vec<String> {
    out.iter()
        .filter_map(|e| match e {
            HttpEvent::Error {
                kind: "h2c",
                message,
                ..
            } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

const PLAIN: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
const OFFER: &[u8] = b"GET /u HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n";
const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
const SWITCH: &[u8] =
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n";

#[test]
fn h2c_upgrade_on_the_second_request_makes_it_stream_one() {
    let out = conn_run(&[(true, PLAIN), (false, OK), (true, OFFER), (false, SWITCH)]);
    let handover = out.iter().position(|e| {
        matches!(
            e,
            HttpEvent::H2Handover {
                mode: H2Mode::Upgrade,
                base: 1,
                ..
            }
        )
    });
    assert!(handover.is_some(), "{out:?}");
    assert!(h2c_errors(&out).is_empty());
}

#[test]
fn client_bytes_after_an_offer_wait_for_the_answer() {
    // the preface pipelined before the 101: held, then HTTP/2's
    let mut req = OFFER.to_vec();
    req.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    let out = conn_run(&[(true, &req), (false, SWITCH)]);
    let at = out
        .iter()
        .position(|e| matches!(e, HttpEvent::H2Handover { base: 0, .. }))
        .expect("handed over");
    assert!(matches!(
        &out[at + 1],
        HttpEvent::H2Feed {
            event: HeldEvent::Data { from_client: true, data, .. },
            ..
        } if data.starts_with(b"PRI * HTTP/2.0")
    ));
}

#[test]
fn a_refused_offer_releases_the_held_request_with_an_error() {
    let mut req = OFFER.to_vec();
    req.extend_from_slice(PLAIN);
    let out = conn_run(&[(true, &req), (false, OK), (false, OK)]);
    assert!(!out
        .iter()
        .any(|e| matches!(e, HttpEvent::H2Handover { .. })));
    assert_eq!(
        h2c_errors(&out),
        [
            "HTTP/1.1 request pipelined sent before the answer to an Upgrade: h2c request \
          (the server refused the upgrade)"
        ]
    );
    let requests = out
        .iter()
        .filter(|e| matches!(e, HttpEvent::Request { .. }))
        .count();
    assert_eq!(requests, 2);
}

#[test]
fn a_preface_after_requests_waits_for_their_answers() {
    let out = conn_run(&[
        (true, PLAIN),
        (true, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
        (false, OK),
    ]);
    let resp = out
        .iter()
        .position(|e| matches!(e, HttpEvent::Response { exchange: 0, .. }))
        .expect("the HTTP/1.1 answer");
    let at = out
        .iter()
        .position(|e| {
            matches!(
                e,
                HttpEvent::H2Handover {
                    mode: H2Mode::Preface,
                    base: 1,
                    ..
                }
            )
        })
        .expect("handed over");
    assert!(resp < at);
}

#[test]
fn an_early_101_waits_for_the_upgraded_request_to_end() {
    let req = b"POST /u HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nContent-Length: 4\r\n\r\nab";
    let out = conn_run(&[(true, req), (false, SWITCH), (true, b"cd")]);
    let end = out
        .iter()
        .position(|e| {
            matches!(
                e,
                HttpEvent::End {
                    exchange: 0,
                    from_client: true,
                    reason: EndReason::Complete,
                    ..
                }
            )
        })
        .expect("the request ends as HTTP/1.1");
    let at = out
        .iter()
        .position(|e| matches!(e, HttpEvent::H2Handover { base: 0, .. }))
        .expect("handed over");
    assert!(end < at, "{out:?}");
}

fn split_feed(conn_events: &[(bool, Vec<u8>)], syn: bool) {
    let mut p = HttpParser::default();
    let mut out = Vec::new();
    p.feed(
        &FlowEvent::Opened {
            conn: 7,
            ts: 0.0,
            syn_seen: syn,
        },
        &mut out,
    );
    for (i, (fc, data)) in conn_events.iter().enumerate() {
        let ts = i as f64;
        if data.first() == Some(&0xff) && data.len() == 1 {
            p.feed(
                &FlowEvent::Gap {
                    conn: 7,
                    ts,
                    from_client: *fc,
                    nbytes: Some(10),
                    reason: "lost",
                },
                &mut out,
            );
        } else {
            p.feed(
                &FlowEvent::Data {
                    conn: 7,
                    ts,
                    from_client: *fc,
                    data,
                },
                &mut out,
            );
        }
    }
    p.feed(
        &FlowEvent::End {
            conn: 7,
            ts: 99.0,
            from_client: false,
            reason: "fin",
        },
        &mut out,
    );
    p.feed(
        &FlowEvent::Closed {
            conn: 7,
            ts: 100.0,
            reason: "fin",
        },
        &mut out,
    );
}

fn http_ish() -> impl Strategy<Value = Vec<u8>> {
    let atoms = prop::sample::select(vec![
        &b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"[..],
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 101 Switching\r\n\r\n",
        b"Content-Encoding: gzip\r\n",
        b"Content-Length: 18446744073709551616\r\n",
        b"ffffffffffffffffffffffffffffffffffffffff\r\n",
        b"10000000000000000\r\n",
        b"5;ext=\"q\"\r\nhello\r\n",
        b"0\r\nX: y\r\n\r\n",
        b"\r\n",
        b"\n",
        b" folded\r\n",
        b"\x00",
        b"data: {}\n\n",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00",
        b"\xff",
    ]);
    prop::collection::vec(
        prop_oneof![
            atoms.prop_map(<[u8]>::to_vec),
            prop::collection::vec(any::<u8>(), 0..40)
        ],
        0..24,
    )
    .prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 600, ..ProptestConfig::default() })]

    #[test]
    fn never_panics(parts in prop::collection::vec((any::<bool>(), http_ish()), 0..12), syn in any::<bool>()) {
        split_feed(&parts, syn);
    }

    #[test]
    fn random_bytes_never_panic(parts in prop::collection::vec((any::<bool>(), prop::collection::vec(any::<u8>(), 0..200)), 0..10)) {
        split_feed(&parts, true);
        split_feed(&parts, false);
    }

    #[test]
    fn split_points_do_not_change_bodies(cuts in prop::collection::vec(0usize..200, 0..6)) {
        let resp: &[u8] = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;a=b\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(resp.len())).collect();
        cuts.sort_unstable();
        cuts.dedup();
        let mut p = HttpParser::default();
        let mut out = Vec::new();
        p.feed(&FlowEvent::Opened { conn: 1, ts: 0.0, syn_seen: true }, &mut out);
        p.feed(&FlowEvent::Data { conn: 1, ts: 0.0, from_client: true, data: b"GET / HTTP/1.1\r\nHost: a\r\n\r\n" }, &mut out);
        let mut last = 0;
        for c in cuts.into_iter().chain([resp.len()]) {
            p.feed(&FlowEvent::Data { conn: 1, ts: 0.0, from_client: false, data: &resp[last..c] }, &mut out);
            last = c;
        }
        prop_assert_eq!(bodies(&out), b"hello world".to_vec());
    }
}

#[test]
fn anomalies_name_the_exchange_their_bytes_touched() {
    let anomaly = |from_client| FlowEvent::Anomaly {
        conn: 1,
        from_client,
    };
    let data = |from_client, data| FlowEvent::Data {
        conn: 1,
        ts: 1.0,
        from_client,
        data,
    };
    let r = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    let out = run(&[
        FlowEvent::Opened {
            conn: 1,
            ts: 0.0,
            syn_seen: true,
        },
        anomaly(true),  // before any request: the first one (0)
        anomaly(false), // nothing pending, nothing ended: none
        data(true, r),
        data(true, b"GET /b HT"),
        anomaly(true),  // a request head not yet complete: the one it will be (1)
        anomaly(false), // the answer to the oldest pending request (0)
        data(false, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nab"),
        anomaly(false), // the response being read (0)
        data(false, b"cd"),
        anomaly(false), // the last that ended on this direction (0)
    ]);
    let got: Vec<(Option<i64>, bool)> = out
        .iter()
        .filter_map(|e| match e {
            HttpEvent::Anomaly {
                exchange,
                from_client,
                ..
            } => Some((*exchange, *from_client)),
            _ => None,
        })
        .collect();
    assert_eq!(
        got,
        [
            (Some(0), true),
            (None, false),
            (Some(1), true),
            (Some(0), false),
            (Some(0), false),
            (Some(0), false),
        ]
    );
}
