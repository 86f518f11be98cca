//! One block of a `PACKET_RX_RING` of version `TPACKET_V3`: the frames it holds.
//!
//! The mirror of `AfPacketSource._walk_block` (`sniffer/capture/afpacket.py`,
//! the reference): the same headers, the same outgoing-copy rule, the same
//! counters and timestamps. The kernel writes the block, but nothing read from
//! it is trusted: every header and frame is checked against the block's bounds,
//! and the walk stops at the first one that does not fit.
//!
//! Layout (`linux/if_packet.h`, native byte order):
//! - `struct tpacket_block_desc`: `version`, `offset_to_priv`, then
//!   `tpacket_hdr_v1` with `block_status` at +8, `num_pkts` at +12,
//!   `offset_to_first_pkt` at +16;
//! - each packet: `struct tpacket3_hdr` (`tp_next_offset` +0, `tp_sec` +4,
//!   `tp_nsec` +8, `tp_snaplen` +12, `tp_len` +16, `tp_status` +20, `tp_mac`
//!   +24, u16), then `sockaddr_ll` at +48, whose `sll_pkttype` is its byte 10.

/// `sll_pkttype` of a packet the host sent (on `lo`, the copy seen twice).
pub const PACKET_OUTGOING: u8 = 4;

const BLOCK_NUM_PKTS: usize = 12;
const BLOCK_FIRST_PKT: usize = 16;
const PKT_SLL_PKTTYPE: usize = 48 + 10;

/// What a block walk counted (the reference's per-block counters).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BlockCounts {
    /// frames passed on (outgoing copies excluded)
    pub packets: u64,
    /// captured bytes of those frames
    pub bytes: u64,
    /// outgoing copies skipped
    pub skipped: u64,
    /// frames captured shorter than on the wire (snaplen < len)
    pub truncated: u64,
    /// capture time of the last frame passed on
    pub last_ts: Option<f64>,
}

fn u32_at(buf: &[u8], off: usize) -> Option<u32> {
    let b = buf.get(off..off.checked_add(4)?)?;
    Some(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
}

fn u16_at(buf: &[u8], off: usize) -> Option<u16> {
    let b = buf.get(off..off.checked_add(2)?)?;
    Some(u16::from_ne_bytes([b[0], b[1]]))
}

/// Walk the packets of one ring `block` (the whole block, its descriptor at
/// offset 0), calling `frame(ts, bytes)` for each frame passed on; outgoing
/// copies are skipped when `skip_outgoing`. A frame whose captured length runs
/// past the block is cut at the block's end.
pub fn walk_block<'a>(
    block: &'a [u8],
    skip_outgoing: bool,
    mut frame: impl FnMut(f64, &'a [u8]),
) -> BlockCounts {
    let mut counts = BlockCounts::default();
    let (Some(num), Some(first)) = (
        u32_at(block, BLOCK_NUM_PKTS),
        u32_at(block, BLOCK_FIRST_PKT),
    ) else {
        return counts;
    };
    let mut off = first as usize;
    for _ in 0..num {
        let (Some(next), Some(sec), Some(nsec), Some(snaplen), Some(wirelen), Some(mac)) = (
            u32_at(block, off),
            u32_at(block, off.saturating_add(4)),
            u32_at(block, off.saturating_add(8)),
            u32_at(block, off.saturating_add(12)),
            u32_at(block, off.saturating_add(16)),
            u16_at(block, off.saturating_add(24)),
        ) else {
            break;
        };
        let outgoing = block.get(off.saturating_add(PKT_SLL_PKTTYPE)) == Some(&PACKET_OUTGOING);
        if skip_outgoing && outgoing {
            counts.skipped = counts.skipped.saturating_add(1);
        } else {
            counts.packets = counts.packets.saturating_add(1);
            counts.bytes = counts.bytes.saturating_add(u64::from(snaplen));
            if snaplen < wirelen {
                counts.truncated = counts.truncated.saturating_add(1);
            }
            // as the reference computes it: sec + nsec * 1e-9, in doubles
            let ts = f64::from(sec) + f64::from(nsec) * 1e-9;
            counts.last_ts = Some(ts);
            let start = off.saturating_add(usize::from(mac)).min(block.len());
            let end = start.saturating_add(snaplen as usize).min(block.len());
            frame(ts, &block[start..end]);
        }
        if next == 0 {
            break;
        }
        off = off.saturating_add(next as usize);
    }
    counts
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    /// A block of `frames` (payload, pkttype, wire length over the payload).
    fn block(frames: &[(&[u8], u8, u32)]) -> Vec<u8> {
        let mut b = vec![0u8; 48];
        b[BLOCK_NUM_PKTS..BLOCK_NUM_PKTS + 4].copy_from_slice(&(frames.len() as u32).to_ne_bytes());
        b[BLOCK_FIRST_PKT..BLOCK_FIRST_PKT + 4].copy_from_slice(&48u32.to_ne_bytes());
        for (i, (payload, pkttype, extra)) in frames.iter().enumerate() {
            let off = b.len();
            let mac = 80u16;
            let len = (usize::from(mac) + payload.len() + 7) & !7;
            b.resize(off + len, 0);
            let last = i + 1 == frames.len();
            let put = |b: &mut Vec<u8>, at: usize, v: u32| {
                b[off + at..off + at + 4].copy_from_slice(&v.to_ne_bytes())
            };
            put(&mut b, 0, if last { 0 } else { len as u32 });
            put(&mut b, 4, 1_700_000_000 + i as u32);
            put(&mut b, 8, 123_456_789);
            put(&mut b, 12, payload.len() as u32);
            put(&mut b, 16, payload.len() as u32 + extra);
            b[off + 24..off + 26].copy_from_slice(&mac.to_ne_bytes());
            b[off + PKT_SLL_PKTTYPE] = *pkttype;
            b[off + usize::from(mac)..off + usize::from(mac) + payload.len()]
                .copy_from_slice(payload);
        }
        b
    }

    #[test]
    fn frames_counters_and_outgoing_copies() {
        let b = block(&[(b"abc", 0, 0), (b"out", PACKET_OUTGOING, 0), (b"xy", 0, 5)]);
        let mut seen = Vec::new();
        let c = walk_block(&b, true, |ts, f| seen.push((ts, f.to_vec())));
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0].1, b"abc");
        assert_eq!(seen[1].1, b"xy");
        assert_eq!(seen[1].0, 1_700_000_002.0 + 123_456_789.0 * 1e-9);
        assert_eq!(
            c,
            BlockCounts {
                packets: 2,
                bytes: 5,
                skipped: 1,
                truncated: 1,
                last_ts: Some(seen[1].0),
            }
        );
        let all = walk_block(&b, false, |_, _| {});
        assert_eq!((all.packets, all.skipped), (3, 0));
    }

    #[test]
    fn nothing_read_past_the_block() {
        let b = block(&[(b"abcdef", 0, 0), (b"ghi", 0, 0)]);
        // every cut of the block: no panic, never more frames than fit
        for cut in 0..b.len() {
            let mut n = 0;
            let c = walk_block(&b[..cut], true, |_, f| {
                assert!(f.len() <= 6);
                n += 1;
            });
            assert_eq!(c.packets, n);
            assert!(n <= 2);
        }
        // absurd counts and offsets
        let mut bad = block(&[(b"abc", 0, 0)]);
        bad[BLOCK_NUM_PKTS..BLOCK_NUM_PKTS + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
        let off = 48;
        bad[off..off + 4].copy_from_slice(&u32::MAX.to_ne_bytes()); // next offset
        bad[off + 12..off + 16].copy_from_slice(&u32::MAX.to_ne_bytes()); // snaplen
        bad[off + 24..off + 26].copy_from_slice(&u16::MAX.to_ne_bytes()); // mac
        let c = walk_block(&bad, false, |_, f| assert!(f.is_empty()));
        assert_eq!(c.packets, 1);
    }
}
