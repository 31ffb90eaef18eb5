//! A subnet manager (SM) with its subnet administrator (SA), for the
//! managed-subnet (`ib`) mode of DESIGN.md: what opensm is to an
//! InfiniBand fabric, for a fabric of soft RoCE ports.
//!
//! [`SubnetManager`] is sans-IO: MADs and time in, MADs out. The driver
//! (the simulator in tests; a port's QP0 and QP1 for a real run) carries
//! them. Every sweep walks each configured node with directed-route SMPs
//! of hop count 0 (our nodes reach each other directly over UDP: there
//! are no switches to route through): NodeInfo, NodeDescription and
//! PortInfo, then Set(PortInfo) with the node's LID (kept per port GUID
//! across sweeps) and master SM LID, moving the port INIT -> ARMED ->
//! ACTIVE, then Set(P_KeyTable) from the partitions. A port that finishes
//! comes into service (trap 64 to subscribers); one that stops answering
//! after the resends goes out of service (trap 65). Sweeps repeat every
//! `sweep_interval`, so a port that leaves and returns is noticed both
//! ways.
//!
//! The SA answers Get and GetTable of PathRecord (component-mask matching
//! on SGID, DGID, SLID, DLID and P_Key; paths only inside a shared
//! partition where one end is a full member; one path per pair, since
//! there is one), NodeRecord and PortInfoRecord (with capability-mask
//! matching: every requested bit set, as srp_daemon asks for
//! IsDeviceManagementSupported), and Set(InformInfo) to subscribe to or
//! unsubscribe from traps; notices go out as Report MADs, resent until a
//! ReportResp. GetTable responses are RMPP-segmented, sent as an active
//! sender without windowing (all segments at once; a lost one costs the
//! requester a timeout and a new query). A Get with nothing to return
//! answers ERR_NO_RECORDS; unknown attributes "method/attribute
//! unsupported".
//!
//! Not done: ServiceRecord registration, multicast, SM-to-SM handover
//! (SMInfo polling), M_Key protection, and several paths per pair.

pub mod fuzz;
pub mod partitions;
pub mod port;
pub mod sim;
pub mod sm;

pub use partitions::{parse as parse_partitions, Partition, PartitionError};
pub use sm::{Outgoing, SmConfig, SmEvent, SmStats, SubnetManager};
