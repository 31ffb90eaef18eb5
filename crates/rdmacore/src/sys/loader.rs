//! libibverbs opened with `dlopen` and its functions found with `dlsym`.
//!
//! Plain `dlsym` returns a symbol's default version (`@@` in `objdump -T`):
//! `IBVERBS_1.1` for every verb that also has a 1.0 compatibility version
//! (`ibv_get_device_list`, `ibv_open_device`, `ibv_query_port`,
//! `ibv_create_qp`, ...), `IBVERBS_1.0` for the comp channel functions,
//! `IBVERBS_1.11` for `_ibv_query_gid_table`. Those are the versions a
//! program compiled against today's `verbs.h` links to.
//!
//! `ibv_query_port` is a macro and an inline function in `verbs.h`: it
//! calls the driver's extended `query_port` when the context has one, else
//! the exported `ibv_query_port@@IBVERBS_1.1`. We call the exported
//! function, which does the same dispatch itself and fills the fields of
//! `struct ibv_port_attr` up to `link_layer` (all this crate reads).

use super::raw::*;
use libloading::Library;
use std::os::raw::{c_char, c_int, c_uint, c_void};

/// The library name `RdmaCore::new` loads: the SONAME of every rdma-core
/// since 2016 (ABI 1).
pub const LIBIBVERBS: &str = "libibverbs.so.1";

/// Why libibverbs could not be used. One line each, naming what to install.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// The library is not installed (or not where it was looked for).
    #[error(
        "cannot load {library}: {reason}; install rdma-core's verbs library \
         (Debian/Ubuntu: apt-get install libibverbs1 ibverbs-providers; \
         Fedora/RHEL: dnf install libibverbs rdma-core)"
    )]
    Missing {
        /// What was loaded.
        library: String,
        /// The loader's words.
        reason: String,
    },
    /// The library is too old or not libibverbs.
    #[error("{library} has no {symbol} ({reason}): rdma-core 17 or later is needed")]
    Symbol {
        /// What was loaded.
        library: String,
        /// The missing function.
        symbol: &'static str,
        /// The loader's words.
        reason: String,
    },
}

macro_rules! fns {
    ($( $field:ident = $sym:literal : fn($($arg:ty),*) -> $ret:ty; )*) => {
        /// The exported functions used here (default symbol versions).
        pub(crate) struct Fns {
            $( pub $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
            /// `_ibv_query_gid_table@@IBVERBS_1.11` (rdma-core 32+), with GID
            /// types; older libraries are read with `ibv_query_gid`.
            pub query_gid_table: Option<
                unsafe extern "C" fn(*mut ibv_context, *mut ibv_gid_entry, usize, u32, usize) -> isize,
            >,
        }

        impl Fns {
            fn load(lib: &Library, library: &str) -> Result<Fns, LoadError> {
                Ok(Fns {
                    $( $field: {
                        // SAFETY: the symbol is libibverbs' function of
                        // that name, whose C prototype (verbs.h) is the
                        // declared type; the pointer is used only while
                        // `Verbs` keeps the library loaded.
                        let s = unsafe {
                            lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                                concat!($sym, "\0").as_bytes(),
                            )
                        };
                        *s.map_err(|e| LoadError::Symbol {
                            library: library.to_string(),
                            symbol: $sym,
                            reason: e.to_string(),
                        })?
                    }, )*
                    // SAFETY: as above; verbs.h declares
                    // `ssize_t _ibv_query_gid_table(struct ibv_context *,
                    // struct ibv_gid_entry *, size_t, uint32_t, size_t)`.
                    query_gid_table: unsafe {
                        lib.get::<unsafe extern "C" fn(
                            *mut ibv_context, *mut ibv_gid_entry, usize, u32, usize,
                        ) -> isize>(b"_ibv_query_gid_table\0")
                    }
                    .ok()
                    .map(|s| *s),
                })
            }
        }
    };
}

fns! {
    get_device_list = "ibv_get_device_list": fn(*mut c_int) -> *mut *mut ibv_device;
    free_device_list = "ibv_free_device_list": fn(*mut *mut ibv_device) -> ();
    get_device_name = "ibv_get_device_name": fn(*mut ibv_device) -> *const c_char;
    get_device_guid = "ibv_get_device_guid": fn(*mut ibv_device) -> u64;
    open_device = "ibv_open_device": fn(*mut ibv_device) -> *mut ibv_context;
    close_device = "ibv_close_device": fn(*mut ibv_context) -> c_int;
    query_device = "ibv_query_device": fn(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    query_port = "ibv_query_port": fn(*mut ibv_context, u8, *mut ibv_port_attr) -> c_int;
    query_gid = "ibv_query_gid": fn(*mut ibv_context, u8, c_int, *mut ibv_gid) -> c_int;
    query_pkey = "ibv_query_pkey": fn(*mut ibv_context, u8, c_int, *mut u16) -> c_int;
    alloc_pd = "ibv_alloc_pd": fn(*mut ibv_context) -> *mut ibv_pd;
    dealloc_pd = "ibv_dealloc_pd": fn(*mut ibv_pd) -> c_int;
    create_comp_channel = "ibv_create_comp_channel": fn(*mut ibv_context) -> *mut ibv_comp_channel;
    destroy_comp_channel = "ibv_destroy_comp_channel": fn(*mut ibv_comp_channel) -> c_int;
    create_cq = "ibv_create_cq": fn(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
    destroy_cq = "ibv_destroy_cq": fn(*mut ibv_cq) -> c_int;
    get_cq_event = "ibv_get_cq_event": fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
    ack_cq_events = "ibv_ack_cq_events": fn(*mut ibv_cq, c_uint) -> ();
    create_srq = "ibv_create_srq": fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq;
    modify_srq = "ibv_modify_srq": fn(*mut ibv_srq, *mut ibv_srq_attr, c_int) -> c_int;
    query_srq = "ibv_query_srq": fn(*mut ibv_srq, *mut ibv_srq_attr) -> c_int;
    destroy_srq = "ibv_destroy_srq": fn(*mut ibv_srq) -> c_int;
    create_qp = "ibv_create_qp": fn(*mut ibv_pd, *mut ibv_qp_init_attr) -> *mut ibv_qp;
    modify_qp = "ibv_modify_qp": fn(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
    query_qp = "ibv_query_qp": fn(*mut ibv_qp, *mut ibv_qp_attr, c_int, *mut ibv_qp_init_attr) -> c_int;
    destroy_qp = "ibv_destroy_qp": fn(*mut ibv_qp) -> c_int;
    create_ah = "ibv_create_ah": fn(*mut ibv_pd, *mut ibv_ah_attr) -> *mut ibv_ah;
    destroy_ah = "ibv_destroy_ah": fn(*mut ibv_ah) -> c_int;
    reg_mr = "ibv_reg_mr": fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr;
    dereg_mr = "ibv_dereg_mr": fn(*mut ibv_mr) -> c_int;
    get_async_event = "ibv_get_async_event": fn(*mut ibv_context, *mut ibv_async_event) -> c_int;
    ack_async_event = "ibv_ack_async_event": fn(*mut ibv_async_event) -> ();
}

/// The loaded library and its functions. Every object made through it
/// holds an `Arc<Verbs>`, so the library stays mapped while any lives.
pub(crate) struct Verbs {
    pub(crate) f: Fns,
    /// The name or path it was loaded from.
    pub(crate) library: String,
    // Last: the function pointers above are only valid while it is loaded.
    _lib: Library,
}

impl Verbs {
    /// Loads `library` (a SONAME looked up the way `dlopen` does, or a
    /// path) and every function this crate calls.
    pub(crate) fn load(library: &str) -> Result<Verbs, LoadError> {
        // SAFETY: loading libibverbs runs its ELF constructors, which only
        // initialise the library's own state (no other code of ours runs
        // then); any other library given here is the caller's choice, as
        // with LD_PRELOAD.
        let lib = unsafe { Library::new(library) }.map_err(|e| LoadError::Missing {
            library: library.to_string(),
            reason: e.to_string(),
        })?;
        let f = Fns::load(&lib, library)?;
        Ok(Verbs {
            f,
            library: library.to_string(),
            _lib: lib,
        })
    }
}
