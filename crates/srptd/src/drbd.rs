//! DRBD roles as srptd follows them: what DRBD 8.4's status file
//! (`/proc/drbd`) says of each minor, and the decision, per device,
//! whether its store should be open. Sans-IO: the daemon reads the file
//! and opens and closes stores ([`crate::daemon`]); this module only
//! reads text and keeps state.
//!
//! DRBD 8.4 lets nobody open a Secondary's device (`EMEDIUMTYPE`, or
//! `EROFS` for writing), and refuses to demote a device someone holds
//! open. So srptd opens the store when the host becomes Primary and must
//! have closed it before `drbdadm secondary` can succeed: a demotion is
//! told (`srptadm set-role DEVICE secondary`, the OCF agent's demote)
//! rather than seen. The status file is read for the changes a cluster
//! manager or an operator makes with `drbdadm` alone: the follower acts on
//! a change of what the file says (an edge), not on what it keeps saying,
//! so a device released by `set-role secondary` is not opened again while
//! the file still says Primary for the moments before `drbdadm secondary`.

/// A minor's role on this host (the part of `ro:` before the `/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Primary,
    Secondary,
    /// Not configured (`cs:Unconfigured`, no line, no status file), or a
    /// role word this reader does not know: the device is not opened.
    Unknown,
}

impl Role {
    /// DRBD's word, or `unknown`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Secondary => "secondary",
            Role::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The role of `minor` in DRBD 8.4's `/proc/drbd` text: its line
/// ` N: cs:... ro:Primary/Secondary ds:...`. Anything else (another
/// format, a cut line, garbage) is [`Role::Unknown`], never a panic.
pub fn role_of(status: &str, minor: u32) -> Role {
    for line in status.lines() {
        let Some((n, rest)) = line.trim_start().split_once(':') else {
            continue;
        };
        if n.parse::<u32>().ok() != Some(minor) {
            continue;
        }
        let ro = rest
            .split_whitespace()
            .find_map(|w| w.strip_prefix("ro:"))
            .and_then(|r| r.split('/').next());
        return match ro {
            Some("Primary") => Role::Primary,
            Some("Secondary") => Role::Secondary,
            _ => Role::Unknown,
        };
    }
    Role::Unknown
}

/// What the daemon should do to a device's store now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Open it, then make the groups that follow it active.
    Open,
    /// Make the groups transitioning, close it (draining in-flight
    /// commands), then standby.
    Close,
}

/// One device's follower: the last role the status file said, the role
/// srptd was last told or saw, and whether the store is open.
#[derive(Debug, Clone)]
pub struct Follower {
    seen: Option<Role>,
    wanted: Role,
    open: bool,
}

impl Follower {
    /// A follower of a closed store; nothing wanted yet.
    pub fn new() -> Follower {
        Follower {
            seen: None,
            wanted: Role::Unknown,
            open: false,
        }
    }

    /// The status file says `role`: a change from what it said before
    /// (or the first reading) becomes the wanted role.
    pub fn observe(&mut self, role: Role) {
        if self.seen != Some(role) {
            self.seen = Some(role);
            self.wanted = role;
        }
    }

    /// `srptadm set-role`: the wanted role, until the file changes.
    pub fn tell(&mut self, role: Role) {
        self.wanted = role;
    }

    /// What to do to reach the wanted role, if anything.
    pub fn next(&self) -> Option<Action> {
        match (self.wanted == Role::Primary, self.open) {
            (true, false) => Some(Action::Open),
            (false, true) => Some(Action::Close),
            _ => None,
        }
    }

    /// The store is open (`true`) or closed now.
    pub fn done(&mut self, open: bool) {
        self.open = open;
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    pub fn wanted(&self) -> Role {
        self.wanted
    }

    /// What the status file said last (`None`: never read).
    pub fn seen(&self) -> Option<Role> {
        self.seen
    }
}

impl Default for Follower {
    fn default() -> Self {
        Follower::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `/proc/drbd` of a DRBD 8.4.11 kernel module, two resources (the
    /// format of drbd_proc.c: version lines, then ` N: cs:.. ro:.. ds:..`
    /// and a counters line per minor).
    const STATUS: &str = "\
version: 8.4.11 (api:1/proto:86-101)
srcversion: 211FB288A383ED945B83420

 0: cs:Connected ro:Primary/Secondary ds:UpToDate/UpToDate C r-----
    ns:1048576 nr:0 dw:1048576 dr:2098 al:16 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:0
 1: cs:WFConnection ro:Secondary/Unknown ds:UpToDate/DUnknown C r-----
    ns:0 nr:0 dw:0 dr:0 al:0 bm:0 lo:0 pe:0 ua:0 ap:0 ep:1 wo:f oos:0
 2: cs:Unconfigured
12: cs:StandAlone ro:Primary/Unknown ds:UpToDate/DUnknown   r-----
";

    #[test]
    fn roles_are_read_per_minor() {
        assert_eq!(role_of(STATUS, 0), Role::Primary);
        assert_eq!(role_of(STATUS, 1), Role::Secondary);
        assert_eq!(role_of(STATUS, 2), Role::Unknown);
        assert_eq!(role_of(STATUS, 12), Role::Primary);
        // Minor 3 has no line; "1" must not match "12".
        assert_eq!(role_of(STATUS, 3), Role::Unknown);
        assert_eq!(role_of("", 0), Role::Unknown);
        assert_eq!(role_of(" 0: cs:Connected ro:", 0), Role::Unknown);
        assert_eq!(role_of(" 0: ro:Weird/Primary", 0), Role::Unknown);
        assert_eq!(role_of("\u{0}\u{ff}: :::", 0), Role::Unknown);
    }

    #[test]
    fn the_follower_acts_on_changes_of_the_file_and_on_being_told() {
        let mut f = Follower::new();
        f.observe(Role::Secondary);
        assert_eq!(f.next(), None);
        // drbdadm primary: the file changes, the store opens.
        f.observe(Role::Primary);
        assert_eq!(f.next(), Some(Action::Open));
        f.done(true);
        assert_eq!(f.next(), None);
        // The OCF agent's demote: told first, while the file still
        // says Primary; reading it again does not open the store anew.
        f.tell(Role::Secondary);
        assert_eq!(f.next(), Some(Action::Close));
        f.done(false);
        f.observe(Role::Primary);
        assert_eq!(f.next(), None);
        // Then drbdadm secondary, and later primary again.
        f.observe(Role::Secondary);
        assert_eq!(f.next(), None);
        f.observe(Role::Primary);
        assert_eq!(f.next(), Some(Action::Open));
        // An open that failed leaves the action due: it is tried again.
        assert_eq!(f.next(), Some(Action::Open));
        f.done(true);
        // A device that went away (module unloaded) is closed.
        f.observe(Role::Unknown);
        assert_eq!(f.next(), Some(Action::Close));
        // Told primary without the file: open.
        let mut g = Follower::new();
        g.tell(Role::Primary);
        assert_eq!(g.next(), Some(Action::Open));
    }
}
