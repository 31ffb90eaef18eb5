//! Sans-IO SRP initiator channel (work in progress).
