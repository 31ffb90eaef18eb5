//! `srptd --check`'s preflight of a vcdrom device: it opens the image as a
//! start does, and an image it cannot use is refused with file, line and
//! key (and what to do).

use srptd::config::Config;
use std::path::{Path, PathBuf};

struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("srptd-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A config with one vcdrom device (`filename` line `image`, or none) at
/// LUN 0, written to `dir/srptd.toml`, parsed from there.
fn config(dir: &Path, image: Option<&Path>) -> (Config, PathBuf) {
    let file = dir.join("srptd.toml");
    let filename = image.map_or(String::new(), |p| {
        format!("filename = \"{}\"\n", p.display())
    });
    let text = format!(
        "[target]\nip = \"127.129.29.1\"\ncontrol_socket = \"{}\"\n\n\
         [[device]]\nname = \"cd0\"\nhandler = \"vcdrom\"\n{filename}\n\
         [[lun]]\nlun = 0\ndevice = \"cd0\"\n",
        dir.join("ctl.sock").display()
    );
    std::fs::write(&file, text).unwrap();
    (Config::load(&file).unwrap(), file)
}

#[test]
fn check_opens_the_image_and_names_file_line_and_key_when_it_cannot() {
    let dir = Dir::new("vcd-check");
    let iso = dir.0.join("disc.iso");
    std::fs::write(&iso, vec![7u8; 4 * 2048]).unwrap();
    let (cfg, _) = config(&dir.0, Some(&iso));
    srptd::daemon::preflight(&cfg, true).expect("a whole image passes");
    let (cfg, _) = config(&dir.0, None);
    srptd::daemon::preflight(&cfg, true).expect("no disc passes");

    let odd = dir.0.join("odd.iso");
    std::fs::write(&odd, vec![0u8; 3000]).unwrap();
    let absent = dir.0.join("absent.iso");
    for (image, words) in [
        (&absent, "remove `filename` for a drive with no disc"),
        (&odd, "not a whole number of 2048-byte CD blocks"),
        (&dir.0, "is not a regular file"),
    ] {
        let (cfg, file) = config(&dir.0, Some(image));
        let e = srptd::daemon::preflight(&cfg, true).unwrap_err();
        let shown = e.to_string();
        assert_eq!(e.key, "device[0].filename", "{shown}");
        assert_eq!(e.line, 8, "the filename line: {shown}");
        assert!(shown.contains(&file.display().to_string()), "{shown}");
        assert!(shown.contains(words), "{shown}");
    }
}
