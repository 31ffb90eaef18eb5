//! Sans-IO SRP target channel (work in progress).
