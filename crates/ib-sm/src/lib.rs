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
//! across sweeps) and master SM LID, moving the port INIT -> ARMED, then
//! Set(P_KeyTable) from the partitions, then ACTIVE (as opensm, so a port
//! is never ACTIVE without its partitions; an ACTIVE port gets its table
//! again each sweep). A port that finishes
//! comes into service (trap 64 to subscribers); one that stops answering
//! after the resends goes out of service (trap 65). Sweeps repeat every
//! `sweep_interval`, so a port that leaves and returns is noticed both
//! ways.
//!
//! LID Mask Control (`SmConfig::lmc`, `ibsm run --lmc N`, opensm's `lmc`):
//! every port the SM configures gets PortInfo:LMC N and 2^N LIDs, its
//! base LID aligned to 2^N (IBA 7.11.1); a LID a port already holds is
//! kept when it is aligned and its range free, else the port gets a fresh
//! range. Soft RoCE reaches a port by GID, so a LID only names a port in
//! the SM's and SA's records: the SA finds a port by any LID of its range
//! and its records show the base LID (as opensm's do). The SM's own port
//! keeps one LID.
//!
//! The SA answers Get and GetTable of PathRecord (component-mask matching
//! on SGID, DGID, SLID, DLID and P_Key; paths only inside a shared
//! partition where one end is a full member). Between two ports there is
//! a path per (SLID, DLID) pair of their ranges, listed in opensm's
//! order: first the pairs at the same offset from each base (base to
//! base, base+1 to base+1, ...; Preference 0), then the others,
//! source-major (Preference 2). A Get gets the first; NumbPath in the
//! mask limits a GetTable to that many per pair; without it a GetTable
//! gets every pair up to `MAX_PATHS_PER_PAIR` (256: all of them up to
//! LMC 4); an SLID or DLID in the mask fixes that end to that LID. A
//! client takes the paths in that order and falls back to the next when
//! a connection fails (srpd does); over soft RoCE they all reach the
//! port by its GID, so LMC gives the fallback's retries, not another
//! route. It
//! answers NodeRecord and PortInfoRecord too (with capability-mask
//! matching: every requested bit set, as srp_daemon asks for
//! IsDeviceManagementSupported), and Set(InformInfo) to subscribe to or
//! unsubscribe from traps; notices go out as Report MADs, resent until a
//! ReportResp. GetTable responses are RMPP-segmented, sent as an active
//! sender without windowing (all segments at once; a lost one costs the
//! requester a timeout and a new query). A Get with nothing to return
//! answers ERR_NO_RECORDS; unknown attributes "method/attribute
//! unsupported". The SA runs on the master only: a standby or
//! discovering SM drops SA MADs unanswered (counted), as opensm does, so
//! clients keep asking until they find the master. The SA header's
//! SM_Key is zero (an ordinary client) or the SM's `sm_key` (a trusted
//! client, which alone sees the ports' M_Keys in PortInfoRecords: others
//! get them zeroed); any other key is dropped unanswered and counted
//! (IBA C15-0.1.5), as opensm does.
//!
//! M_Key (IBA 14.2.4): with `SmConfig::mkey` set, every Set(PortInfo)
//! gives the port that key, `mkey_protect` and `mkey_lease` (keeping the
//! port's M_KeyViolations), and every SMP to a port carries the key the SM
//! holds for it: its own, or one the port's PortInfo showed (protect level
//! 0, or after the lease ran out: a new SM takes over a fabric whose old
//! master died holding another key; `SmEvent::MkeyLearned`). A port whose
//! PortInfo hides the key from ours (level 1), or that answers our Gets
//! and drops our Sets, is logged (`SmEvent::MkeyRefused`) and left alone;
//! at level 2 a wrong key gets no answer at all, so such a port just
//! never comes up. Trap 256 from a port's SMA (someone tried a wrong key)
//! is repressed, logged (`SmEvent::BadMkey`) and forwarded to
//! subscribers. The SM never keys its own port (a master it stands by
//! for may).
//!
//! SM to SM (IBA 14.4): the SM's own port answers SMPs (its SMA says
//! IsSM) and SMInfo Get/Set (GUID, SM_Key, ActCount, Priority, SMState).
//! An SM starts DISCOVERING: its first sweep only reads, and asks SMInfo
//! of every port that says IsSM. Then it follows a MASTER it found, or
//! else an SM that outranks it (higher priority, then lower GUID), as
//! STANDBY; or it is MASTER and sweeps again at once, configuring. A
//! standby does not sweep: it polls the master's SMInfo every
//! `poll_interval` (ActCount, the count of SMPs the master sent, shows it
//! working); when a poll goes unanswered after the resends it takes over:
//! MASTER, a sweep at once. A master keeps the LID a port already has
//! when no other port holds it, so a new master keeps the old one's LIDs
//! (read from PortInfo), and ports get the new master SM LID; new LIDs are
//! given only once every port of the sweep has said which LID it holds.
//! The SM's LID is its own port's: the configured one at first, or the
//! one a master gave it while standby (a master moves a standby whose
//! configured LID a node already holds), and it keeps that LID when it
//! becomes master. A master that finds a STANDBY SM outranking it hands
//! over (Set SMInfo HANDOVER) and becomes its standby; the new master
//! acknowledges (Set SMInfo ACKNOWLEDGE, resent until answered, carrying
//! the standby SMInfo the HANDOVER found, as opensm's check wants) and
//! the old one logs it (`SmEvent::HandoverAcknowledged`). An SMInfo Set
//! is taken only with the SM_Key and from a sender whose SMInfo state may
//! send it (HANDOVER, DISABLE, STANDBY, DISCOVER from a master;
//! ACKNOWLEDGE from a standby); others get "invalid attribute value" and
//! are counted. Of two masters, the lesser yields. A master polls each standby's SMInfo every
//! `poll_interval` (IBA 14.4.1) and logs one that stops answering
//! (`SmEvent::StandbyLost`) or appears (`SmEvent::StandbyFound`: found by
//! a sweep, or at once when an SM it does not know asks for its SMInfo).
//! SA state (InformInfo subscriptions, ServiceRecords) is not carried
//! over: clients re-register on the port's SM change event (see
//! `rdma_access::resource::PnpEvent::SmChange`), as Linux clients and
//! srp_daemon do on IB_EVENT_SM_CHANGE.
//!
//! Traps from SMAs: trap 144 (CapabilityMask changed) is repressed
//! (TrapRepress, also to a resend) and forwarded once as a Report to its
//! subscribers, with the sender's GID as issuer; the SA's PortInfoRecords
//! show the new mask at once. Trap 257 (a port dropped a packet for its
//! P_Key) is repressed, counted, logged with the offender's GID, QPs and
//! P_Key (`SmEvent::BadPkey`, naming the offending port when its GID is
//! one of the subnet's) and forwarded the same way.
//!
//! Partitions (`SmConfig::partitions`, opensm's partitions file): each
//! port's P_Key table has the default partition 0x7fff in entry 0, the
//! port a full member if the file says so and a limited one otherwise
//! (opensm's rule: QP1 sends its requests with entry 0, and they must
//! reach the SA), then the other partitions that name the port; a Set of
//! PortInfo keeps the port's P_KeyViolations.
//!
//! Layering: the SM reaches a port only through the verbs
//! ([`port::SmPort`] over any provider with a QP0), and a node's port is
//! the access layer's (`rdma_access::IbNode`, its SMA setting the port
//! with `Provider::modify_port`), so this crate depends on no provider;
//! the `ibsm`, `ibstat` and `saquery` binaries, which pick soft RoCE, are
//! the `ib-tools` crate.
//!
//! Not done: multicast, LMC on the SM's own port, M_Key on the SM's own
//! port, SM_Key-trusted SA records other than PortInfoRecord's M_Key.

#![forbid(unsafe_code)]

pub mod fuzz;
pub mod partitions;
pub mod port;
pub mod sim;
pub mod sm;

pub use partitions::{parse as parse_partitions, Partition, PartitionError};
pub use sm::{Outgoing, SmConfig, SmEvent, SmStats, SubnetManager};
