//! `--device NAME[:PORT]`: an rdma-core device and port as a user names
//! it on a command line or in a config file.

/// A device and port (`rxe0`, `mlx5_0:2`; port 1 when none is named).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSpec {
    /// The kernel's device name.
    pub name: String,
    /// The port (1-based).
    pub port: u8,
}

impl std::str::FromStr for DeviceSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<DeviceSpec, String> {
        let (name, port) = match s.rsplit_once(':') {
            Some((n, p)) => {
                let port = p.parse::<u8>().ok().filter(|p| *p >= 1).ok_or_else(|| {
                    format!("{s:?}: the port after ':' must be a number from 1 to 255")
                })?;
                (n, port)
            }
            None => (s, 1),
        };
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
        if !valid {
            return Err(format!(
                "{s:?} is not an RDMA device name: give one `ibv_devices` or `rdma link` lists, \
                 as NAME or NAME:PORT (rxe0, mlx5_0:1)"
            ));
        }
        Ok(DeviceSpec {
            name: name.to_string(),
            port,
        })
    }
}

impl std::fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.name, self.port)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_takes_port_1_and_a_port_after_a_colon() {
        assert_eq!(
            "rxe0".parse::<DeviceSpec>(),
            Ok(DeviceSpec {
                name: "rxe0".into(),
                port: 1
            })
        );
        assert_eq!("mlx5_0:2".parse::<DeviceSpec>().map(|d| d.port), Ok(2));
        assert_eq!(
            "mlx5_0:2".parse::<DeviceSpec>().unwrap().to_string(),
            "mlx5_0:2"
        );
    }

    #[test]
    fn bad_names_and_ports_say_what_is_wanted() {
        for bad in ["", ":1", "rxe0:0", "rxe0:x", "rxe 0", "rxe0:256"] {
            let e = bad.parse::<DeviceSpec>().unwrap_err();
            assert!(
                e.contains("NAME:PORT") || e.contains("from 1 to 255"),
                "{bad}: {e}"
            );
        }
    }
}
