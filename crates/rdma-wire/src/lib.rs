//! RoCEv2 wire formats: the bytes of InfiniBand transport packets carried
//! over UDP/IP (IBA Volume 1 chapter 9 and Annex A17 "RoCEv2").
//!
//! This layer turns untrusted bytes into validated values and back. Every
//! header comes as a *view* (`…Packet<T: AsRef<[u8]>>`, getters on any
//! buffer, setters on a mutable one, `new_checked` for untrusted input) and
//! a *repr* (`…Repr`, only validated values, with `parse`, `buffer_len` and
//! `emit`). Above the fixed headers, [`IbRepr`] ties a BTH, the extension
//! headers its opcode calls for, the payload and the pad together, and
//! [`RoceRepr`] adds the IPv4/IPv6 and UDP headers and the ICRC, so a soft
//! NIC can build and check whole datagrams in both directions.
//!
//! Contract:
//! - [`Opcode`] is backed by ONE table (IBA 9.2 table 38 plus the RoCEv2
//!   CNP): which extension headers follow the BTH and in what order, the
//!   payload rule, position in the message, request or response, what
//!   acknowledgement a request elicits, whether it takes a receive WQE.
//!   Everything in this crate that needs such a fact asks the table; other
//!   crates should too.
//! - Parsing never panics and never allocates; reprs borrow the payload.
//! - Emitting what was parsed gives back the same bytes (reserved fields are
//!   emitted as zero, which is what senders must put there).
//! - [`icrc`] computes the invariant CRC exactly as Annex A17 masks it,
//!   over the bytes in place, without allocating.
//!
//! What it refuses: IPv4 options and fragments, IPv6 extension headers,
//! transport header versions other than 0, opcodes outside RC/UC/UD/CNP
//! (they still parse as [`Opcode::Unknown`] in a BTH, but a packet whose
//! headers cannot be known is an error). Management datagram payloads are
//! not decoded here (see `rdma-mad`); the payload slice is handed up as is.
//!
//! Checksum and ICRC verification are skipped under `cfg(fuzzing)` so a
//! fuzzer can reach the code behind them.
//!
//! # Example
//!
//! ```
//! use rdma_types::{Pkey, Psn, Qpn};
//! use rdma_wire::*;
//!
//! // An RC SEND Only of 5 bytes from 10.0.0.1 to 10.0.0.2, as a NIC behind
//! // a UDP socket sends it (IPv4 ID 0, DF: see `IpRepr::rocev2`).
//! let (src, dst) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
//! let qpn = Qpn::new(0x11).unwrap();
//! let mut bth = BthRepr::new(Opcode::RcSendOnly, Pkey::DEFAULT, qpn, Psn::new(100));
//! bth.ack_req = true;
//! let roce = RoceRepr {
//!     ip: IpRepr::rocev2(src, dst, 0).unwrap(),
//!     udp: UdpRepr { src_port: 0xC011, dst_port: ROCEV2_UDP_PORT, checksum: UdpChecksum::None },
//!     ib: IbRepr::new(bth, ExtHeaders::default(), b"hello"),
//! };
//! // What goes into the socket: BTH, payload, 3 pad bytes, ICRC.
//! let mut dgram = [0u8; 64];
//! let n = roce.emit_udp_payload(&mut dgram).unwrap();
//! assert_eq!(n, 12 + 5 + 3 + 4);
//! // What the peer does with it: parse and check the ICRC.
//! let back = RoceRepr::parse_datagram(roce.ip, roce.udp, &dgram[..n]).unwrap();
//! assert_eq!(back.ib.payload, b"hello");
//! assert_eq!(back.ib.info().unwrap().ack_class(), AckClass::Ack);
//! ```

#![forbid(unsafe_code)]

mod bytes;
mod error;

pub mod bth;
pub mod ethernet;
pub mod ext;
pub mod icrc;
pub mod ip;
pub mod opcode;
pub mod packet;
pub mod pcap;

#[doc(hidden)]
pub mod fuzz;

pub use bth::{BthPacket, BthRepr};
pub use error::{EmitError, ParseError};
pub use ethernet::{EtherType, EthernetPacket, EthernetRepr};
pub use ext::{
    AethPacket, AethRepr, AtomicAckEthPacket, AtomicAckEthRepr, AtomicEthPacket, AtomicEthRepr,
    CreditCount, DethPacket, DethRepr, IethPacket, IethRepr, ImmDtPacket, ImmDtRepr, NakCode,
    RethPacket, RethRepr, RnrTimer, Syndrome,
};
pub use ip::{
    flow_label_for_qps, rxe_default_source_port, source_port_for_flow_label, IpRepr, Ipv4Packet,
    Ipv4Repr, Ipv6Packet, Ipv6Repr, UdpChecksum, UdpPacket, UdpRepr,
};
pub use opcode::{AckClass, ExtHeader, Kind, OpInfo, Opcode, PayloadRule, Position, Transport};
pub use packet::{ExtHeaders, IbRepr, RoceFrame, RoceRepr};

/// UDP destination port of RoCEv2 (IBA Annex A17).
pub const ROCEV2_UDP_PORT: u16 = 4791;

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;
