//! Round trips, and what a reader refuses.

use super::*;

fn round<T: Wire + PartialEq + core::fmt::Debug>(v: T) {
    let mut e = Enc::default();
    v.put(&mut e);
    assert_eq!(decode::<T>(&e.0).unwrap(), v);
}

#[test]
fn every_message_kind_round_trips() {
    let h = Handle {
        index: 7,
        generation: 0x5a5a,
    };
    let mut wr = SendWr::new(
        9,
        SendOpcode::RdmaWrite,
        vec![Sge {
            addr: 0x7f00_0000_1000,
            length: 4096,
            lkey: Lkey(0x1234),
        }],
    );
    wr.remote = RemoteAddr {
        addr: 0x1000,
        rkey: Rkey(77),
    };
    wr.ud = Some(UdDest {
        ah: AhHandle(h),
        remote_qpn: Qpn::from_bits(0x11),
        remote_qkey: Qkey(0x8000_0000),
    });
    wr.pkey_index = Some(3);
    round(Request::PostSend {
        qp: QpHandle(h),
        wrs: vec![wr.clone(), wr],
    });
    round(Request::ModifyQp {
        qp: QpHandle(h),
        attr: QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AhAttr::roce(Gid([1; 16]))),
            path_mtu: Some(Mtu::Mtu1024),
            rq_psn: Some(Psn::new(0xab_cdef)),
            access: Some(AccessFlags::REMOTE_READ),
            path_mig_state: Some(MigState::Rearm),
            ..Default::default()
        },
    });
    round(Request::Hello { version: VERSION });
    round(Request::ListCas {});
    round(Request::AddNic {
        ip: "127.27.0.9".parse().unwrap(),
    });
    round(Request::AddNic {
        ip: "fd00::27".parse().unwrap(),
    });
    round(Request::AddNicOn {
        ip: "127.27.0.9".parse().unwrap(),
        ib: true,
    });
    round(Request::GsiRegister {
        qp: QpHandle(h),
        class: 0x06,
        version: 1,
        methods: vec![0x01, 0x02],
        serve: true,
    });
    round(Request::GsiSend {
        qp: QpHandle(h),
        dgid: Gid([7; 16]),
        pkey_index: 2,
        mad: vec![0xa5; 256],
    });
    round(Event::Mad {
        ca: CaHandle(h),
        qp: QpHandle(h),
        sgid: Gid([9; 16]),
        pkey_index: 1,
        mad: vec![0x5a; 256],
    });
    let mut wc = WorkCompletion::new(1, WcStatus::RemAccessErr, WcOpcode::RecvRdmaWithImm, 5);
    wc.wc_flags = WcFlags::GRH | WcFlags::WITH_IMM;
    round::<Answer>(Ok(Reply::Wcs { wcs: vec![wc; 3] }));
    round::<Answer>(Err(VerbsError::BadWr {
        index: 2,
        cause: Box::new(VerbsError::Busy("mr has windows")),
    }));
    round::<Answer>(Err(VerbsError::MissingAttribute {
        attr: "av",
        from: QpState::Init,
        to: QpState::Rtr,
    }));
    round(Event::Async {
        ca: CaHandle(h),
        event: AsyncEvent {
            kind: AsyncEventKind::PortDown,
            ctx: 0,
            port: Some(PortNum(1)),
        },
    });
}

/// The frame header as the module docs draw it, byte by byte.
#[test]
fn a_frame_is_length_kind_sequence_body() {
    let f = frame(Kind::Request, 0x0102_0304, &Request::Hello { version: 1 });
    assert_eq!(
        f,
        [
            10, 0, 0, 0, // length of the rest
            1, // request
            4, 3, 2, 1, // sequence number
            0, // Hello
            1, 0, 0, 0, // version 1
        ]
    );
    let (kind, seq, body) = split(&f[4..]).unwrap();
    assert_eq!((kind, seq), (Kind::Request, 0x0102_0304));
    assert_eq!(
        decode::<Request>(body).unwrap(),
        Request::Hello { version: 1 }
    );
}

#[test]
fn malformed_bodies_are_refused_not_misread() {
    assert_eq!(
        decode::<Request>(&[200]),
        Err(ProtoError::UnknownTag {
            what: "Request",
            tag: 200
        })
    );
    assert_eq!(
        decode::<Request>(&[0, 1, 0]),
        Err(ProtoError::Truncated("u32"))
    );
    assert_eq!(
        decode::<Request>(&[0, 1, 0, 0, 0, 9]),
        Err(ProtoError::Trailing(1))
    );
    // A list count far beyond the bytes: refused before allocating.
    assert_eq!(
        decode::<Vec<u64>>(&[0xff, 0xff, 0xff, 0xff]),
        Err(ProtoError::Truncated("list"))
    );
    // Values out of their range.
    assert_eq!(
        decode::<AccessFlags>(&[0, 1, 0, 0]),
        Err(ProtoError::BadValue("AccessFlags"))
    );
    assert_eq!(decode::<bool>(&[2]), Err(ProtoError::BadValue("bool")));
    assert_eq!(decode::<Mtu>(&[9]), Err(ProtoError::BadValue("Mtu")));
    assert!(split(&[9, 0, 0, 0, 0]).is_err());
}
