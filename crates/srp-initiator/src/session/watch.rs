//! Port events for whoever retries a login: [`PortWatch`].

use super::*;

/// The port events of one port, through an open of the CA of its own (so
/// it outlives every session on the port), closed on drop: how a remote
/// port whose login found the link down learns that it is back (the
/// soft RoCE port follows its interface's carrier, as rxe does).
pub struct PortWatch {
    pub(super) provider: Arc<dyn Provider>,
    pub(super) ca: CaHandle,
}

pub(super) struct WatchEvents {
    pub(super) port: PortNum,
    pub(super) on_active: Box<dyn Fn() + Send + Sync>,
}

impl EventHandler for WatchEvents {
    fn on_completion(&self, _cq_ctx: u64) {}
    fn on_async_event(&self, event: verbs::AsyncEvent) {
        if event.kind == verbs::AsyncEventKind::PortActive
            && event.port.is_none_or(|p| p == self.port)
        {
            (self.on_active)();
        }
    }
}

impl PortWatch {
    /// Calls `on_active` (on the provider's event thread, never under a
    /// provider lock) each time `port` of CA `guid` becomes ACTIVE.
    ///
    /// # Errors
    /// The CA cannot be opened.
    pub fn open(
        provider: Arc<dyn Provider>,
        guid: Guid,
        port: PortNum,
        on_active: Box<dyn Fn() + Send + Sync>,
    ) -> Result<PortWatch, SessionError> {
        let ca = provider
            .open_ca(guid, 0, Arc::new(WatchEvents { port, on_active }))
            .map_err(verbs_err("open CA for port events"))?;
        Ok(PortWatch { provider, ca })
    }
}

impl Drop for PortWatch {
    fn drop(&mut self) {
        let _ = self.provider.close_ca(self.ca);
    }
}
