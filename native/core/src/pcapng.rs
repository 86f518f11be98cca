//! The pcapng packet-block walk: runs of packet blocks (enhanced, obsolete,
//! simple) and skippable blocks, frames handed to a callback, no Python.
//!
//! The mirror of `CaptureReader._walk_pcapng` (`sniffer/capture/pcap.py`, the
//! reference) for the common blocks only. The walk stops — and the Python
//! walk handles that one block with its own code and messages — at any block
//! it does not take: a section header, an interface description, anything
//! truncated or corrupt, or a packet whose timestamp it cannot compute
//! exactly as Python does (an interface whose divisor is above 2^53, given
//! as 0). So every rule with a message lives in Python; here a failed check
//! only means "stop".
//!
//! Timestamps are Python's `((ts_hi << 32) | ts_lo) / divisor + tsoffset`:
//! int/int true division correctly rounded (see [`div_round`]), then the
//! `tsoffset` int converted to a float and added.

const BT_SHB: u32 = 0x0A0D_0D0A;
const BT_IDB: u32 = 0x0000_0001;
const BT_OPB: u32 = 0x0000_0002;
const BT_SPB: u32 = 0x0000_0003;
const BT_EPB: u32 = 0x0000_0006;

/// Largest divisor the walk takes (above it the quotient may not be exact).
pub const MAX_DIVISOR: u64 = 1 << 53;

/// One interface of the current section (`_Interface` in pcap.py).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Iface {
    /// link type, or anything [`crate::link::supported`] refuses (frames not parsed)
    pub linktype: u32,
    /// timestamp units per second, 1..=2^53; 0: packets handed back to Python
    pub divisor: u64,
    /// seconds added to every timestamp
    pub tsoffset: i64,
    /// 0: none
    pub snaplen: u32,
}

/// Where and why a walk stopped, and what it counted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Walk {
    /// offset of the next block
    pub off: usize,
    /// packet blocks counted (parsed or not)
    pub packets: usize,
    /// captured bytes of those packets
    pub bytes: u64,
    /// the timestamp of the walk's first packet if it got one (Python sets
    /// `first_ts` when its packet count reaches 1 at that point)
    pub first: Option<f64>,
    /// the running timestamp (the previous packet's for a simple packet block)
    pub ts: f64,
    /// stopped at a block it does not take (not at the end or `max_packets`)
    pub refused: bool,
}

/// `v / d` correctly rounded to the nearest float, ties to even (Python's
/// int/int true division), for `1 <= d <= 2^53`.
///
/// Below 2^53 both operands are exact floats and IEEE division rounds
/// correctly. From 2^53 up, `q = floor(v * 2^64 / d) >= 2^64` has at least
/// 65 bits, so at least 12 below the 53 a float keeps: or-ing "remainder
/// nonzero" into bit 0 (a sticky bit, below the round bit) makes the
/// round-to-nearest-even of `q | sticky` that of the exact quotient; the
/// scaling by 2^-64 is exact (no subnormals at these magnitudes).
pub fn div_round(v: u64, d: u64) -> f64 {
    debug_assert!((1..=MAX_DIVISOR).contains(&d));
    if v < MAX_DIVISOR {
        return v as f64 / d as f64;
    }
    let n = u128::from(v) << 64;
    let d = u128::from(d);
    let (Some(q), Some(r)) = (n.checked_div(d), n.checked_rem(d)) else {
        return f64::NAN; // d == 0: not a divisor the walk takes
    };
    (q | u128::from(r != 0)) as f64 * (1.0 / 18_446_744_073_709_551_616.0)
}

fn u32_at(buf: &[u8], at: usize, big: bool) -> Option<u32> {
    let b: [u8; 4] = buf.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(if big {
        u32::from_be_bytes(b)
    } else {
        u32::from_le_bytes(b)
    })
}

/// Walk blocks from `off` in a section of byte order `big` with `ifaces`:
/// at most `max_packets` packet blocks, until the end of `buf` or a block it
/// does not take. `ts` is the running timestamp coming in. `on_frame(ts,
/// linktype, frame)` gets each packet on a known interface, in order.
pub fn walk(
    buf: &[u8],
    off: usize,
    big: bool,
    ifaces: &[Iface],
    ts: f64,
    max_packets: usize,
    mut on_frame: impl FnMut(f64, u32, &[u8]),
) -> Walk {
    let size = buf.len();
    let mut w = Walk {
        off,
        packets: 0,
        bytes: 0,
        first: None,
        ts,
        refused: false,
    };
    while w.off < size && w.packets < max_packets {
        if step(buf, big, ifaces, &mut w, &mut on_frame).is_none() {
            w.refused = true;
            break;
        }
    }
    w
}

/// Take the block at `w.off`; `None` (nothing changed) if it is not ours.
fn step(
    buf: &[u8],
    big: bool,
    ifaces: &[Iface],
    w: &mut Walk,
    on_frame: &mut impl FnMut(f64, u32, &[u8]),
) -> Option<()> {
    let off = w.off;
    let left = buf.len().checked_sub(off)?;
    if left < 12 {
        return None;
    }
    let btype = u32_at(buf, off, big)?;
    let blen32 = u32_at(buf, off.checked_add(4)?, big)?;
    if btype == BT_SHB || btype == BT_IDB {
        return None;
    }
    let blen = usize::try_from(blen32).ok()?;
    if blen < 12 || blen % 4 != 0 || blen > left {
        return None;
    }
    let next = off.checked_add(blen)?;
    let body_end = next.checked_sub(4)?; // the trailing length
    if u32_at(buf, body_end, big)? != blen32 {
        return None;
    }
    let word = |i: usize| -> Option<u32> { u32_at(buf, off.checked_add(8)?.checked_add(i)?, big) };
    let (iface, frame) = match btype {
        BT_EPB | BT_OPB => {
            if blen < 32 {
                return None;
            }
            let ifid = if btype == BT_EPB {
                word(0)?
            } else {
                // interface id (16 bits) then drops (16 bits); the rest as the EPB
                let w0 = word(0)?;
                if big {
                    w0 >> 16
                } else {
                    w0 & 0xFFFF
                }
            };
            let (ts_hi, ts_lo, caplen) = (word(4)?, word(8)?, word(12)?);
            let start = off.checked_add(28)?;
            let end = start.checked_add(usize::try_from(caplen).ok()?)?;
            let frame = buf.get(start..end).filter(|_| end <= body_end)?;
            let Some(iface) = usize::try_from(ifid).ok().and_then(|i| ifaces.get(i)) else {
                // no such interface: counted, not parsed
                w.packets = w.packets.saturating_add(1);
                w.bytes = w.bytes.saturating_add(u64::from(caplen));
                w.off = next;
                return Some(());
            };
            if !(1..=MAX_DIVISOR).contains(&iface.divisor) {
                return None; // Python times it
            }
            let v = (u64::from(ts_hi) << 32) | u64::from(ts_lo);
            w.ts = div_round(v, iface.divisor) + iface.tsoffset as f64;
            w.packets = w.packets.saturating_add(1);
            w.bytes = w.bytes.saturating_add(u64::from(caplen));
            (iface, frame)
        }
        BT_SPB => {
            if blen < 16 {
                return None;
            }
            let origlen = usize::try_from(word(0)?).ok()?;
            let mut caplen = origlen.min(blen.checked_sub(16)?);
            let Some(iface) = ifaces.first() else {
                w.packets = w.packets.saturating_add(1);
                w.bytes = w.bytes.saturating_add(caplen as u64);
                w.off = next;
                return Some(());
            };
            let snaplen = usize::try_from(iface.snaplen).ok()?;
            if snaplen != 0 && caplen > snaplen {
                caplen = snaplen;
            }
            let start = off.checked_add(12)?;
            let frame = buf.get(start..start.checked_add(caplen)?)?;
            w.packets = w.packets.saturating_add(1);
            w.bytes = w.bytes.saturating_add(caplen as u64);
            (iface, frame)
        }
        _ => {
            // statistics, name resolution, custom, …: skipped by their length
            w.off = next;
            return Some(());
        }
    };
    // a simple packet block keeps the previous packet's timestamp
    if w.packets == 1 {
        w.first = Some(w.ts);
    }
    w.off = next;
    on_frame(w.ts, iface.linktype, frame);
    Some(())
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)]
mod tests {
    use super::*;

    #[test]
    fn div_round_small_operands_are_float_division() {
        assert_eq!(
            div_round(1_700_000_000_123_456, 1_000_000),
            1_700_000_000.123456
        );
        assert_eq!(div_round(0, 1), 0.0);
    }

    #[test]
    fn div_round_large_numerators_round_correctly() {
        // 2^53 + 1 over 1: not a float; ties to even gives 2^53
        assert_eq!(div_round((1 << 53) + 1, 1), 9_007_199_254_740_992.0);
        assert_eq!(div_round((1 << 53) + 3, 1), 9_007_199_254_740_996.0);
        // a nanosecond count where float division of the rounded numerator is
        // one ulp off (Python: 2112567105869076853 / 10**9 == 2112567105.869077)
        let v = 2_112_567_105_869_076_853u64;
        assert_eq!(v as f64 / 1e9, 2_112_567_105.869_076_7);
        assert_eq!(div_round(v, 1_000_000_000), 2_112_567_105.869_077);
        assert_eq!(
            div_round(1_700_000_000_123_456_789, 1_000_000_000),
            1_700_000_000.123_456_7
        );
        assert_eq!(div_round(u64::MAX, 1), 18_446_744_073_709_551_616.0);
        assert_eq!(div_round(u64::MAX, 1 << 53), 2048.0);
    }

    fn block(btype: u32, body: &[u8]) -> Vec<u8> {
        let blen = (12 + body.len() + 3) & !3;
        let mut b = Vec::new();
        b.extend_from_slice(&btype.to_le_bytes());
        b.extend_from_slice(&(blen as u32).to_le_bytes());
        b.extend_from_slice(body);
        b.resize(blen - 4, 0);
        b.extend_from_slice(&(blen as u32).to_le_bytes());
        b
    }

    #[test]
    fn walk_stops_at_interface_blocks_and_takes_packets() {
        let mut data = block(BT_IDB, &[1, 0, 0, 0, 0, 0, 0, 0]);
        let mut epb = Vec::new();
        for v in [0u32, 0, 1_000_000, 4, 4] {
            epb.extend_from_slice(&v.to_le_bytes());
        }
        epb.extend_from_slice(b"abcd");
        data.extend(block(BT_EPB, &epb));
        data.extend(block(5, b"stat")); // interface statistics: skipped
        let ifaces = [Iface {
            linktype: 1,
            divisor: 1_000_000,
            tsoffset: 10,
            snaplen: 0,
        }];
        let mut frames = Vec::new();
        let w = walk(&data, 0, false, &ifaces, 0.0, 10, |_, _, _| ());
        assert!(w.refused && w.off == 0 && w.packets == 0);
        let idb_len = 20;
        let w = walk(&data, idb_len, false, &ifaces, 0.0, 10, |ts, lt, f| {
            frames.push((ts, lt, f.to_vec()))
        });
        assert_eq!(frames, vec![(11.0, 1, b"abcd".to_vec())]);
        assert_eq!(
            w,
            Walk {
                off: data.len(),
                packets: 1,
                bytes: 4,
                first: Some(11.0),
                ts: 11.0,
                refused: false
            }
        );
        // a trailing length that does not match: refused, nothing counted
        let mut bad = data.clone();
        let n = bad.len();
        bad[n - 1] = 9;
        let w = walk(&bad, idb_len, false, &ifaces, 0.0, 10, |_, _, _| ());
        assert!(w.refused && w.packets == 1 && w.off == n - 16);
    }
}
