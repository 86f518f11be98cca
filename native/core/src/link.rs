//! Link layer → IPv4/IPv6 → TCP: one captured frame in, one TCP segment out.
//!
//! The mirror of `sniffer/capture/packet.py` (the reference): the same link
//! types, the same rules, the same `None` for everything that is not a usable
//! TCP segment (ARP, UDP, non-first IPv4 fragments, IPv6 fragments, truncated
//! headers, unknown ethertypes). Never panics: every read is bounds-checked
//! against the frame, and no size read off the wire is used before it is
//! compared with what is there.
//!
//! - The IP total length (IPv4) or payload length (IPv6) cuts trailing
//!   link-layer padding; a shorter frame (snaplen) gives what was captured; a
//!   length of 0 (TSO, jumbograms) means "up to the end of the frame".
//! - A first IPv4 fragment still carries the TCP header: its segment is
//!   returned with the partial payload. Later fragments are dropped.
//! - IPv6 hop-by-hop, routing, destination-options and AH headers are skipped
//!   (at most 16); a fragment header (or anything else) gives `None`.

use std::fmt::Write as _;

pub const LINKTYPE_NULL: u32 = 0;
pub const LINKTYPE_ETHERNET: u32 = 1;
pub const LINKTYPE_RAW: u32 = 101;
pub const LINKTYPE_LOOP: u32 = 108;
pub const LINKTYPE_LINUX_SLL: u32 = 113;
pub const LINKTYPE_IPV4: u32 = 228;
pub const LINKTYPE_IPV6: u32 = 229;
pub const LINKTYPE_LINUX_SLL2: u32 = 276;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const AF_INET: u32 = 2;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_AH: u8 = 51;
const MAX_IPV6_EXT_HEADERS: usize = 16;

/// An IP address as captured (the raw bytes; its text is [`addr_text`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Addr {
    V4([u8; 4]),
    V6([u8; 16]),
    /// An address that no captured segment can have (a malformed checkpoint).
    Invalid,
}

/// One TCP segment, its payload borrowed from the frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg<'a> {
    pub src: Addr,
    pub sport: u16,
    pub dst: Addr,
    pub dport: u16,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub payload: &'a [u8],
}

/// The link types [`parse_frame`] knows (`SUPPORTED_LINKTYPES` in packet.py).
pub fn supported(linktype: u32) -> bool {
    matches!(
        linktype,
        LINKTYPE_NULL
            | LINKTYPE_ETHERNET
            | LINKTYPE_RAW
            | 12
            | 14
            | LINKTYPE_LOOP
            | LINKTYPE_LINUX_SLL
            | LINKTYPE_IPV4
            | LINKTYPE_IPV6
            | LINKTYPE_LINUX_SLL2
    )
}

/// Parse one frame of `linktype`; `None` for anything that is not a usable TCP segment.
pub fn parse_frame(linktype: u32, buf: &[u8]) -> Option<Seg<'_>> {
    match linktype {
        LINKTYPE_ETHERNET => ethernet(buf),
        LINKTYPE_RAW | 12 | 14 | LINKTYPE_IPV4 | LINKTYPE_IPV6 => ip_any(buf, 0),
        LINKTYPE_LINUX_SLL => {
            if buf.len() < 16 {
                return None;
            }
            by_ethertype(be16(buf, 14)?, buf, 16)
        }
        LINKTYPE_LINUX_SLL2 => {
            if buf.len() < 20 {
                return None;
            }
            by_ethertype(be16(buf, 0)?, buf, 20)
        }
        LINKTYPE_NULL => {
            // The writer's host byte order: accept either.
            let raw: [u8; 4] = buf.get(..4)?.try_into().ok()?;
            let mut family = u32::from_le_bytes(raw);
            if family > 0xFFFF {
                family = u32::from_be_bytes(raw);
            }
            by_family(family, buf, 4)
        }
        LINKTYPE_LOOP => {
            let raw: [u8; 4] = buf.get(..4)?.try_into().ok()?;
            by_family(u32::from_be_bytes(raw), buf, 4)
        }
        _ => None,
    }
}

fn be16(buf: &[u8], at: usize) -> Option<u16> {
    let b = buf.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

fn be32(buf: &[u8], at: usize) -> Option<u32> {
    let b = buf.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn ethernet(buf: &[u8]) -> Option<Seg<'_>> {
    if buf.len() < 14 {
        return None;
    }
    let mut ethertype = be16(buf, 12)?;
    let mut pos = 14usize;
    while matches!(ethertype, 0x8100 | 0x88A8 | 0x9100 | 0x9200) {
        if buf.len().saturating_sub(pos) < 4 {
            return None;
        }
        ethertype = be16(buf, pos.checked_add(2)?)?;
        pos = pos.checked_add(4)?;
    }
    by_ethertype(ethertype, buf, pos)
}

fn by_ethertype(ethertype: u16, buf: &[u8], off: usize) -> Option<Seg<'_>> {
    match ethertype {
        ETH_P_IP => ip4(buf, off, buf.len()),
        ETH_P_IPV6 => ip6(buf, off, buf.len()),
        _ => None,
    }
}

fn by_family(family: u32, buf: &[u8], off: usize) -> Option<Seg<'_>> {
    match family {
        AF_INET => ip4(buf, off, buf.len()),
        24 | 28 | 30 | 10 => ip6(buf, off, buf.len()),
        _ => None,
    }
}

fn ip_any(buf: &[u8], off: usize) -> Option<Seg<'_>> {
    match buf.get(off)? >> 4 {
        4 => ip4(buf, off, buf.len()),
        6 => ip6(buf, off, buf.len()),
        _ => None,
    }
}

/// The TCP header at `tcp` (20 bytes are there) and the payload up to `end`.
fn tcp(buf: &[u8], tcp: usize, end: usize, src: Addr, dst: Addr) -> Option<Seg<'_>> {
    let sport = be16(buf, tcp)?;
    let dport = be16(buf, tcp.checked_add(2)?)?;
    let seq = be32(buf, tcp.checked_add(4)?)?;
    let ack = be32(buf, tcp.checked_add(8)?)?;
    let doff = *buf.get(tcp.checked_add(12)?)?;
    let flags = *buf.get(tcp.checked_add(13)?)?;
    let start = tcp.checked_add(usize::from(doff >> 4) << 2)?;
    if doff < 0x50 || start > end {
        return None;
    }
    Some(Seg {
        src,
        sport,
        dst,
        dport,
        seq,
        ack,
        flags,
        payload: buf.get(start..end)?,
    })
}

fn ip4(buf: &[u8], off: usize, mut end: usize) -> Option<Seg<'_>> {
    if end.saturating_sub(off) < 40 {
        return None;
    }
    let hdr: &[u8; 20] = buf.get(off..)?.first_chunk()?;
    let vihl = hdr[0];
    let total = usize::from(u16::from_be_bytes([hdr[2], hdr[3]]));
    let frag = u16::from_be_bytes([hdr[6], hdr[7]]);
    let proto = hdr[9];
    let src = Addr::V4([hdr[12], hdr[13], hdr[14], hdr[15]]);
    let dst = Addr::V4([hdr[16], hdr[17], hdr[18], hdr[19]]);
    let ihl = usize::from(vihl & 0x0F) << 2;
    if vihl == 0x45 {
        if proto != IPPROTO_TCP || frag & 0x1FFF != 0 {
            return None;
        }
        if total != 0 {
            if total < 40 {
                return None;
            }
            end = end.min(off.checked_add(total)?);
        }
        return tcp(buf, off.checked_add(20)?, end, src, dst);
    }
    // Options (IHL > 5), or not IPv4 at all.
    if vihl >> 4 != 4 || ihl < 20 || proto != IPPROTO_TCP || frag & 0x1FFF != 0 {
        return None;
    }
    let at = off.checked_add(ihl)?;
    if end.saturating_sub(at) < 20 || at > end {
        return None;
    }
    if total != 0 {
        if total < ihl.checked_add(20)? {
            return None;
        }
        end = end.min(off.checked_add(total)?);
    }
    tcp(buf, at, end, src, dst)
}

fn ip6(buf: &[u8], off: usize, mut end: usize) -> Option<Seg<'_>> {
    if end.saturating_sub(off) < 60 {
        return None;
    }
    let hdr: &[u8; 40] = buf.get(off..)?.first_chunk()?;
    if hdr[0] >> 4 != 6 {
        return None;
    }
    let plen = usize::from(u16::from_be_bytes([hdr[4], hdr[5]]));
    let mut nh = hdr[6];
    let src = Addr::V6(hdr[8..24].try_into().ok()?);
    let dst = Addr::V6(hdr[24..40].try_into().ok()?);
    if plen != 0 {
        end = end.min(off.checked_add(40)?.checked_add(plen)?);
    }
    let mut pos = off.checked_add(40)?;
    if nh != IPPROTO_TCP {
        for _ in 0..MAX_IPV6_EXT_HEADERS {
            let skippable = matches!(nh, 0 | 43 | 60);
            if skippable || nh == IPPROTO_AH {
                if end.checked_sub(pos).is_none_or(|left| left < 8) {
                    return None;
                }
                let ext: &[u8; 2] = buf.get(pos..)?.first_chunk()?;
                let hlen = usize::from(ext[1]);
                let len = if skippable {
                    hlen.checked_add(1)?.checked_mul(8)?
                } else {
                    hlen.checked_add(2)?.checked_mul(4)?
                };
                nh = ext[0];
                pos = pos.checked_add(len)?;
            } else {
                break;
            }
            if nh == IPPROTO_TCP {
                break;
            }
        }
        if nh != IPPROTO_TCP {
            return None; // fragment, ESP, no-next-header, UDP, ICMPv6, too many headers…
        }
    }
    if end.checked_sub(pos).is_none_or(|left| left < 20) {
        return None;
    }
    tcp(buf, pos, end, src, dst)
}

/// The text of an address exactly as the C library's `inet_ntop` writes it
/// (what packet.py puts in a `Segment`): IPv6 per RFC 5952 with glibc's
/// choices (the first longest run of two or more zero groups becomes `::`;
/// `::a.b.c.d` and `::ffff:a.b.c.d` for IPv4-compatible and -mapped addresses).
pub fn addr_text(addr: &Addr) -> String {
    match addr {
        Addr::V4(b) => format!("{}.{}.{}.{}", b[0], b[1], b[2], b[3]),
        Addr::V6(b) => ip6_text(b),
        Addr::Invalid => String::new(),
    }
}

// Indices below 8 and run lengths up to 8: nothing here can overflow.
#[allow(clippy::arithmetic_side_effects)]
fn ip6_text(b: &[u8; 16]) -> String {
    let mut words = [0u16; 8];
    for (w, pair) in words.iter_mut().zip(b.chunks_exact(2)) {
        *w = u16::from_be_bytes([pair[0], pair[1]]);
    }
    // The first longest run of zero words, if at least two long.
    let (mut best_base, mut best_len) = (usize::MAX, 0usize);
    let (mut cur_base, mut cur_len) = (usize::MAX, 0usize);
    for (i, &w) in words.iter().enumerate() {
        if w == 0 {
            if cur_base == usize::MAX {
                cur_base = i;
                cur_len = 1;
            } else {
                cur_len += 1;
            }
        } else if cur_base != usize::MAX {
            if best_base == usize::MAX || cur_len > best_len {
                (best_base, best_len) = (cur_base, cur_len);
            }
            cur_base = usize::MAX;
        }
    }
    if cur_base != usize::MAX && (best_base == usize::MAX || cur_len > best_len) {
        (best_base, best_len) = (cur_base, cur_len);
    }
    if best_base != usize::MAX && best_len < 2 {
        best_base = usize::MAX;
    }
    let mut s = String::with_capacity(40);
    let mut i = 0;
    while i < 8 {
        if best_base != usize::MAX && i >= best_base && i < best_base + best_len {
            if i == best_base {
                s.push(':');
            }
            i += 1;
            continue;
        }
        if i != 0 {
            s.push(':');
        }
        if i == 6 && best_base == 0 && (best_len == 6 || (best_len == 5 && words[5] == 0xFFFF)) {
            let _ = write!(s, "{}.{}.{}.{}", b[12], b[13], b[14], b[15]);
            return s;
        }
        let _ = write!(s, "{:x}", words[i]);
        i += 1;
    }
    if best_base != usize::MAX && best_base + best_len == 8 {
        s.push(':');
    }
    s
}

/// Parse the text of an address back (a checkpoint's endpoints); only the
/// exact text [`addr_text`] writes is accepted, anything else is `Invalid`
/// (in packet.py's keys such a text never matches a captured segment either).
pub fn parse_addr(text: &str) -> Addr {
    let addr = if let Ok(a) = text.parse::<std::net::Ipv4Addr>() {
        Addr::V4(a.octets())
    } else if let Ok(a) = text.parse::<std::net::Ipv6Addr>() {
        Addr::V6(a.octets())
    } else {
        return Addr::Invalid;
    };
    if addr_text(&addr) == text {
        addr
    } else {
        Addr::Invalid
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn ip4_tcp(payload: &[u8]) -> Vec<u8> {
        let total = 40 + payload.len();
        let mut f = vec![
            0x45,
            0,
            (total >> 8) as u8,
            total as u8,
            0,
            0,
            0x40,
            0,
            64,
            6,
            0,
            0,
        ];
        f.extend([127, 0, 0, 1, 127, 0, 0, 2]);
        f.extend([0x1F, 0x90, 0xC3, 0x50]); // 8080 -> 50000
        f.extend(1000u32.to_be_bytes());
        f.extend(2000u32.to_be_bytes());
        f.extend([0x50, 0x18, 0xFF, 0xFF, 0, 0, 0, 0]);
        f.extend(payload);
        f
    }

    fn eth(ethertype: u16, ip: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend(ethertype.to_be_bytes());
        f.extend(ip);
        f
    }

    #[test]
    fn ethernet_ipv4_tcp() {
        let f = eth(0x0800, &ip4_tcp(b"hello"));
        let s = parse_frame(LINKTYPE_ETHERNET, &f).unwrap();
        assert_eq!(s.src, Addr::V4([127, 0, 0, 1]));
        assert_eq!(
            (s.sport, s.dport, s.seq, s.ack, s.flags),
            (8080, 50000, 1000, 2000, 0x18)
        );
        assert_eq!(s.payload, b"hello");
    }

    #[test]
    fn padding_is_cut_by_total_length_and_short_frames_keep_what_was_captured() {
        let mut f = eth(0x0800, &ip4_tcp(b"ab"));
        f.extend([0u8; 6]);
        assert_eq!(parse_frame(LINKTYPE_ETHERNET, &f).unwrap().payload, b"ab");
        let f = eth(0x0800, &ip4_tcp(b"abcdef"));
        assert_eq!(
            parse_frame(LINKTYPE_ETHERNET, &f[..f.len() - 2])
                .unwrap()
                .payload,
            b"abcd"
        );
    }

    #[test]
    fn vlan_tags_are_skipped() {
        let mut f = vec![0u8; 12];
        // 802.1ad then 802.1Q tags, then IPv4
        f.extend([0x88, 0xA8, 0, 1, 0x81, 0x00, 0, 2, 0x08, 0x00]);
        f.extend(ip4_tcp(b"x"));
        assert_eq!(parse_frame(LINKTYPE_ETHERNET, &f).unwrap().payload, b"x");
    }

    #[test]
    fn ipv4_options_and_bad_ihl() {
        let mut ip = ip4_tcp(b"zz");
        ip[0] = 0x46;
        ip.splice(20..20, [1, 1, 1, 1]);
        let total = ip.len() as u16;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        assert_eq!(parse_frame(LINKTYPE_RAW, &ip).unwrap().payload, b"zz");
        for vihl in [0x40u8, 0x44, 0x55] {
            let mut bad = ip4_tcp(b"zz");
            bad[0] = vihl;
            assert!(parse_frame(LINKTYPE_RAW, &bad).is_none(), "{vihl:#x}");
        }
    }

    #[test]
    fn fragments_and_other_protocols() {
        let mut ip = ip4_tcp(b"abc");
        ip[6] = 0x20; // MF, offset 0: kept
        assert!(parse_frame(LINKTYPE_IPV4, &ip).is_some());
        ip[7] = 1; // offset 8: dropped
        assert!(parse_frame(LINKTYPE_IPV4, &ip).is_none());
        let mut udp = ip4_tcp(b"abc");
        udp[9] = 17;
        assert!(parse_frame(LINKTYPE_IPV4, &udp).is_none());
    }

    fn ip6_tcp(ext: &[u8], first_nh: u8, payload: &[u8]) -> Vec<u8> {
        let plen = ext.len() + 20 + payload.len();
        let mut f = vec![0x60, 0, 0, 0, (plen >> 8) as u8, plen as u8, first_nh, 64];
        f.extend([0u8; 15]);
        f.push(1);
        f.extend([0u8; 15]);
        f.push(1);
        f.extend(ext);
        f.extend([
            0x1F, 0x90, 0xC3, 0x50, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x10, 0, 0, 0, 0, 0, 0,
        ]);
        f.extend(payload);
        f
    }

    #[test]
    fn ipv6_extension_headers() {
        let f = ip6_tcp(&[], 6, b"q");
        assert_eq!(parse_frame(LINKTYPE_IPV6, &f).unwrap().payload, b"q");
        // hop-by-hop (8 bytes) then destination options (16 bytes) then TCP
        let mut ext = vec![60, 0, 0, 0, 0, 0, 0, 0];
        ext.extend([6, 1]);
        ext.extend([0u8; 14]);
        let f = ip6_tcp(&ext, 0, b"q");
        assert_eq!(parse_frame(LINKTYPE_IPV6, &f).unwrap().payload, b"q");
        // a fragment header
        assert!(
            parse_frame(LINKTYPE_IPV6, &ip6_tcp(&[6, 0, 0, 0, 0, 0, 0, 0], 44, b"q")).is_none()
        );
        // a loop of 17 hop-by-hop headers: more than 16 are refused
        let mut ext = Vec::new();
        for _ in 0..17 {
            ext.extend([0, 0, 0, 0, 0, 0, 0, 0]);
        }
        assert!(parse_frame(LINKTYPE_IPV6, &ip6_tcp(&ext, 0, b"q")).is_none());
        // an extension header claiming 2 KiB in a short frame
        assert!(parse_frame(
            LINKTYPE_IPV6,
            &ip6_tcp(&[6, 255, 0, 0, 0, 0, 0, 0], 0, b"q")
        )
        .is_none());
    }

    #[test]
    fn cooked_and_loopback_link_types() {
        let ip = ip4_tcp(b"s");
        let mut sll = vec![0u8; 14];
        sll.extend([0x08, 0x00]);
        sll.extend(&ip);
        assert!(parse_frame(LINKTYPE_LINUX_SLL, &sll).is_some());
        let mut sll2 = vec![0x08, 0x00];
        sll2.extend([0u8; 18]);
        sll2.extend(&ip);
        assert!(parse_frame(LINKTYPE_LINUX_SLL2, &sll2).is_some());
        for family in [2u32.to_le_bytes(), 2u32.to_be_bytes()] {
            let mut null = family.to_vec();
            null.extend(&ip);
            assert!(parse_frame(LINKTYPE_NULL, &null).is_some());
        }
        let mut lo = 2u32.to_be_bytes().to_vec();
        lo.extend(&ip);
        assert!(parse_frame(LINKTYPE_LOOP, &lo).is_some());
        assert!(parse_frame(999, &lo).is_none());
    }

    #[test]
    fn every_truncation_of_a_frame_is_safe() {
        let f = eth(0x86DD, &ip6_tcp(&[6, 0, 0, 0, 0, 0, 0, 0], 60, b"payload"));
        for n in 0..f.len() {
            for lt in [0, 1, 101, 108, 113, 228, 229, 276] {
                let _ = parse_frame(lt, &f[..n]);
                let _ = parse_frame(lt, &f[n..]);
            }
        }
    }

    #[test]
    fn ipv6_text_like_inet_ntop() {
        let cases: [(&str, [u16; 8]); 7] = [
            ("::1", [0, 0, 0, 0, 0, 0, 0, 1]),
            ("::", [0; 8]),
            ("fe80::1:0:0:1", [0xfe80, 0, 0, 0, 1, 0, 0, 1]),
            ("1:0:2::", [1, 0, 2, 0, 0, 0, 0, 0]),
            ("::ffff:1.2.3.4", [0, 0, 0, 0, 0, 0xffff, 0x0102, 0x0304]),
            ("::1.2.3.4", [0, 0, 0, 0, 0, 0, 0x0102, 0x0304]),
            ("1:0:1:0:1:0:1:0", [1, 0, 1, 0, 1, 0, 1, 0]),
        ];
        for (text, words) in cases {
            let mut b = [0u8; 16];
            for (i, w) in words.iter().enumerate() {
                b[2 * i..2 * i + 2].copy_from_slice(&w.to_be_bytes());
            }
            assert_eq!(addr_text(&Addr::V6(b)), text);
            assert_eq!(parse_addr(text), Addr::V6(b));
        }
        assert_eq!(parse_addr("::0:1"), Addr::Invalid);
        assert_eq!(parse_addr("127.0.0.1"), Addr::V4([127, 0, 0, 1]));
        assert_eq!(parse_addr("nope"), Addr::Invalid);
    }
}
