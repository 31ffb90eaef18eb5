//! The soft RoCE NIC's options: what used to come from environment
//! variables read inside the provider, now given to
//! [`SoftRoce::with_options`]. Binaries map the variables onto them with
//! [`NicOptions::from_env`]; the provider reads no environment itself.

use super::*;
use std::ffi::OsString;

/// The environment variable [`NicOptions::from_env`] maps onto
/// [`NicOptions::follow_link`] (`0`, `off`, `no` or `false`: off).
pub const FOLLOW_LINK_ENV: &str = "SOFTROCE_FOLLOW_LINK";

/// The environment variable [`NicOptions::from_env`] maps onto
/// [`NicOptions::faults`] (a [`FaultConfig::parse`] spec, e.g.
/// `loss=0.01,seed=3`; unset or empty: none).
pub const FAULTS_ENV: &str = "SOFTROCE_FAULTS";

/// How every CA of a [`SoftRoce`] provider runs.
#[derive(Debug, Clone, PartialEq)]
pub struct NicOptions {
    /// UDP segmentation (GSO) of runs of equal-size packets to one peer,
    /// and receive coalescing (GRO), where the kernel can
    /// (`softroce::NodeConfig::gso` and `gro`). Default on; off for A/B
    /// measurements or a peer path that mishandles it.
    pub gso: bool,
    /// A CA's port follows the link under its address, as rxe's follows
    /// its netdev (`softroce::link`): DOWN with a port error when the
    /// interface loses carrier or is set down, ACTIVE again when it
    /// returns. Default on; off, only the transport's retries find a dead
    /// link (to measure how long that takes).
    pub follow_link: bool,
    /// Faults on the send path of every CA that has none of its own
    /// ([`SoftRoce::set_faults`]), taken when the CA is first opened.
    /// Default none.
    pub faults: Option<FaultConfig>,
}

impl Default for NicOptions {
    fn default() -> Self {
        NicOptions {
            gso: true,
            follow_link: true,
            faults: None,
        }
    }
}

/// An environment variable [`NicOptions::from_env`] cannot map.
#[derive(Debug, Clone, PartialEq)]
pub enum NicEnvError {
    /// `SOFTROCE_FAULTS` holds a spec the fault injector cannot take.
    Faults(rdma_sim::FaultSpecError),
}

impl std::fmt::Display for NicEnvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NicEnvError::Faults(e) => write!(f, "{FAULTS_ENV}: {e}"),
        }
    }
}

impl std::error::Error for NicEnvError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            NicEnvError::Faults(e) => Some(e),
        }
    }
}

impl NicOptions {
    /// For binaries: the options as the environment variables give them,
    /// the defaults where unset. `SOFTROCE_GSO=0` turns GSO and GRO off
    /// ([`softroce::GSO_ENV`]), `SOFTROCE_FOLLOW_LINK=0` (or `off`, `no`,
    /// `false`) link following ([`FOLLOW_LINK_ENV`]), and
    /// `SOFTROCE_FAULTS=loss=0.01,seed=3` injects faults on every CA
    /// without its own ([`FAULTS_ENV`]).
    ///
    /// # Errors
    /// `SOFTROCE_FAULTS` is not a spec [`FaultConfig::parse`] takes (the
    /// message names the variable and the key at fault).
    pub fn from_env() -> std::result::Result<NicOptions, NicEnvError> {
        NicOptions::from_vars(|name| std::env::var_os(name))
    }

    /// [`NicOptions::from_env`] over the variables `var` gives.
    fn from_vars(
        var: impl Fn(&str) -> Option<OsString>,
    ) -> std::result::Result<NicOptions, NicEnvError> {
        let text = |name| var(name).and_then(|v| v.into_string().ok());
        Ok(NicOptions {
            gso: softroce::gso_from_var(var(softroce::GSO_ENV).as_deref()),
            follow_link: !text(FOLLOW_LINK_ENV)
                .is_some_and(|v| matches!(v.trim(), "0" | "off" | "no" | "false")),
            faults: match text(FAULTS_ENV) {
                Some(spec) if !spec.trim().is_empty() => {
                    Some(FaultConfig::parse(&spec).map_err(NicEnvError::Faults)?)
                }
                _ => None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(set: &[(&str, &str)]) -> std::result::Result<NicOptions, NicEnvError> {
        let set: Vec<(String, String)> = set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        NicOptions::from_vars(move |name| {
            set.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| OsString::from(v))
        })
    }

    #[test]
    fn unset_variables_give_the_defaults() {
        assert_eq!(vars(&[]).unwrap(), NicOptions::default());
        let d = NicOptions::default();
        assert!(d.gso && d.follow_link && d.faults.is_none());
        // An empty or blank fault spec is no faults, as before.
        assert_eq!(vars(&[("SOFTROCE_FAULTS", " ")]).unwrap().faults, None);
    }

    #[test]
    fn each_variable_maps_onto_its_option() {
        let o = vars(&[
            ("SOFTROCE_GSO", "0"),
            ("SOFTROCE_FOLLOW_LINK", "off"),
            ("SOFTROCE_FAULTS", "loss=0.02,seed=11"),
        ])
        .unwrap();
        assert!(!o.gso);
        assert!(!o.follow_link);
        assert_eq!(
            o.faults,
            Some(FaultConfig::parse("loss=0.02,seed=11").unwrap())
        );
        // Only `0` turns GSO off; follow-link takes the usual words.
        assert!(vars(&[("SOFTROCE_GSO", "1")]).unwrap().gso);
        assert!(vars(&[("SOFTROCE_GSO", "off")]).unwrap().gso);
        for off in ["0", "no", "false", " 0 "] {
            assert!(!vars(&[("SOFTROCE_FOLLOW_LINK", off)]).unwrap().follow_link);
        }
        assert!(vars(&[("SOFTROCE_FOLLOW_LINK", "1")]).unwrap().follow_link);
    }

    #[test]
    fn a_bad_fault_spec_is_an_error_naming_the_variable() {
        let e = vars(&[("SOFTROCE_FAULTS", "loss=2")]).unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("SOFTROCE_FAULTS: ") && m.contains("'loss' must be within 0..=1"),
            "{m}"
        );
    }
}
