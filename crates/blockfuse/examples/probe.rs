use std::sync::Arc;
fn main() {
    let dir = std::env::temp_dir().join("bf-probe");
    std::fs::create_dir_all(&dir).unwrap();
    let mut o = blockfuse::Options::default();
    o.threads = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(4);
    eprintln!("mounting");
    let m = blockfuse::mount(&dir, vec![("lun0".into(), Arc::new(blockload::RamDevice::new(512, 64)) as _)], o).unwrap();
    eprintln!("mounted");
    let md = std::fs::metadata(m.path_of("lun0").unwrap()).unwrap();
    eprintln!("len {}", md.len());
    m.unmount().unwrap();
    eprintln!("unmounted");
}
