//! srptd's config parser: every key, every refusal and its words.

use super::*;

fn parse(s: &str) -> Result<Config, ConfigError> {
    Config::parse(s, Path::new("t.toml"))
}

const GOOD: &str = r#"
[target]
ip = "127.0.0.3"
rdma_cm_port = 5556

[[device]]
name = "disk0"
handler = "ram"
size = "16M"

[[device]]
name = "disk1"
handler = "vdisk_nullio"
size = "1G"
block_size = 4096

[[lun]]
lun = 0
device = "disk0"

[[group]]
name = "hosts"
initiators = ["0x0000000000000000000000000000aa01", "0xbb*"]
lun = [{ lun = 3, device = "disk1" }]
"#;

#[test]
fn good_file_parses_and_round_trips() {
    let c = parse(GOOD).unwrap();
    assert_eq!(*c.target().ip.get_ref(), IpAddr::from([127, 0, 0, 3]));
    assert_eq!(*c.target().srp_max_req_size.get_ref(), 8260);
    assert_eq!(c.devices.len(), 2);
    assert_eq!(*c.devices[1].handler.get_ref(), Handler::NullIo);
    assert_eq!(c.groups[0].initiators.len(), 2);
    let again = parse(&c.to_toml()).unwrap();
    assert_eq!(again.to_toml(), c.to_toml());
    assert_eq!(*again.groups[0].luns[0].lun.get_ref(), 3);
}

#[test]
fn pkey_lists_the_partitions_served() {
    let served = |v: &str| {
        parse(&format!("[target]\npkey = {v}\n"))
            .unwrap()
            .target()
            .pkey
            .get_ref()
            .pkeys()
            .unwrap()
    };
    assert_eq!(served("\"all\""), vec![]);
    assert_eq!(served("0x8010"), vec![rdma_types::Pkey(0x8010)]);
    let two = vec![rdma_types::Pkey(0x0010), rdma_types::Pkey(0xffff)];
    assert_eq!(served("[0x0010, 0xffff]"), two);
    assert_eq!(
        parse("").unwrap().target().pkey.get_ref().pkeys().unwrap(),
        vec![]
    );
    let c = parse("[target]\npkey = [0x0010, 0xffff]\n").unwrap();
    let again = parse(&c.to_toml()).unwrap();
    assert_eq!(again.target().pkey.get_ref().pkeys().unwrap(), two);
}

fn err_of(s: &str) -> ConfigError {
    parse(s).expect_err("must be refused")
}

#[test]
fn metrics_is_a_port_on_loopback_or_an_address() {
    let local: MetricsAddr = "9100".parse().unwrap();
    assert_eq!(local.0, "127.0.0.1:9100".parse().unwrap());
    let any: MetricsAddr = "0.0.0.0:9100".parse().unwrap();
    assert_eq!(any.0, "0.0.0.0:9100".parse().unwrap());
    let e = "localhost".parse::<MetricsAddr>().unwrap_err().to_string();
    assert!(e.contains("neither a port"), "{e}");
    for (text, want) in [
        ("metrics = 9101", "127.0.0.1:9101"),
        ("metrics = \"9102\"", "127.0.0.1:9102"),
        ("metrics = \"[::1]:9103\"", "[::1]:9103"),
    ] {
        #[derive(Deserialize)]
        struct T {
            metrics: MetricsAddr,
        }
        let t: T = toml::from_str(text).unwrap();
        assert_eq!(t.metrics.0, want.parse().unwrap(), "{text}");
        assert_eq!(String::from(t.metrics), want);
    }
    #[derive(Deserialize, Debug)]
    #[allow(dead_code)]
    struct T {
        metrics: MetricsAddr,
    }
    assert!(toml::from_str::<T>("metrics = 70000").is_err());
    assert!(toml::from_str::<T>("metrics = \"nowhere\"").is_err());
}

#[test]
fn errors_name_line_and_key() {
    let e = err_of(&GOOD.replace("device = \"disk0\"", "device = \"disk9\""));
    assert_eq!((e.line, e.key.as_str()), (19, "lun[0].device"));
    assert!(e.message.contains("no device named `disk9`"), "{e}");
    assert!(
        e.to_string().starts_with("t.toml:19: lun[0].device: "),
        "{e}"
    );

    let e = err_of(&GOOD.replace("\"ram\"", "\"vdisk_tape\""));
    assert_eq!(e.line, 8, "{e}");
    assert!(e.message.contains("vdisk_tape"), "{e}");

    let e = err_of(&GOOD.replace("size = \"16M\"", "size = \"16Q\""));
    assert_eq!((e.line, e.key.as_str()), (9, "device[0].size"));

    let e = err_of(&GOOD.replace("\"0xbb*\"", "\"bb\""));
    assert_eq!(e.key, "group[0].initiators[1]");
    assert_eq!(e.line, 23);

    let e = err_of(&GOOD.replace("rdma_cm_port = 5556", "rdma_cm_prot = 5556"));
    assert_eq!(e.line, 4);
    assert!(e.message.contains("rdma_cm_prot"), "{e}");

    let e = err_of(&GOOD.replace("block_size = 4096", "block_size = 1000"));
    assert_eq!((e.line, e.key.as_str()), (15, "device[1].block_size"));

    let e = err_of(&GOOD.replace("lun = 3,", "lun = 99999,"));
    assert!(e.message.contains("16383"), "{e}");

    let e = err_of(&format!(
        "{GOOD}\n[[device]]\nname = \"disk0\"\nhandler = \"ram\"\nsize = \"1M\"\n"
    ));
    assert!(e.message.contains("defined twice"), "{e}");

    let e = err_of("[target]\npkey = 0x8000\n");
    assert_eq!((e.line, e.key.as_str()), (2, "target.pkey"));
    assert!(e.message.contains("0x8000"), "{e}");
    let e = err_of("[target]\npkey = \"some\"\n");
    assert_eq!((e.line, e.key.as_str()), (2, "target.pkey"));
    let e = err_of("[target]\npkey = []\n");
    assert!(e.message.contains("empty"), "{e}");

    let e = err_of("[target]\nip = \"127.0.0.1\"\nmtu = 1500\n");
    assert_eq!((e.line, e.key.as_str()), (3, "target.mtu"));
    assert!(
        e.message.contains("`1500` is not an IB path MTU") && e.message.contains("1024"),
        "{e}"
    );
    assert_eq!(
        parse("[target]\nmtu = \"1k\"\n").unwrap().targets[0]
            .mtu
            .get_ref(),
        &1024
    );

    let e = err_of("[target]\nsrpt_sq_size = 1\n");
    assert!(e.message.contains("outside"), "{e}");

    let e = err_of("[[device]]\nname = \"f\"\nhandler = \"vdisk_fileio\"\n");
    assert!(e.message.contains("needs a filename"), "{e}");

    let e = err_of("[target\n");
    assert_eq!(e.line, 1, "{e}");
}

#[test]
fn shipped_example_is_valid() {
    let c = parse(include_str!("../../../../etc/srptd.toml")).unwrap();
    assert_eq!(c.devices.len(), 2);
    assert_eq!(c.groups[0].luns.len(), 2);
    // The example spells out the defaults, so it documents them.
    let (t, d) = (c.target(), TargetSection::default());
    let params = |t: &TargetSection| {
        [
            &t.srp_max_req_size,
            &t.srp_max_rsp_size,
            &t.srp_max_rdma_size,
            &t.srpt_srq_size,
            &t.srpt_sq_size,
        ]
        .map(|v| *v.get_ref())
    };
    assert_eq!(params(t), params(&d));
    assert_eq!(t.rdma_cm_port, d.rdma_cm_port);
}

#[test]
fn several_targets_parse_validate_and_round_trip() {
    let c = parse(include_str!("../../../../etc/srptd-two-ports.toml")).unwrap();
    assert_eq!(c.targets.len(), 2);
    let t = &c.targets[1];
    assert_eq!(*t.ip.get_ref(), IpAddr::from([127, 0, 0, 2]));
    assert_eq!((*t.rel_tgt_id.get_ref(), t.enabled), (2, false));
    assert_eq!(
        t.pkey.get_ref().pkeys().unwrap(),
        [rdma_types::Pkey(0x8010)]
    );
    // Defaults apply per target.
    assert_eq!(*t.srp_max_req_size.get_ref(), 8260);
    let text = c.to_toml();
    assert_eq!(text.matches("[[target]]").count(), 2, "{text}");
    let again = parse(&text).unwrap();
    assert_eq!(again.to_toml(), text);
    // One [[target]] is one target, written back as [target].
    let one = parse("[[target]]\nip = \"127.0.0.9\"\n").unwrap();
    assert_eq!(one.targets.len(), 1);
    assert!(one.to_toml().contains("[target]\n"), "{}", one.to_toml());
    // Errors in a later target name it and its line.
    let e = err_of(
        "[[target]]\nip = \"127.0.0.1\"\n[[target]]\nip = \"127.0.0.2\"\nsrpt_sq_size = 1\n",
    );
    assert_eq!(
        (e.line, e.key.as_str()),
        (5, "target[1].srpt_sq_size"),
        "{e}"
    );
    let e = err_of("target = []\n");
    assert!(e.message.contains("no target"), "{e}");
    let e = err_of("target = 5\n");
    assert!(e.message.contains("[[target]]"), "{e}");
    let e = err_of("[[target]]\nip = \"127.0.0.1\"\n[[target]]\nip = \"127.0.0.2\"\nrel_tgt_id = 2\ncontrol_socket = \"/x\"\n");
    assert_eq!(e.key, "target[1].control_socket", "{e}");
}

#[test]
fn fileio_options_belong_to_fileio() {
    let dev = |handler: &str, more: &str| {
        format!("[[device]]\nname = \"d\"\nhandler = \"{handler}\"\nfilename = \"/x\"\nsize = \"1M\"\n{more}")
    };
    let c = parse(&dev(
        "vdisk_fileio",
        "o_direct = true\nwrite_through = true\nrotational = true\n",
    ))
    .unwrap();
    let d = &c.devices[0];
    assert!(d.o_direct && d.write_through && d.rotational);
    let again = parse(&c.to_toml()).unwrap();
    assert!(again.devices[0].o_direct && again.devices[0].write_through);
    let d = &parse(&dev("vdisk_fileio", "")).unwrap().devices[0];
    assert!(
        !d.o_direct && !d.write_through && !d.rotational,
        "all off by default"
    );
    // removable and nv_cache too, but nv_cache contradicts write_through.
    let r = "[[device]]\nname = \"r\"\nhandler = \"ram\"\nsize = \"1M\"\nremovable = true\nnv_cache = true\n";
    let d = &parse(r).unwrap().devices[0];
    assert!(d.removable && d.nv_cache);
    assert!(!parse(&dev("vdisk_fileio", "")).unwrap().devices[0].nv_cache);
    let e = err_of(&dev(
        "vdisk_fileio",
        "nv_cache = true\nwrite_through = true\n",
    ));
    assert_eq!(e.key, "device[0].nv_cache", "{e}");
    assert!(e.message.contains("set one of them"), "{e}");
    // rotational suits every handler; the others are fileio's.
    let ram = "[[device]]\nname = \"r\"\nhandler = \"ram\"\nsize = \"1M\"\nrotational = true\n";
    assert!(parse(ram).unwrap().devices[0].rotational);
    for k in ["o_direct", "write_through"] {
        let e = err_of(&dev("vdisk_blockio", &format!("{k} = true\n")));
        assert_eq!(e.key, format!("device[0].{k}"), "{e}");
        assert!(e.message.contains("not vdisk_blockio"), "{e}");
    }
}

#[test]
fn srp_parameters_default_to_scst_or_a_documented_choice() {
    let t = parse("").unwrap().targets.remove(0);
    // As the SCST srpt README says.
    assert_eq!(*t.srp_max_rsp_size.get_ref(), 256);
    assert_eq!(*t.srp_max_rdma_size.get_ref(), 65536);
    assert_eq!(*t.srpt_srq_size.get_ref(), 4095);
    // Ours on purpose (field docs, README compatibility notes):
    // immediate data from Linux ib_srp, Linux's in-tree SQ size, and
    // RDMA CM on, which a RoCE port needs.
    assert_eq!(*t.srp_max_req_size.get_ref(), 8260);
    assert_eq!(*t.srpt_sq_size.get_ref(), 4096);
    assert_eq!(t.rdma_cm_port, 5555);
    // rdma_cm_port = 0 turns RDMA CM off, which is fine while IB CM
    // takes logins, and refused when nothing would.
    assert_eq!(
        parse("[target]\nrdma_cm_port = 0\n")
            .unwrap()
            .target()
            .rdma_cm_port,
        0
    );
    let e = err_of("[target]\nrdma_cm_port = 0\nib_cm = false\n");
    assert_eq!(e.key, "target.rdma_cm_port", "{e}");
    assert!(e.message.contains("no way to log in"), "{e}");
    // Below the SRP login request itself.
    let e = err_of("[target]\nsrp_max_req_size = 63\n");
    assert_eq!(
        (e.line, e.key.as_str()),
        (2, "target.srp_max_req_size"),
        "{e}"
    );
}

#[test]
fn fabric_key() {
    let c = parse("[target]\nfabric = \"ib\"\nsm_wait_ms = 500\n").unwrap();
    assert_eq!(c.target().fabric, rdma_access::subnet::Fabric::Ib);
    assert_eq!(*c.target().sm_wait_ms.get_ref(), 500);
    assert!(c.to_toml().contains("fabric = \"ib\""), "{}", c.to_toml());
    assert_eq!(
        parse("").unwrap().target().fabric,
        rdma_access::subnet::Fabric::Roce,
        "roce by default"
    );
    let e = err_of("[target]\nfabric = \"ethernet\"\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(
        e.message.contains("roce") && e.message.contains("ib"),
        "{e}"
    );
}

#[test]
fn sizes() {
    assert_eq!(parse_size("512").unwrap(), 512);
    assert_eq!(parse_size("64M").unwrap(), 64 << 20);
    assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
    assert!(parse_size("M").is_err());
    assert!(parse_size("99999999999999999999").is_err());
    assert!(parse_size("20000000T").is_err());
}

/// Every size and duration key takes a number, as it always did, or the
/// forms of the command lines (`rdma_types::units`).
#[test]
fn size_and_duration_keys_take_units() {
    let c = parse(
        "[target]\nsm_wait_ms = \"30s\"\nlogin_timeout_ms = \"1.5s\"\nkeepalive_ms = \"2m\"\n\
         srp_max_req_size = \"8K\"\nsrp_max_rsp_size = 512\nsrp_max_rdma_size = \"1M\"\n\
         [[device]]\nname = \"d\"\nhandler = \"ram\"\nsize = 67108864\nblock_size = \"4k\"\n",
    )
    .unwrap();
    let t = c.target();
    assert_eq!(*t.sm_wait_ms.get_ref(), 30_000);
    assert_eq!(*t.login_timeout_ms.get_ref(), 1500);
    assert_eq!(*t.keepalive_ms.get_ref(), 120_000);
    assert_eq!(*t.srp_max_req_size.get_ref(), 8192);
    assert_eq!(*t.srp_max_rsp_size.get_ref(), 512);
    assert_eq!(*t.srp_max_rdma_size.get_ref(), 1 << 20);
    assert_eq!(c.devices[0].size.as_ref().unwrap().get_ref(), "67108864");
    assert_eq!(*c.devices[0].block_size.get_ref(), 4096);
    // Plain numbers in strings count as the key always did.
    let c = parse("[target]\nkeepalive_ms = \"15000\"\n").unwrap();
    assert_eq!(*c.target().keepalive_ms.get_ref(), 15_000);
    // Written back as numbers, read back the same.
    let again = parse(&c.to_toml()).unwrap();
    assert_eq!(*again.target().keepalive_ms.get_ref(), 15_000);

    // Refusals name the line, the key, the value as written and the forms.
    let e = err_of("[target]\nenabled = true\nkeepalive_ms = \"15x\"\n");
    assert_eq!(e.line, 3, "{e}");
    assert!(
        e.message.contains("keepalive_ms: `15x` is not a duration")
            && e.message.contains("500ms, 30s, 2m"),
        "{e}"
    );
    let e = err_of("[target]\nsrp_max_rdma_size = \"64X\"\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(
        e.message.contains("srp_max_rdma_size: `64X` is not a size")
            && e.message.contains("4k, 64M, 1G"),
        "{e}"
    );
    let e = err_of("[target]\nsrp_max_rdma_size = \"8G\"\n");
    assert!(e.message.contains("more than 4294967295 bytes"), "{e}");
    let e = err_of("[target]\nsrp_max_rdma_size = 5000000000\n");
    assert!(e.message.contains("more than 4294967295 bytes"), "{e}");
    let e = err_of("[target]\nkeepalive_ms = -1\n");
    assert!(e.message.contains("-1 is negative"), "{e}");
    let e = err_of("[target]\nkeepalive_ms = 1.5\n");
    assert!(e.message.contains("a whole number or a string"), "{e}");
    let e = err_of("[[device]]\nname = \"d\"\nhandler = \"ram\"\nsize = \"1Q\"\n");
    assert_eq!((e.line, e.key.as_str()), (4, "device[0].size"), "{e}");
    assert!(e.message.contains("`1Q` is not a size"), "{e}");
    // Ranges still apply to values written with units.
    let e = err_of("[target]\nlogin_timeout_ms = \"2h\"\n");
    assert_eq!(e.key, "target.login_timeout_ms", "{e}");
}

#[test]
fn initiator_patterns() {
    assert!(check_initiator("0x0000000000000000000000000000aa01").is_ok());
    assert!(check_initiator("0xaa*").is_ok());
    assert!(check_initiator("0x*").is_ok());
    let refused = |s| check_initiator(s).unwrap_err().to_string();
    assert!(refused("0xaa").contains("32 hex digits"));
    assert!(refused("aa*").contains("0x"));
    assert!(check_initiator("0xZZ*").is_err());
    assert!(refused("0xAA*").contains("lower case"));
}

#[test]
fn pass_through_takes_an_sg_node_under_its_own_name_or_scsts() {
    let dev = |handler: &str, more: &str| {
        format!("[[device]]\nname = \"t\"\nhandler = \"{handler}\"\n{more}")
    };
    for name in ["pass-through", "dev_disk", "scst_disk"] {
        let c = parse(&dev(name, "filename = \"/dev/sg1\"\nusn = \"tape-7\"\n")).unwrap();
        assert_eq!(
            *c.devices[0].handler.get_ref(),
            Handler::PassThrough,
            "{name}"
        );
        // Written back under our name.
        assert!(
            c.to_toml().contains("handler = \"pass-through\""),
            "{}",
            c.to_toml()
        );
    }
    let e = err_of(&dev("pass-through", ""));
    assert_eq!((e.key.as_str(), e.line), ("device[0].filename", 3), "{e}");
    assert!(
        e.message.contains("/dev/sg1") && e.message.contains("lsscsi -g"),
        "{e}"
    );
    // The device has its own geometry and media: those keys are refused.
    for (k, v) in [
        ("size", "\"1G\""),
        ("block_size", "4096"),
        ("read_only", "true"),
        ("thin", "true"),
        ("rotational", "true"),
        ("removable", "true"),
        ("nv_cache", "true"),
    ] {
        let e = err_of(&dev(
            "pass-through",
            &format!("filename = \"/dev/sg1\"\n{k} = {v}\n"),
        ));
        assert_eq!(e.key, format!("device[0].{k}"), "{e}");
        assert!(e.message.contains("not a pass-through option"), "{e}");
        assert!(e.line > 0, "{e}");
    }
    for k in ["o_direct", "write_through"] {
        let e = err_of(&dev(
            "pass-through",
            &format!("filename = \"/dev/sg1\"\n{k} = true\n"),
        ));
        assert!(e.message.contains("not pass-through"), "{k}: {e}");
    }
}

#[test]
fn target_groups_parse_validate_and_round_trip() {
    let c = parse(include_str!("../../../../etc/srptd-alua.toml")).unwrap();
    let alua = c.alua();
    assert_eq!(alua.groups.len(), 2);
    assert_eq!(
        (
            alua.groups[0].id,
            alua.groups[0].state,
            alua.groups[0].preferred
        ),
        (1, scsi::AccessState::ActiveOptimized, true)
    );
    assert_eq!(alua.groups[1].state, scsi::AccessState::Standby);
    assert_eq!(alua.groups[1].ports, vec![2]);
    assert_eq!((alua.explicit, alua.transition_secs), (false, 10));
    let again = parse(&c.to_toml()).unwrap();
    assert_eq!(again.alua(), alua);
    // No groups: no ALUA, nothing written.
    let plain = parse(GOOD).unwrap();
    assert!(plain.alua().groups.is_empty());
    assert!(!plain.to_toml().contains("alua"), "{}", plain.to_toml());
}

#[test]
fn target_group_errors_name_line_and_key() {
    const TWO: &str = "[[target]]\nip = \"127.0.0.1\"\nrel_tgt_id = 1\n\
                       [[target]]\nip = \"127.0.0.2\"\nrel_tgt_id = 2\n";
    let group = |name: &str, id: &str, state: &str, targets: &str| {
        format!(
            "[[target_group]]\nname = \"{name}\"\ngroup_id = {id}\nstate = \"{state}\"\ntargets = {targets}\n"
        )
    };
    let ok2 = format!(
        "{TWO}{}{}",
        group("a", "1", "active", "[1]"),
        group("b", "2", "standby", "[2, 9]")
    );
    assert_eq!(parse(&ok2).unwrap().alua().groups[1].ports, vec![2, 9]);

    // A misspelt state: its line, its key, the words allowed.
    let e = err_of(&format!(
        "{TWO}{}{}",
        group("a", "1", "optimized", "[1]"),
        group("b", "2", "standby", "[2]")
    ));
    assert_eq!(
        (e.line, e.key.as_str()),
        (10, "target_group[0].state"),
        "{e}"
    );
    assert!(
        e.message.contains("`optimized`") && e.message.contains("nonoptimized"),
        "{e}"
    );
    // A port in two groups.
    let e = err_of(&format!(
        "{TWO}{}{}",
        group("a", "1", "active", "[1]"),
        group("b", "2", "standby", "[2, 1]")
    ));
    assert_eq!(
        (e.line, e.key.as_str()),
        (16, "target_group[1].targets[1]"),
        "{e}"
    );
    assert!(e.message.contains("target group `a` too"), "{e}");
    // The same group_id twice; group_id 0.
    let e = err_of(&format!(
        "{TWO}{}{}",
        group("a", "1", "active", "[1]"),
        group("b", "1", "standby", "[2]")
    ));
    assert_eq!(
        (e.line, e.key.as_str()),
        (14, "target_group[1].group_id"),
        "{e}"
    );
    let e = err_of(&format!(
        "{TWO}{}{}",
        group("a", "0", "active", "[1]"),
        group("b", "2", "standby", "[2]")
    ));
    assert_eq!(e.key, "target_group[0].group_id", "{e}");
    // A [[target]] in no group.
    let e = err_of(&format!("{TWO}{}", group("a", "1", "active", "[1]")));
    assert_eq!((e.line, e.key.as_str()), (6, "target[1].rel_tgt_id"), "{e}");
    assert!(e.message.contains("add 2 to a group's targets"), "{e}");
    // A group without ports; a duplicate name; an unknown key.
    let e = err_of(&format!("{TWO}{}", group("a", "1", "active", "[]")));
    assert_eq!(e.key, "target_group[0].targets", "{e}");
    let e = err_of(&format!(
        "{TWO}{}{}",
        group("a", "1", "active", "[1]"),
        group("a", "2", "standby", "[2]")
    ));
    assert!(e.message.contains("used twice"), "{e}");
    let e = err_of(&format!("{ok2}[alua]\nexplicitly = true\n"));
    assert!(e.message.contains("explicitly"), "{e}");
    // Explicit transitions without groups.
    let e = err_of("[alua]\nexplicit = true\n");
    assert_eq!(e.key, "alua.explicit", "{e}");
}

#[test]
fn drbd_keys_and_their_errors() {
    const BASE: &str = "[target]\nip = \"127.0.0.1\"\nrel_tgt_id = 1\n\
                        [[device]]\nname = \"r0\"\nhandler = \"vdisk_blockio\"\n\
                        filename = \"/dev/drbd0\"\ndrbd_minor = 0\n";
    let here = "[[target_group]]\nname = \"here\"\ngroup_id = 1\ntargets = [1]\nfollow = \"r0\"\n";
    let peer = "[[target_group]]\nname = \"peer\"\ngroup_id = 2\ntargets = [2]\nfollow = \"r0\"\n";
    let c = parse(&format!(
        "{BASE}{here}{peer}[drbd]\nstatus_file = \"/tmp/x\"\npoll_interval_ms = \"2s\"\n"
    ))
    .unwrap();
    assert_eq!(*c.devices[0].drbd_minor.as_ref().unwrap().get_ref(), 0);
    assert_eq!(*c.drbd.poll_interval_ms.get_ref(), 2000);
    assert_eq!(*c.drbd.drain_ms.get_ref(), 30_000);
    // Written back and read again the same (a followed group has no state).
    let again = parse(&c.to_toml()).unwrap();
    assert_eq!(again.drbd, c.drbd);
    assert!(again.target_groups[0].state.is_none(), "{}", c.to_toml());
    // Defaults are not written.
    let plain = parse(&format!("{BASE}{here}")).unwrap();
    assert!(!plain.to_toml().contains("[drbd]"), "{}", plain.to_toml());

    // follow naming a device without drbd_minor, or no device.
    let e = err_of(&format!("{}{here}", BASE.replace("drbd_minor = 0\n", "")));
    assert_eq!(
        (e.line, e.key.as_str()),
        (12, "target_group[0].follow"),
        "{e}"
    );
    assert!(e.message.contains("add drbd_minor = N"), "{e}");
    let e = err_of(&format!("{BASE}{}", here.replace("\"r0\"", "\"r9\"")));
    assert!(e.message.contains("no [[device]] named `r9`"), "{e}");
    // Neither state nor follow.
    let e = err_of(&format!(
        "{BASE}[[target_group]]\nname = \"x\"\ngroup_id = 1\ntargets = [1]\n"
    ));
    assert_eq!(e.key, "target_group[0].state", "{e}");
    assert!(e.message.contains("follow = \"DEVICE\""), "{e}");
    // A followed group of this host's port and the peer's.
    let e = err_of(&format!("{BASE}{}", here.replace("[1]", "[1, 2]")));
    assert!(e.message.contains("not both"), "{e}");
    // drbd_minor on a ram device; on a read_only one.
    let e = err_of("[[device]]\nname = \"m\"\nhandler = \"ram\"\nsize = \"1M\"\ndrbd_minor = 1\n");
    assert_eq!((e.line, e.key.as_str()), (5, "device[0].drbd_minor"), "{e}");
    assert!(e.message.contains("vdisk_blockio"), "{e}");
    let e = err_of(&format!("{BASE}read_only = true\n"));
    assert_eq!(e.key, "device[0].drbd_minor", "{e}");
    // A bad poll interval names its key.
    let e = err_of(&format!("{BASE}[drbd]\npoll_interval_ms = \"soon\"\n"));
    assert!(e.to_string().contains("poll_interval_ms"), "{e}");
}

#[test]
fn vcdrom_takes_an_image_or_none_and_refuses_geometry_keys() {
    let dev = |more: &str| format!("[[device]]\nname = \"cd\"\nhandler = \"vcdrom\"\n{more}");
    let c = parse(&dev("filename = \"/srv/iso/debian.iso\"\n")).unwrap();
    assert_eq!(*c.devices[0].handler.get_ref(), Handler::VCdrom);
    assert!(
        c.to_toml().contains("handler = \"vcdrom\""),
        "{}",
        c.to_toml()
    );
    // No filename: a drive with no disc. A CD-ROM is read-only and
    // removable anyway: saying so is accepted.
    parse(&dev("")).unwrap();
    parse(&dev("read_only = true\nremovable = true\n")).unwrap();
    for (k, v, line) in [
        ("size", "\"650M\"", 5),
        ("block_size", "2048", 5),
        // The device's name line: the key is what must go.
        ("thin", "true", 2),
        ("rotational", "true", 2),
        ("nv_cache", "true", 2),
    ] {
        let e = err_of(&dev(&format!("filename = \"/x.iso\"\n{k} = {v}\n")));
        assert_eq!(e.key, format!("device[0].{k}"), "{e}");
        assert!(
            e.message.contains("not a vcdrom option") || e.message.contains("not 512 or 4096"),
            "{e}"
        );
        assert_eq!(e.line, line, "{e}");
    }
    for k in ["o_direct", "write_through"] {
        let e = err_of(&dev(&format!("{k} = true\n")));
        assert!(e.message.contains("not vcdrom"), "{k}: {e}");
    }
}

#[test]
fn threads_num_is_a_devices_own_threads_up_to_a_bound() {
    let dev = |more: &str| {
        format!("[[device]]\nname = \"f\"\nhandler = \"vdisk_fileio\"\nfilename = \"/x\"\n{more}")
    };
    let c = parse(&dev("threads_num = 4\n")).unwrap();
    assert_eq!(
        c.devices[0].threads_num.as_ref().map(|n| *n.get_ref()),
        Some(4)
    );
    assert!(c.to_toml().contains("threads_num = 4"), "{}", c.to_toml());
    assert!(parse(&dev("")).unwrap().devices[0].threads_num.is_none());
    let e = err_of(&dev("threads_num = 65\n"));
    assert_eq!(
        (e.key.as_str(), e.line),
        ("device[0].threads_num", 5),
        "{e}"
    );
    assert!(e.message.contains("more than 64"), "{e}");
    // A value of the wrong type: the line and the value (serde's words).
    let e = err_of(&dev("threads_num = -1\n"));
    assert_eq!(e.line, 5, "{e}");
    assert!(e.message.contains("-1"), "{e}");
}

#[test]
fn threads_pool_type_takes_scsts_two_names() {
    let dev = |extra: &str| {
        format!(
            "[target]\nip = \"127.0.0.1\"\n[[device]]\nname = \"d\"\nhandler = \"ram\"\nsize = \"1M\"\nthreads_num = 2\n{extra}[[lun]]\nlun = 0\ndevice = \"d\"\n"
        )
    };
    for (text, want) in [
        (
            "threads_pool_type = \"shared\"\n",
            Some(ThreadsPoolType::Shared),
        ),
        (
            "threads_pool_type = \"per_initiator\"\n",
            Some(ThreadsPoolType::PerInitiator),
        ),
        ("", None),
    ] {
        let c = parse(&dev(text)).unwrap();
        assert_eq!(c.devices[0].threads_pool_type, want, "{text}");
        // Written back as read (absent stays absent).
        let again = parse(&c.to_toml()).unwrap();
        assert_eq!(again.devices[0].threads_pool_type, want, "{}", c.to_toml());
    }
    let e = err_of(&dev("threads_pool_type = \"per_session\"\n"));
    assert_eq!(
        (e.key.as_str(), e.line),
        ("device[0].threads_pool_type", 8),
        "{e}"
    );
    assert!(e.to_string().contains("per_initiator"), "{e}");
}

/// A value of the wrong type, which the parser reports by place only,
/// names its key too (read off the text: headers, `[[...]]` counted).
#[test]
fn a_value_of_the_wrong_type_names_its_key() {
    let text = "[target]\nip = \"127.0.0.1\"\n[[device]]\nname = \"a\"\nhandler = \"ram\"\nsize = \"1M\"\n\
                [[device]]\nname = \"b\"\nhandler = \"ram\"\nsize = \"1M\"\nread_only = \"yes\"\n\
                [[lun]]\nlun = 0\ndevice = \"a\"\n";
    let e = err_of(text);
    assert_eq!((e.key.as_str(), e.line), ("device[1].read_only", 11), "{e}");
    let e = err_of("[target]\nip = 7\n");
    assert_eq!(e.key, "target.ip", "{e}");
}

#[test]
fn an_iwarp_target_is_parsed_written_and_refused_with_what_it_cannot_go_with() {
    let c = parse("[target]\nip = \"127.0.0.3\"\niwarp = true\n").unwrap();
    assert!(*c.target().iwarp.get_ref());
    assert!(c.to_toml().contains("iwarp = true"), "{}", c.to_toml());
    // Off is the default, and not written.
    let c = parse("[target]\nip = \"127.0.0.3\"\n").unwrap();
    assert!(!*c.target().iwarp.get_ref());
    assert!(!c.to_toml().contains("iwarp"), "{}", c.to_toml());
    for (extra, words) in [
        (
            "device = \"siw0\"",
            "iwarp and device both choose the port's NIC",
        ),
        ("fabric = \"ib\"", "remove fabric = \"ib\" (or iwarp)"),
        ("rdma_cm_port = 0", "set rdma_cm_port"),
    ] {
        let e = err_of(&format!("[target]\niwarp = true\n{extra}\n"));
        assert_eq!((e.line, e.key.as_str()), (2, "target.iwarp"), "{e}");
        assert!(e.message.contains(words), "{e}");
    }
}
