//! THE opcode table: BTH opcodes of RC, UC and UD (IBA 9.2 table 38, header
//! order from 9.3) and the RoCEv2 congestion notification packet (IBA
//! Annex A17). Every fact about an opcode is either a
//! column of the `opcodes!` table below or derived from its columns in exactly one
//! function of [`OpInfo`]; nothing else in the project should spell them
//! again.

use core::fmt;
use rdma_types::QpType;

use crate::ext;

/// Service the opcode belongs to (the top three bits of the opcode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected, 0x00-0x1F.
    Rc,
    /// Unreliable connected, 0x20-0x3F.
    Uc,
    /// Unreliable datagram, 0x60-0x7F.
    Ud,
    /// Congestion notification (RoCEv2), 0x80-0x9F.
    Cnp,
}

impl Transport {
    /// The QP type that sends and receives this transport's packets; CNPs
    /// belong to no QP type.
    pub const fn qp_type(self) -> Option<QpType> {
        match self {
            Transport::Rc => Some(QpType::Rc),
            Transport::Uc => Some(QpType::Uc),
            Transport::Ud => Some(QpType::Ud),
            Transport::Cnp => None,
        }
    }
}

/// What the packet does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// SEND.
    Send,
    /// RDMA WRITE.
    RdmaWrite,
    /// RDMA READ request.
    RdmaReadRequest,
    /// RDMA READ response.
    RdmaReadResponse,
    /// Acknowledge: ACK, NAK or RNR NAK, told apart by the AETH syndrome.
    Acknowledge,
    /// ATOMIC Acknowledge.
    AtomicAcknowledge,
    /// ATOMIC compare and swap.
    CompareSwap,
    /// ATOMIC fetch and add.
    FetchAdd,
    /// Congestion notification.
    Cnp,
}

/// Where the packet sits in its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Position {
    /// First of several.
    First,
    /// Neither first nor last.
    Middle,
    /// Last of several.
    Last,
    /// The whole message.
    Only,
}

impl Position {
    /// Whether the packet starts a message.
    pub const fn starts(self) -> bool {
        matches!(self, Position::First | Position::Only)
    }

    /// Whether the packet ends a message.
    pub const fn ends(self) -> bool {
        matches!(self, Position::Last | Position::Only)
    }

    /// Position of packet `index` (0-based) of a message of `count` packets.
    pub const fn of(index: u32, count: u32) -> Position {
        match (index == 0, index.saturating_add(1) >= count) {
            (true, true) => Position::Only,
            (true, false) => Position::First,
            (false, true) => Position::Last,
            (false, false) => Position::Middle,
        }
    }
}

/// An extension transport header (IBA 9.3.2-9.3.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeader {
    /// Datagram ETH (IBA 9.3.2), 8 bytes.
    Deth,
    /// RDMA ETH (IBA 9.3.3), 16 bytes.
    Reth,
    /// Atomic ETH (IBA 9.3.4), 28 bytes.
    AtomicEth,
    /// ACK ETH (IBA 9.3.5), 4 bytes.
    Aeth,
    /// Atomic ACK ETH (IBA 9.3.6), 8 bytes.
    AtomicAckEth,
    /// Immediate data (IBA 9.3.7), 4 bytes.
    ImmDt,
    /// Invalidate ETH (IBA 9.3.8), 4 bytes.
    Ieth,
}

impl ExtHeader {
    /// Length on the wire.
    pub const fn wire_len(self) -> usize {
        match self {
            ExtHeader::Deth => ext::DETH_LEN,
            ExtHeader::Reth => ext::RETH_LEN,
            ExtHeader::AtomicEth => ext::ATOMIC_ETH_LEN,
            ExtHeader::Aeth => ext::AETH_LEN,
            ExtHeader::AtomicAckEth => ext::ATOMIC_ACK_ETH_LEN,
            ExtHeader::ImmDt => ext::IMM_DT_LEN,
            ExtHeader::Ieth => ext::IETH_LEN,
        }
    }

    /// Name as the IBA writes it.
    pub const fn name(self) -> &'static str {
        match self {
            ExtHeader::Deth => "DETH",
            ExtHeader::Reth => "RETH",
            ExtHeader::AtomicEth => "AtomicETH",
            ExtHeader::Aeth => "AETH",
            ExtHeader::AtomicAckEth => "AtomicAckETH",
            ExtHeader::ImmDt => "ImmDt",
            ExtHeader::Ieth => "IETH",
        }
    }
}

/// How many payload bytes a packet of an opcode may carry (IBA 9.7, packet
/// length checks; Annex A17 for CNPs; Linux rxe's responder checks the same). The path MTU is not
/// known to a parser, so [`PayloadRule::check`] takes it as an option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PayloadRule {
    /// No payload, pad count 0 (acknowledgements, READ requests, atomics).
    None,
    /// Exactly one path MTU (first and middle packets): never empty, pad 0.
    FullMtu,
    /// 1 to one path MTU bytes (last packets).
    UpToMtuNonEmpty,
    /// 0 to one path MTU bytes (only packets).
    UpToMtu,
    /// Exactly this many reserved bytes (CNP: 16).
    Fixed(usize),
}

impl PayloadRule {
    /// Checks a payload length and pad count; `mtu` bytes, when known,
    /// bounds the payload. The `Err` says which rule is broken.
    ///
    /// # Errors
    /// A short reason, used in [`ParseError::Payload`](crate::ParseError).
    pub const fn check(
        self,
        payload: usize,
        pad: u8,
        mtu: Option<usize>,
    ) -> Result<(), &'static str> {
        // IBA 9.2.2: the pad aligns payload plus pad to 4 bytes; every header
        // length is a multiple of 4, so the pad count is fixed by the payload.
        if (payload + pad as usize) & 3 != 0 {
            return Err("pad count does not align the payload to 4 bytes");
        }
        if pad > 3 || (pad > 0 && payload == 0) {
            return Err("pad bytes without payload");
        }
        let max = match mtu {
            Some(m) => m,
            None => usize::MAX,
        };
        match self {
            PayloadRule::None if payload != 0 => Err("opcode carries no payload"),
            PayloadRule::None => Ok(()),
            PayloadRule::FullMtu if payload == 0 => Err("first/middle packet without payload"),
            PayloadRule::FullMtu if pad != 0 => Err("first/middle packet with pad bytes"),
            PayloadRule::FullMtu => match mtu {
                Some(m) if payload != m => Err("first/middle packet payload is not one path MTU"),
                _ => Ok(()),
            },
            PayloadRule::UpToMtuNonEmpty if payload == 0 => Err("last packet without payload"),
            PayloadRule::UpToMtuNonEmpty | PayloadRule::UpToMtu if payload > max => {
                Err("payload longer than the path MTU")
            }
            PayloadRule::UpToMtuNonEmpty | PayloadRule::UpToMtu => Ok(()),
            PayloadRule::Fixed(n) if payload != n => {
                Err("payload length differs from the fixed length")
            }
            PayloadRule::Fixed(_) => Ok(()),
        }
    }
}

/// What the responder sends back for a request (IBA 9.7.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckClass {
    /// Nothing: UC and UD requests, responses, CNPs.
    None,
    /// ACK/NAK (Acknowledge opcode), possibly coalesced; sent at the latest
    /// for a packet with AckReq set.
    Ack,
    /// RDMA READ response packets (or a NAK).
    ReadResponse,
    /// ATOMIC Acknowledge (or a NAK).
    AtomicAck,
}

/// One row of the table, with the facts derived from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpInfo {
    /// The opcode.
    pub opcode: Opcode,
    /// Name (IBA table 38 wording).
    pub name: &'static str,
    /// RC, UC, UD or CNP.
    pub transport: Transport,
    /// What the packet does.
    pub kind: Kind,
    /// Position in the message.
    pub position: Position,
    /// Extension headers after the BTH, in wire order.
    pub headers: &'static [ExtHeader],
}

impl OpInfo {
    /// Whether `header` follows the BTH.
    pub fn has(&self, header: ExtHeader) -> bool {
        self.headers.contains(&header)
    }

    /// Bytes of BTH plus extension headers.
    pub fn header_len(&self) -> usize {
        let mut n = crate::bth::HEADER_LEN;
        for h in self.headers {
            n += h.wire_len();
        }
        n
    }

    /// Carries immediate data.
    pub fn has_immediate(&self) -> bool {
        self.has(ExtHeader::ImmDt)
    }

    /// Carries an R_Key to invalidate.
    pub fn has_invalidate(&self) -> bool {
        self.has(ExtHeader::Ieth)
    }

    /// Sent by a requester.
    pub const fn is_request(&self) -> bool {
        matches!(
            self.kind,
            Kind::Send
                | Kind::RdmaWrite
                | Kind::RdmaReadRequest
                | Kind::CompareSwap
                | Kind::FetchAdd
        )
    }

    /// Sent by a responder.
    pub const fn is_response(&self) -> bool {
        matches!(
            self.kind,
            Kind::RdmaReadResponse | Kind::Acknowledge | Kind::AtomicAcknowledge
        )
    }

    /// Is an atomic request.
    pub const fn is_atomic(&self) -> bool {
        matches!(self.kind, Kind::CompareSwap | Kind::FetchAdd)
    }

    /// Payload rule (IBA 9.7; Annex A17 for CNP).
    pub const fn payload_rule(&self) -> PayloadRule {
        match (self.kind, self.position) {
            (
                Kind::Send | Kind::RdmaWrite | Kind::RdmaReadResponse,
                Position::First | Position::Middle,
            ) => PayloadRule::FullMtu,
            (Kind::Send | Kind::RdmaWrite | Kind::RdmaReadResponse, Position::Last) => {
                PayloadRule::UpToMtuNonEmpty
            }
            (Kind::Send | Kind::RdmaWrite | Kind::RdmaReadResponse, Position::Only) => {
                PayloadRule::UpToMtu
            }
            (Kind::Cnp, _) => PayloadRule::Fixed(CNP_PAYLOAD_LEN),
            _ => PayloadRule::None,
        }
    }

    /// Whether the opcode may carry payload bytes at all.
    pub const fn carries_payload(&self) -> bool {
        !matches!(self.payload_rule(), PayloadRule::None)
    }

    /// What a request elicits from the responder (IBA 9.7.5); only RC
    /// is acknowledged.
    pub const fn ack_class(&self) -> AckClass {
        match (self.transport, self.kind) {
            (Transport::Rc, Kind::Send | Kind::RdmaWrite) => AckClass::Ack,
            (Transport::Rc, Kind::RdmaReadRequest) => AckClass::ReadResponse,
            (Transport::Rc, Kind::CompareSwap | Kind::FetchAdd) => AckClass::AtomicAck,
            _ => AckClass::None,
        }
    }

    /// Whether the responder takes a receive WQE at this packet (IBA 9.4;
    /// the same packets as Linux rxe's RWR mask):
    /// the first packet of a SEND, the immediate-carrying packet of a WRITE.
    pub fn consumes_rwqe(&self) -> bool {
        match self.kind {
            Kind::Send => self.position.starts(),
            Kind::RdmaWrite => self.has_immediate(),
            _ => false,
        }
    }

    /// Whether a receive completion is produced at this packet (last of a
    /// SEND, or the WRITE with immediate).
    pub fn completes_rwqe(&self) -> bool {
        match self.kind {
            Kind::Send => self.position.ends(),
            Kind::RdmaWrite => self.has_immediate(),
            _ => false,
        }
    }
}

/// Reserved payload of a CNP (IBA Annex A17).
pub const CNP_PAYLOAD_LEN: usize = 16;

macro_rules! opcodes {
    ($( $code:literal $var:ident $name:literal $tr:ident $kind:ident $pos:ident [$($h:ident),*]; )+) => {
        /// BTH opcode. Every byte parses: codes outside the table are
        /// [`Opcode::Unknown`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Opcode {
            $( #[doc = $name] $var, )+
            /// A code the table does not list (RD, reserved, vendor).
            Unknown(u8),
        }

        impl Opcode {
            /// Every opcode of the table, in code order.
            pub const ALL: &'static [Opcode] = &[$(Opcode::$var),+];

            /// The table row, `None` for [`Opcode::Unknown`].
            pub const fn info(self) -> Option<&'static OpInfo> {
                match self {
                    $( Opcode::$var => Some(&OpInfo {
                        opcode: Opcode::$var,
                        name: $name,
                        transport: Transport::$tr,
                        kind: Kind::$kind,
                        position: Position::$pos,
                        headers: &[$(ExtHeader::$h),*],
                    }), )+
                    Opcode::Unknown(_) => None,
                }
            }

            /// The opcode for a code.
            pub const fn from_code(code: u8) -> Opcode {
                match code {
                    $( $code => Opcode::$var, )+
                    other => Opcode::Unknown(other),
                }
            }

            /// The code on the wire.
            pub const fn code(self) -> u8 {
                match self {
                    $( Opcode::$var => $code, )+
                    Opcode::Unknown(c) => c,
                }
            }
        }
    };
}

opcodes! {
    // code  variant                    name                                        transport kind position headers
    0x00 RcSendFirst                "RC SEND First"                                 Rc Send First [];
    0x01 RcSendMiddle               "RC SEND Middle"                                Rc Send Middle [];
    0x02 RcSendLast                 "RC SEND Last"                                  Rc Send Last [];
    0x03 RcSendLastImm              "RC SEND Last with Immediate"                   Rc Send Last [ImmDt];
    0x04 RcSendOnly                 "RC SEND Only"                                  Rc Send Only [];
    0x05 RcSendOnlyImm              "RC SEND Only with Immediate"                   Rc Send Only [ImmDt];
    0x06 RcWriteFirst               "RC RDMA WRITE First"                           Rc RdmaWrite First [Reth];
    0x07 RcWriteMiddle              "RC RDMA WRITE Middle"                          Rc RdmaWrite Middle [];
    0x08 RcWriteLast                "RC RDMA WRITE Last"                            Rc RdmaWrite Last [];
    0x09 RcWriteLastImm             "RC RDMA WRITE Last with Immediate"             Rc RdmaWrite Last [ImmDt];
    0x0A RcWriteOnly                "RC RDMA WRITE Only"                            Rc RdmaWrite Only [Reth];
    0x0B RcWriteOnlyImm             "RC RDMA WRITE Only with Immediate"             Rc RdmaWrite Only [Reth, ImmDt];
    0x0C RcReadRequest              "RC RDMA READ Request"                          Rc RdmaReadRequest Only [Reth];
    0x0D RcReadResponseFirst        "RC RDMA READ response First"                   Rc RdmaReadResponse First [Aeth];
    0x0E RcReadResponseMiddle       "RC RDMA READ response Middle"                  Rc RdmaReadResponse Middle [];
    0x0F RcReadResponseLast         "RC RDMA READ response Last"                    Rc RdmaReadResponse Last [Aeth];
    0x10 RcReadResponseOnly         "RC RDMA READ response Only"                    Rc RdmaReadResponse Only [Aeth];
    0x11 RcAcknowledge              "RC Acknowledge"                                Rc Acknowledge Only [Aeth];
    0x12 RcAtomicAcknowledge        "RC ATOMIC Acknowledge"                         Rc AtomicAcknowledge Only [Aeth, AtomicAckEth];
    0x13 RcCompareSwap              "RC CmpSwap"                                    Rc CompareSwap Only [AtomicEth];
    0x14 RcFetchAdd                 "RC FetchAdd"                                   Rc FetchAdd Only [AtomicEth];
    0x16 RcSendLastInv              "RC SEND Last with Invalidate"                  Rc Send Last [Ieth];
    0x17 RcSendOnlyInv              "RC SEND Only with Invalidate"                  Rc Send Only [Ieth];
    0x20 UcSendFirst                "UC SEND First"                                 Uc Send First [];
    0x21 UcSendMiddle               "UC SEND Middle"                                Uc Send Middle [];
    0x22 UcSendLast                 "UC SEND Last"                                  Uc Send Last [];
    0x23 UcSendLastImm              "UC SEND Last with Immediate"                   Uc Send Last [ImmDt];
    0x24 UcSendOnly                 "UC SEND Only"                                  Uc Send Only [];
    0x25 UcSendOnlyImm              "UC SEND Only with Immediate"                   Uc Send Only [ImmDt];
    0x26 UcWriteFirst               "UC RDMA WRITE First"                           Uc RdmaWrite First [Reth];
    0x27 UcWriteMiddle              "UC RDMA WRITE Middle"                          Uc RdmaWrite Middle [];
    0x28 UcWriteLast                "UC RDMA WRITE Last"                            Uc RdmaWrite Last [];
    0x29 UcWriteLastImm             "UC RDMA WRITE Last with Immediate"             Uc RdmaWrite Last [ImmDt];
    0x2A UcWriteOnly                "UC RDMA WRITE Only"                            Uc RdmaWrite Only [Reth];
    0x2B UcWriteOnlyImm             "UC RDMA WRITE Only with Immediate"             Uc RdmaWrite Only [Reth, ImmDt];
    0x64 UdSendOnly                 "UD SEND Only"                                  Ud Send Only [Deth];
    0x65 UdSendOnlyImm              "UD SEND Only with Immediate"                   Ud Send Only [Deth, ImmDt];
    0x81 Cnp                        "CNP"                                           Cnp Cnp Only [];
}

/// Slots of [`FIND`]: transport (4) x kind (9) x position (4) x
/// immediate x invalidate.
const FIND_SLOTS: usize = 4 * 9 * 4 * 2 * 2;
// The index arithmetic counts the variants; a new one must grow it.
const _: () = assert!(Transport::Cnp as usize == 3 && Kind::Cnp as usize == 8);
const _: () = assert!(Position::Only as usize == 3);

const fn find_slot(t: Transport, k: Kind, p: Position, imm: bool, inv: bool) -> usize {
    ((((t as usize) * 9 + k as usize) * 4 + p as usize) * 2 + imm as usize) * 2 + inv as usize
}

const fn has_header(headers: &[ExtHeader], h: ExtHeader) -> bool {
    let mut i = 0;
    while i < headers.len() {
        if headers[i] as u8 == h as u8 {
            return true;
        }
        i += 1;
    }
    false
}

/// [`Opcode::find`] as a table, built from the opcode table at compile
/// time: the code of each slot, or 0x100 for none. The requester looks an
/// opcode up for every packet it sends; a scan of the table was 3 % of
/// the send path's instructions.
static FIND: [u16; FIND_SLOTS] = {
    let mut t = [0x100u16; FIND_SLOTS];
    let mut i = 0;
    while i < Opcode::ALL.len() {
        if let Some(info) = Opcode::ALL[i].info() {
            let slot = find_slot(
                info.transport,
                info.kind,
                info.position,
                has_header(info.headers, ExtHeader::ImmDt),
                has_header(info.headers, ExtHeader::Ieth),
            );
            t[slot] = Opcode::ALL[i].code() as u16;
        }
        i += 1;
    }
    t
};

impl Opcode {
    /// The opcode with these properties, found in the table; `None` if the
    /// IBA defines no such opcode (e.g. a UD RDMA WRITE).
    pub fn find(
        transport: Transport,
        kind: Kind,
        position: Position,
        immediate: bool,
        invalidate: bool,
    ) -> Option<Opcode> {
        let code = FIND[find_slot(transport, kind, position, immediate, invalidate)];
        u8::try_from(code).ok().map(Opcode::from_code)
    }
}

impl From<u8> for Opcode {
    fn from(code: u8) -> Opcode {
        Opcode::from_code(code)
    }
}

impl From<Opcode> for u8 {
    fn from(op: Opcode) -> u8 {
        op.code()
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.info() {
            Some(i) => f.write_str(i.name),
            None => write!(f, "opcode {:#04x} (unknown)", self.code()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_and_unknowns_stay_unknown() {
        let mut known = 0;
        for code in 0..=255u8 {
            let op = Opcode::from(code);
            assert_eq!(u8::from(op), code);
            if op.info().is_some() {
                known += 1;
            } else {
                assert_eq!(op, Opcode::Unknown(code));
            }
        }
        // RC 23 (0x00-0x14, 0x16, 0x17), UC 12, UD 2, CNP 1.
        assert_eq!(known, 38);
        assert_eq!(Opcode::ALL.len(), 38);
    }

    /// The transport column agrees with the top three bits of the code
    /// (IBA 9.2 table 38: 000 RC, 001 UC, 011 UD; Annex A17: 100 CNP).
    #[test]
    fn transport_column_matches_code_bits() {
        for op in Opcode::ALL {
            let i = op.info().unwrap();
            let t = match op.code() >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                3 => Transport::Ud,
                4 => Transport::Cnp,
                _ => panic!("{op}: code outside RC/UC/UD/CNP"),
            };
            assert_eq!(i.transport, t, "{op}");
            assert_eq!(i.opcode, *op);
            assert!(i.name.starts_with(match t {
                Transport::Rc => "RC ",
                Transport::Uc => "UC ",
                Transport::Ud => "UD ",
                Transport::Cnp => "CNP",
            }));
        }
    }

    /// The header column agrees with the rules of IBA 9.3 stated
    /// independently: RETH on the first packet of a WRITE and on READ
    /// requests; AETH on responses other than READ middle; DETH exactly on
    /// UD; ImmDt last when present; names mention immediate/invalidate
    /// exactly when the header is there.
    #[test]
    fn header_column_obeys_iba_rules() {
        for op in Opcode::ALL {
            let i = op.info().unwrap();
            let reth = (i.kind == Kind::RdmaWrite && i.position.starts())
                || i.kind == Kind::RdmaReadRequest;
            assert_eq!(i.has(ExtHeader::Reth), reth, "{op} RETH");
            let aeth = i.is_response()
                && !(i.kind == Kind::RdmaReadResponse && i.position == Position::Middle);
            assert_eq!(i.has(ExtHeader::Aeth), aeth, "{op} AETH");
            assert_eq!(
                i.has(ExtHeader::Deth),
                i.transport == Transport::Ud,
                "{op} DETH"
            );
            assert_eq!(i.has(ExtHeader::AtomicEth), i.is_atomic(), "{op} AtomicETH");
            assert_eq!(
                i.has(ExtHeader::AtomicAckEth),
                i.kind == Kind::AtomicAcknowledge
            );
            assert_eq!(i.has_immediate(), i.name.contains("with Immediate"), "{op}");
            assert_eq!(
                i.has_invalidate(),
                i.name.contains("with Invalidate"),
                "{op}"
            );
            if i.has_immediate() || i.has_invalidate() {
                assert!(
                    i.position.ends(),
                    "{op}: ImmDt/IETH only on the last packet"
                );
                assert!(matches!(
                    i.headers.last(),
                    Some(ExtHeader::ImmDt | ExtHeader::Ieth)
                ));
            }
        }
    }

    #[test]
    fn find_agrees_with_a_scan_of_the_table_everywhere() {
        use Kind::*;
        let kinds = [
            Send,
            RdmaWrite,
            RdmaReadRequest,
            RdmaReadResponse,
            Acknowledge,
            AtomicAcknowledge,
            CompareSwap,
            FetchAdd,
            Kind::Cnp,
        ];
        let mut found = 0;
        for t in [Transport::Rc, Transport::Uc, Transport::Ud, Transport::Cnp] {
            for k in kinds {
                for p in [
                    Position::First,
                    Position::Middle,
                    Position::Last,
                    Position::Only,
                ] {
                    for (imm, inv) in [(false, false), (true, false), (false, true), (true, true)] {
                        let scan = Opcode::ALL.iter().copied().find(|op| {
                            let i = op.info().unwrap();
                            i.transport == t
                                && i.kind == k
                                && i.position == p
                                && i.has_immediate() == imm
                                && i.has_invalidate() == inv
                        });
                        assert_eq!(Opcode::find(t, k, p, imm, inv), scan, "{t:?} {k:?} {p:?}");
                        found += usize::from(scan.is_some());
                    }
                }
            }
        }
        assert_eq!(found, Opcode::ALL.len(), "every opcode has its own slot");
    }

    #[test]
    fn find_inverts_the_table() {
        for op in Opcode::ALL {
            let i = op.info().unwrap();
            assert_eq!(
                Opcode::find(
                    i.transport,
                    i.kind,
                    i.position,
                    i.has_immediate(),
                    i.has_invalidate()
                ),
                Some(*op)
            );
        }
        assert_eq!(
            Opcode::find(Transport::Ud, Kind::RdmaWrite, Position::Only, false, false),
            None
        );
        assert_eq!(
            Opcode::find(Transport::Uc, Kind::Send, Position::Only, false, true),
            None
        );
    }

    #[test]
    fn derived_facts_for_a_few_rows() {
        let i = Opcode::RcWriteOnlyImm.info().unwrap();
        assert_eq!(i.header_len(), 12 + 16 + 4);
        assert_eq!(i.ack_class(), AckClass::Ack);
        assert!(i.consumes_rwqe() && i.completes_rwqe());
        let i = Opcode::RcSendMiddle.info().unwrap();
        assert_eq!(i.payload_rule(), PayloadRule::FullMtu);
        assert!(!i.consumes_rwqe() && !i.completes_rwqe());
        assert!(Opcode::RcSendFirst.info().unwrap().consumes_rwqe());
        assert!(!Opcode::RcWriteFirst.info().unwrap().consumes_rwqe());
        assert_eq!(
            Opcode::RcReadRequest.info().unwrap().ack_class(),
            AckClass::ReadResponse
        );
        assert_eq!(
            Opcode::RcFetchAdd.info().unwrap().ack_class(),
            AckClass::AtomicAck
        );
        assert_eq!(
            Opcode::UcSendOnly.info().unwrap().ack_class(),
            AckClass::None
        );
        assert_eq!(
            Opcode::RcAtomicAcknowledge.info().unwrap().header_len(),
            12 + 4 + 8
        );
        assert_eq!(
            Opcode::UdSendOnlyImm.info().unwrap().header_len(),
            12 + 8 + 4
        );
        assert_eq!(
            Opcode::Cnp.info().unwrap().payload_rule(),
            PayloadRule::Fixed(16)
        );
        assert_eq!(Opcode::RcAcknowledge.to_string(), "RC Acknowledge");
        assert_eq!(Opcode::from(0x15).to_string(), "opcode 0x15 (unknown)");
    }

    #[test]
    fn payload_rules() {
        assert_eq!(PayloadRule::None.check(0, 0, None), Ok(()));
        assert!(PayloadRule::None.check(4, 0, None).is_err());
        assert_eq!(PayloadRule::FullMtu.check(1024, 0, Some(1024)), Ok(()));
        assert!(PayloadRule::FullMtu.check(1020, 0, Some(1024)).is_err());
        assert!(PayloadRule::FullMtu.check(1023, 1, None).is_err());
        assert!(PayloadRule::UpToMtuNonEmpty.check(0, 0, None).is_err());
        assert_eq!(PayloadRule::UpToMtuNonEmpty.check(1, 3, Some(256)), Ok(()));
        assert!(
            PayloadRule::UpToMtu.check(1, 2, None).is_err(),
            "misaligned"
        );
        assert!(PayloadRule::UpToMtu.check(0, 4, None).is_err());
        assert!(PayloadRule::UpToMtu.check(260, 0, Some(256)).is_err());
        assert_eq!(PayloadRule::UpToMtu.check(0, 0, Some(256)), Ok(()));
        assert!(PayloadRule::Fixed(16).check(12, 0, None).is_err());
    }

    #[test]
    fn positions() {
        assert_eq!(Position::of(0, 1), Position::Only);
        assert_eq!(Position::of(0, 3), Position::First);
        assert_eq!(Position::of(1, 3), Position::Middle);
        assert_eq!(Position::of(2, 3), Position::Last);
        assert!(Position::First.starts() && !Position::First.ends());
    }
}
