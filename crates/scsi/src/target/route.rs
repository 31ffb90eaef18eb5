//! Routes: what a nexus's commands to one logical unit need of the
//! target's shared state (the LUN maps, the port's group state, the
//! nexus's unit attentions), found once under the state lock and kept by
//! the transport while nothing there changes. With a current route a
//! READ or WRITE runs without taking that lock; with any other command,
//! or a stale route, the core looks everything up as before.

use super::*;

/// A transport's memo of how one I_T nexus reaches one LUN. Keep one per
/// channel (a channel's nexus never changes) and hand it to
/// [`Target::route`] before each command, then to [`Target::submit_routed`].
/// It knows its nexus by the nexus's hash only (a route carries no
/// names): never hand it another nexus's commands.
#[derive(Clone, Default)]
pub struct Route {
    /// The LUN and nexus (its hash) the route was made for.
    lun: Option<Lun>,
    nexus: u64,
    /// [`Target::epoch`] when it was made.
    epoch: u64,
    dev: Option<Arc<Device>>,
    /// A READ or WRITE needs nothing more of the state: the unit is an
    /// emulated one, no unit attention waits for the nexus, and the
    /// port's group state admits every command.
    plain: bool,
}

impl Route {
    /// A route the core never takes as current: it looks `dev` up again
    /// as [`Target::submit_to`] does.
    pub fn unrouted(dev: Option<Arc<Device>>) -> Route {
        Route {
            dev,
            ..Route::default()
        }
    }

    /// The device the LUN reached when the route was made.
    pub fn device(&self) -> Option<&Arc<Device>> {
        self.dev.as_ref()
    }

    /// Whether it was made for `nexus` and `lun` and nothing it depends
    /// on changed since.
    fn current_for(&self, target: &Target, nexus: &Nexus, lun: Lun) -> bool {
        self.lun == Some(lun) && self.nexus == nexus.hash && self.epoch == target.epoch.load(SeqCst)
    }

    /// [`Route::current_for`], and a READ or WRITE may use it.
    pub(super) fn plain_for(&self, target: &Target, nexus: &Nexus, lun: Lun) -> bool {
        self.plain && self.current_for(target, nexus, lun)
    }
}

impl Target {
    /// Brings `route` up to date for `nexus` and `lun` (a look under the
    /// state lock only when something changed since it was made, or it
    /// was made for another LUN) and gives the device the LUN reaches.
    pub fn route<'r>(
        &self,
        nexus: &Nexus,
        lun: Lun,
        route: &'r mut Route,
    ) -> Option<&'r Arc<Device>> {
        if !route.current_for(self, nexus, lun) {
            // Read without moving the count: a nexus seen for the first
            // time gets its power-on unit attention here, which only this
            // route (stale until the attention is taken) depends on.
            let mut st = self.lock_to_read();
            let epoch = self.epoch.load(SeqCst);
            let dev = st
                .set_for(&nexus.initiator, &nexus.target_port)
                .get(&lun)
                .cloned();
            let emulated = dev.as_ref().is_some_and(|d| {
                d.pass_through_handler().is_none() && d.vcdrom_handler().is_none()
            });
            let plain = emulated && {
                let rtpi = st.port_id(&nexus.target_port);
                st.alua.group_of(rtpi).is_none_or(|g| g.state.is_active())
                    && st.ua_mut(nexus, lun).is_empty()
            };
            *route = Route {
                lun: Some(lun),
                nexus: nexus.hash,
                epoch,
                dev,
                plain,
            };
        }
        route.dev.as_ref()
    }
}
