//! Typed resource handles: index + generation so stale handles are caught.

/// Raw handle value shared by every handle type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Handle {
    /// Slot index in the provider's table.
    pub index: u32,
    /// Generation of the slot when the object was created.
    pub generation: u32,
}

macro_rules! handle {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub Handle);
        impl From<Handle> for $name {
            fn from(h: Handle) -> Self { $name(h) }
        }
    )*};
}

handle! {
    /// An open channel adapter.
    CaHandle;
    /// A protection domain (implies its CA).
    PdHandle;
    /// A completion queue (created in a PD).
    CqHandle;
    /// A queue pair.
    QpHandle;
    /// A shared receive queue.
    SrqHandle;
    /// A memory region.
    MrHandle;
    /// A memory window.
    MwHandle;
    /// An address handle.
    AhHandle;
}
