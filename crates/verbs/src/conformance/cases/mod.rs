//! The cases, one function each, by area.

mod memory;
mod objects;
mod port;
mod qp_types;
mod rc;

pub use memory::*;
pub use objects::*;
pub use port::*;
pub use qp_types::*;
pub use rc::*;
