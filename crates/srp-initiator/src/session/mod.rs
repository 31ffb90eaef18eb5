//! One SRP channel over a verbs provider: the I/O path of the initiator.
//!
//! [`Session`] runs an `srp::initiator::Channel` on an RC QP: it registers
//! receive and send IU rings and a data pool, connects through a
//! [`Connector`] (RDMA CM, IB CM, or a direct call in tests), and turns
//! [`Session::execute`] calls into SRP_CMDs whose data descriptors point
//! into the pool. A caller waiting for its answer reaps the CQ itself
//! while no other thread does, polling for a learned while before it
//! sleeps (`reap`); the provider's callback reaps otherwise, and a poll
//! thread keeps the channel's timers. Callers block on their own command
//! only.
//!
//! The data pool is one memory region registered for remote read and write
//! (the "pre-registered pool" mode of the issue): every command's buffer is
//! a run of pool pages, so a target sees only pages lent to it, but its
//! R_Key covers the whole pool. Per-command registration (FRWR, as ib_srp
//! does) is not implemented yet.
//!
//! When the connection fails (a work request fails, the port goes down,
//! the target logs out) the QP goes to the error state and every
//! outstanding command ends at once with `TransportFailed`, so a
//! multipath device can send it elsewhere that moment. Finding the
//! failure: the RC transport's retries (about 0.55 s) for anything we
//! sent, and a liveness probe ([`SessionConfig::probe_interval`]) for a
//! link that dies while the target holds every command already
//! acknowledged. Dropping a failed session returns at once; its DREQ and
//! teardown run on a thread of their own.
//!
//! A login is never sent from a port that is not ACTIVE: `connect` fails
//! at once with [`SessionError::PortNotActive`] instead of leaving a CM
//! REQ to die on a dead link and wait out the CM's retry timer (about 4 s)
//! after the link is back. A [`PortWatch`] tells whoever retries (the
//! remote port, [`crate::remote`]) when the port is ACTIVE again.

use rdma_types::{AccessFlags, Gid, Guid, Lid, Mtu, Pkey, PortNum, Psn, QpState, Qpn, Rkey};
use rdma_types::{IdMap, WcOpcode, WcStatus};
use srp::initiator::{
    Channel, ChannelConfig, Command, Completion, Data, Event, Negotiated, Output, SendId, Status,
};
use srp::wire::{DirectBuf, Lun, Tag, TaskAttr, TmFunc};
use std::collections::VecDeque;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use verbs::nested::Counted;
use verbs::{
    AhAttr, CaHandle, CqHandle, CqInit, EventHandler, MemBuf, MrInfo, MwBind, MwHandle, MwType,
    PdHandle, Provider, QpAttr, QpHandle, QpInit, RecvWr, SendFlags, SendOpcode, SendWr, Sge,
    WorkCompletion,
};

mod config;
mod connect;
mod connector;
mod poller;
mod pool;
mod reap;
mod watch;

pub use config::*;
use connect::*;
pub use connector::*;
use poller::*;
use pool::*;
use verbs::spin::Spin;
pub use watch::*;

/// How [`Session::start_marked`] sends a command.
#[derive(Default)]
struct StartHow<'k> {
    /// A retry after an abort or reset ([`Session::execute_retry`]).
    retry: bool,
    /// Held back for this thread's batch ([`Session::start_batched`]).
    batch: bool,
    /// Pages to give back first ([`Session::start_batched_after`]).
    replacing: Option<&'k mut Kept>,
}

/// The outcome of one SCSI command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdResult {
    /// How it ended.
    pub status: Status,

    /// Sense data (CHECK CONDITION).
    pub sense: Vec<u8>,
    /// Data-in bytes (reads).
    pub data: Vec<u8>,
    /// Data-in residual.
    pub residual: Option<srp::initiator::Residual>,
}

impl CmdResult {
    /// GOOD status.
    pub fn good(&self) -> bool {
        self.status == Status::Scsi(scsi::Status::Good.code())
    }
}

/// A command sent by [`Session::start`], to be ended by
/// [`Session::finish`] (its pool pages are held until then).
#[derive(Debug)]
#[must_use = "a started command holds pool pages until finished"]
pub struct Started {
    tag: Tag,
    /// The thread that started it, registered then as the one to wake at
    /// its answer: a wait on its own commands registers nothing.
    owner: std::thread::ThreadId,
    runs: pool::Runs,
    len: usize,
    reading: bool,
}

impl Started {
    /// Bytes the command transfers (its buffer's length).
    pub(crate) fn data_len(&self) -> usize {
        self.len
    }
}

/// This thread's id, read once per thread: `std::thread::current()`
/// clones the thread's handle (an atomic count up and down) on every call,
/// and the session asks several times per command.
fn current_id() -> std::thread::ThreadId {
    thread_local! {
        static ID: std::thread::ThreadId = std::thread::current().id();
    }
    ID.with(|id| *id)
}

/// The key and tag of the first of `cmds` that has its answer in `done`.
fn first_done<'a, K>(
    done: &rdma_types::IdRing<u64, Completion>,
    mut cmds: impl Iterator<Item = (K, &'a Started)>,
) -> Option<(K, Tag)> {
    if done.is_empty() {
        return None;
    }
    // A look at one slot of the ring per command.
    cmds.find(|(_, c)| done.contains_key(&c.tag.0))
        .map(|(k, c)| (k, c.tag))
}

/// The answer to command `tag`, taken from `st.done` with what else the
/// session kept for it until then.
fn take_answer(st: &mut State, tag: Tag) -> Option<Completion> {
    let c = st.done.remove(&tag.0)?;
    st.parked.remove(&tag.0);
    // Mostly empty: not even looked into then.
    rdma_types::remove_if_any(&mut st.tables, &tag);
    rdma_types::remove_if_any(&mut st.retried, &tag);
    Some(c)
}

/// A command's answer taken by [`Session::wait_any_answer`], for
/// [`Session::finish_answered`] or [`Session::finish_kept_answered`] of
/// that command. Dropped, the answer is lost and the command's finish
/// would wait for it for ever.
#[derive(Debug)]
#[must_use = "an answer taken is the command's: finish the command with it"]
pub struct Answer {
    tag: Tag,
    completion: Completion,
}

/// Most descriptors one external table holds (ib_srp's largest
/// `sg_tablesize`): 8 MiB in 4 KiB segments.
pub const MAX_EXT_DESCRIPTORS: usize = 2048;

/// Direction and data of a command.
#[derive(Debug, PartialEq, Eq)]
pub enum Xfer<'a> {
    /// No data.
    None,
    /// Read this many bytes (into [`CmdResult::data`]).
    In(usize),
    /// Read into this buffer (as many bytes as it holds; the residual says
    /// how many came). [`CmdResult::data`] stays empty: one copy less.
    InTo(&'a mut [u8]),
    /// Write these bytes.
    Out(&'a [u8]),
}

impl Xfer<'_> {
    /// The same transfer for one more attempt (a retry after a reset).
    pub fn reborrow(&mut self) -> Xfer<'_> {
        match self {
            Xfer::None => Xfer::None,
            Xfer::In(n) => Xfer::In(*n),
            Xfer::InTo(b) => Xfer::InTo(b),
            Xfer::Out(d) => Xfer::Out(d),
        }
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionStats {
    /// Commands completed.
    pub completed: u64,
    /// Commands that timed out (error handler started).
    pub timeouts: u64,
    /// Task management functions sent.
    pub tmfs: u64,
    /// AERs received.
    pub aers: u64,
    /// Protocol errors seen.
    pub protocol_errors: u64,
    /// Commands ended by a LUN reset or reconnect (`Status::Reset`).
    pub reset_ended: u64,
    /// Times the session ended because its port went down or its CA was
    /// removed (fast path-failure detection from port events).
    pub port_failures: u64,
    /// ABORT TASKs the target answered FUNCTION COMPLETE.
    pub aborts_complete: u64,
    /// ABORT TASKs that failed (refused, timed out, no credit): the
    /// command had usually been answered already.
    pub aborts_failed: u64,
    /// Commands ended by an ABORT TASK (`Status::Aborted`).
    pub aborted: u64,
    /// Liveness probes the target acknowledged
    /// ([`SessionConfig::probe_interval`]).
    pub probes: u64,
}

/// One logged-in SRP channel.
pub struct Session {
    inner: Arc<Inner>,
    poller: Option<JoinHandle<()>>,
}

/// A read's data kept in the session's pool ([`Session::finish_kept`]):
/// its pages are the command's until this goes.
pub struct Kept {
    inner: Arc<Inner>,
    runs: pool::Runs,
    len: usize,
}

impl Kept {
    /// Bytes the read returned.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the read returned none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies the data into `out`, up to its length; returns how many
    /// bytes.
    pub fn read(&self, out: &mut [u8]) -> usize {
        let n = self.len.min(out.len());
        self.inner.copy_out(&self.runs, &mut out[..n]);
        n
    }
}

impl Drop for Kept {
    fn drop(&mut self) {
        if self.runs.is_empty() {
            // No pages, or given back already (`Session::start_batched_after`).
            return;
        }
        let mut st = self.inner.lock();
        self.inner.give_back(&mut st, &self.runs);
    }
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kept({} bytes)", self.len)
    }
}

struct Inner {
    provider: Arc<dyn Provider>,
    connector: Arc<dyn Connector>,
    guid: Guid,
    port: PortNum,
    ca: CaHandle,
    pd: PdHandle,
    cq: CqHandle,
    qp: QpHandle,
    recv_buf: MemBuf,
    recv_mr: MrInfo,
    recv_size: u32,
    send_buf: MemBuf,
    send_mr: MrInfo,
    slot_size: u32,
    pool: MemBuf,
    pool_mr: MrInfo,
    page: usize,
    max_segment: u32,
    cmd_sg_entries: u8,
    /// External descriptor tables may be used (ib_srp's allow_ext_sg).
    allow_ext_sg: bool,
    /// Descriptors one command may carry ([`SessionConfig::sg_tablesize`]).
    sg_tablesize: u32,
    /// Each command's pages get a window ([`SessionConfig::register_always`]).
    register_always: bool,
    negotiated: Negotiated,
    probe_interval: Option<rdma_types::Duration>,
    /// What the target says changed, for a rescan ([`SessionConfig::changes`]).
    changes: Option<Arc<crate::changes::TargetChanges>>,
    /// ASYMMETRIC ACCESS STATE CHANGED unit attentions seen (2A/06).
    alua_changes: std::sync::atomic::AtomicU64,
    handle: u64,
    epoch: std::time::Instant,
    /// The session's `srp_session` span: parent of its events (login,
    /// errors, logout; none per command).
    span: tracing::Span,
    st: Mutex<State>,
    /// Whether `State::reaper` is some, for the CQ callback to read
    /// without the lock.
    reaper_polls: std::sync::atomic::AtomicBool,
    cv: Condvar,
    events: Mutex<Sender<Ev>>,
}

enum Ev {
    Cq,
    Kick,
    Stop,
    /// Our port went down or the CA is going away: the path is dead now,
    /// not after the transport's retries run out.
    PortGone,
}

struct State {
    channel: Channel,
    /// Free send slots.
    free_slots: Vec<u32>,
    /// The SendId in flight in each send slot (a SEND's work request id
    /// names its slot: no search when it completes).
    slot_ids: Vec<Option<SendId>>,
    /// Results of finished commands, by the number of the tag (ours: its
    /// low bits are the command's slot), until their caller takes them.
    done: rdma_types::IdRing<u64, Completion>,
    /// Pool pages in use.
    pages: PageMap,
    /// Where each command's external descriptor table lives in the pool.
    tables: IdMap<Tag, u64>,
    events: VecDeque<Event>,
    /// Task management requests finished, and the last one's outcome.
    tmfs_done: u64,
    last_tmf: Option<(TmFunc, Result<(), srp::initiator::TmfFailure>)>,
    stats: SessionStats,
    closed: bool,
    /// Callers waiting for their command's answer, woken one by one; by
    /// the number of the tag (ours: its low bits are the command's slot).
    parked: rdma_types::IdRing<u64, std::thread::Thread>,
    /// The waiting caller reaping the CQ ([`Inner::wait_answer`]): the CQ
    /// stays unarmed until it gives the role up.
    reaper: Option<std::thread::ThreadId>,
    /// How long a reaping caller polls the CQ before it sleeps (at most
    /// `reap::SPIN_MAX`).
    spin: Spin,
    /// How long a reaping caller that drives the provider looks at its
    /// NIC there before it sleeps there (at most `reap::DRIVE_SPIN_MAX`).
    drive_spin: Spin,
    /// The last reap drove the provider: its wait teaches `drive_spin`.
    drove: bool,
    /// Callers inside [`Inner::wait_answer`] now.
    waiting: usize,
    /// The provider's last `drive_cq` waited in it (soft RoCE): a reaping
    /// caller drives at once instead of polling first.
    provider_drives: bool,
    /// Waiters whose answer came under this hold of the lock: woken once
    /// it is let go ([`Locked`]'s drop), so a waiter does not wake only to
    /// block on the lock its waker still holds.
    wake: Vec<std::thread::Thread>,
    /// Commands sent again after an abort or reset ([`Session::execute_retry`]):
    /// [`Session::abort_oldest`] passes them by.
    retried: IdMap<Tag, ()>,
    /// Callers waiting on `cv` (pool pages, credits, task management).
    cv_waiters: u32,
    /// SENDs queued under the lock (slot, request), posted once
    /// it is let go: a provider that calls back on the posting thread (the
    /// loopback fabric) can then run the target's handlers, and ours,
    /// right there, with no thread hand-off. One thread at a time posts
    /// the queue, in order.
    posts: Posts,
    /// A thread is posting `posts` (it takes what others queue meanwhile).
    flushing: bool,
    /// The posting thread's buffers, kept between batches so a batch
    /// allocates nothing (the flushing thread has them meanwhile).
    flush_bufs: Posts,
    /// Where a received IU is read to be parsed (kept: no allocation per IU).
    iu_buf: Vec<u8>,
    /// Receive buffers whose IUs were handled, posted again once
    /// [`REPOST_BATCH`] of them wait (one call, not one per IU).
    reposts: Vec<RecvWr>,
    /// The thread whose letting go of the lock leaves `posts` queued
    /// ([`Session::start_batched`]), until it has to sleep.
    batching: Option<std::thread::ThreadId>,
    /// The clock as read for the first command of the batch being built
    /// (`batching`), none of it posted yet: the others share it, as they
    /// go out together (one clock read a batch, not one a command). Gone
    /// once the batch is posted or stops.
    batch_now: Option<rdma_types::Instant>,
    /// The poll thread sleeps until this timer deadline (`Some(None)`:
    /// with no timer); `None` while it works (it looks at timers again
    /// before it sleeps).
    timer_sleep: Option<Option<rdma_types::Instant>>,
    /// Since when the target has been silent while commands wait: the
    /// last thing received, probe acknowledged, or command sent to an
    /// idle channel.
    quiet_since: rdma_types::Instant,
    /// A liveness probe is in flight.
    probe_out: bool,
    /// Memory windows free to bind, each with its current R_Key
    /// ([`SessionConfig::register_always`]).
    windows: Vec<(MwHandle, Rkey)>,
    /// Every window the session allocated (deallocated at logout).
    windows_made: Vec<MwHandle>,
    /// The windows bound for each command in flight, invalidated when
    /// its answer comes.
    bound: IdMap<Tag, Vec<(MwHandle, Rkey)>>,
}

/// The session lock, counted so a completion callback on this thread
/// knows not to take it again. Letting it go posts the SENDs queued under
/// it (see [`State::posts`]).
struct Locked<'a> {
    inner: &'a Inner,
    st: Option<Counted<'a, State>>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.st.as_ref().expect("held")
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.st.as_mut().expect("held")
    }
}

impl State {
    /// The learner of the reaper's wait as it last went: driving the
    /// provider (`drive_spin`) or polling the CQ (`spin`).
    fn reap_spin(&mut self) -> &mut Spin {
        if self.drove {
            &mut self.drive_spin
        } else {
            &mut self.spin
        }
    }

    /// This thread is about to wait: what it batched goes out now.
    fn stop_batching(&mut self) {
        if self.batching == Some(current_id()) {
            self.batching = None;
            self.batch_now = None;
        }
    }
}

/// Send work requests queued to be posted in one call, and each one's
/// send slot (`NO_SLOT` for a window's): apart, so the requests are
/// posted from where they were queued, not moved into a list first.
#[derive(Default)]
struct Posts {
    wrs: Vec<SendWr>,
    slots: Vec<u32>,
}

impl Posts {
    fn push(&mut self, slot: u32, wr: SendWr) {
        self.wrs.push(wr);
        self.slots.push(slot);
    }

    fn len(&self) -> usize {
        self.wrs.len()
    }

    fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }
}

/// Posts a batching thread ([`Session::start_batched`]) holds back at
/// most when the provider drives a NIC of its own that the caller moves
/// (soft RoCE: `State::provider_drives`). The target starts on a batch
/// only once it is sent, and answers it whole: a batch of the whole queue
/// leaves the target idle while this thread builds it, then this thread
/// idle while the target answers it. Two halves overlap (4 KiB random
/// reads QD32: 1.3x the IOPS, a fifth less CPU an I/O, in paired runs; 4
/// and 8 a batch did no better). Where the provider does the work inside
/// the post (the loopback fabric) nothing runs beside this thread, and
/// the whole batch goes in one post.
const DRIVEN_BATCH_MAX: usize = 16;

/// Whether a thread letting go of the lock leaves the `queued` posts for
/// later: when they are its own batch (`batching_here`), unless the
/// provider drives a NIC of its own and `DRIVEN_BATCH_MAX` wait.
fn holds_posts(batching_here: bool, provider_drives: bool, queued: usize) -> bool {
    batching_here && !(provider_drives && queued >= DRIVEN_BATCH_MAX)
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let Some(st) = self.st.as_mut() else {
            return;
        };
        let post = !st.flushing
            && !st.posts.is_empty()
            && !holds_posts(
                st.batching == Some(current_id()),
                st.provider_drives,
                st.posts.len(),
            );
        if !post && st.wake.is_empty() {
            // Most lets go: nobody to wake and nothing to post (the guard
            // goes as the field is dropped).
            return;
        }
        let wake = std::mem::take(&mut st.wake);
        let batch = post.then(|| {
            st.flushing = true;
            st.batch_now = None;
            let mut bufs = std::mem::take(&mut st.flush_bufs);
            std::mem::swap(&mut st.posts, &mut bufs);
            bufs
        });
        drop(self.st.take());
        for t in wake {
            t.unpark();
        }
        if let Some(bufs) = batch {
            self.inner.flush_posts(bufs);
        }
    }
}

const KIND_RECV: u64 = 1 << 56;
const KIND_SEND: u64 = 2 << 56;
const KIND_PROBE: u64 = 3 << 56;
/// A window bound or invalidated (unsignaled: seen only when it fails).
const KIND_MW: u64 = 4 << 56;
/// Most windows one command binds with register_always (segments and a
/// descriptor table): ib_srp's `mr_per_cmd` in spirit. A buffer of more
/// segments is refused (`TooManySegments`), and the disk layer's largest
/// transfer follows ([`Session::max_transfer_by_segments`]).
pub const WINDOWS_PER_CMD: usize = 4;
/// The slot of a queued post that is no SEND of an IU (a window's).
const NO_SLOT: u32 = u32::MAX;
const KIND_MASK: u64 = 0xff << 56;
const PAGE: usize = 4096;
/// Receive buffers posted again together, at most (`State::reposts`); the
/// receive queue has this many more than answers in flight need.
const REPOST_BATCH: u32 = 8;

impl Session {
    /// A [`PortWatch`] on this session's port, calling `on_active` each
    /// time the port becomes ACTIVE; it outlives the session.
    ///
    /// # Errors
    /// The CA cannot be opened again.
    pub fn watch_port(
        &self,
        on_active: Box<dyn Fn() + Send + Sync>,
    ) -> Result<PortWatch, SessionError> {
        PortWatch::open(
            self.inner.provider.clone(),
            self.inner.guid,
            self.inner.port,
            on_active,
        )
    }

    /// What the login negotiated.
    pub fn negotiated(&self) -> Negotiated {
        self.inner.negotiated
    }

    /// Largest transfer one SRP_CMD can describe when buffers are split
    /// into segments (`max_segment` times `cmd_sg_entries`, or times
    /// [`MAX_EXT_DESCRIPTORS`] with external tables); `None` when every
    /// buffer is one segment.
    pub fn max_transfer_by_segments(&self) -> Option<usize> {
        let inner = &self.inner;
        (inner.max_segment > 0).then(|| {
            let seg = (inner.max_segment as usize).div_ceil(inner.page) * inner.page;
            seg * inner.max_descriptors()
        })
    }

    /// The QP's attributes as the provider reports them (`retry_cnt`,
    /// `timeout`, path MTU, ...).
    ///
    /// # Errors
    /// The provider cannot query QPs, or the QP is gone.
    pub fn query_qp(&self) -> Result<QpAttr, SessionError> {
        self.inner
            .provider
            .query_qp(self.inner.qp)
            .map_err(verbs_err("query QP"))
    }

    /// Credits the initiator holds.
    pub fn credits(&self) -> i64 {
        self.inner.lock().channel.credits()
    }

    /// Counters.
    pub fn stats(&self) -> SessionStats {
        self.inner.lock().stats
    }

    /// Events the channel reported (AERs, logouts, task management), oldest
    /// first.
    pub fn take_events(&self) -> Vec<Event> {
        self.inner.lock().events.drain(..).collect()
    }

    /// Notes the change a command's unit attention reports (LUNs or a
    /// capacity changed), if it reports one and someone follows changes.
    pub fn note_sense(&self, sense: &[u8]) {
        if let Some(c) = &self.inner.changes {
            c.note_sense(sense);
        }
        if scsi::sense::decode_key_asc(sense)
            == Some((
                scsi::SenseKey::UnitAttention,
                scsi::Asc::ASYMMETRIC_ACCESS_STATE_CHANGED,
            ))
        {
            self.inner
                .alua_changes
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// ASYMMETRIC ACCESS STATE CHANGED unit attentions this session's
    /// commands met so far (SPC-4 5.16.2.6): a multipath device reads the
    /// target port groups again when it grows.
    pub fn alua_changes(&self) -> u64 {
        self.inner
            .alua_changes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the connection is gone.
    pub fn is_closed(&self) -> bool {
        self.inner.lock().closed
    }

    /// Runs one SCSI command and waits for its answer.
    pub fn execute(&self, lun: Lun, cdb: &[u8], xfer: Xfer<'_>) -> Result<CmdResult, SessionError> {
        self.execute_attr(lun, cdb, xfer, TaskAttr::Simple)
    }

    /// [`Session::execute`] with a task attribute.
    pub fn execute_attr(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: Xfer<'_>,
        attr: TaskAttr,
    ) -> Result<CmdResult, SessionError> {
        self.execute_marked(lun, cdb, xfer, attr, false)
    }

    /// [`Session::execute_attr`] for a command sent again because an
    /// abort or reset ended its previous try (the disk layer's bounded
    /// retries). [`Session::abort_oldest`] never picks such a command, so
    /// a test's stream of aborts cannot end one I/O more often than the
    /// retry limit allows and fail it: the real error handler aborts a
    /// command only after its timeout, which a retried one starts afresh.
    pub fn execute_retry(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: Xfer<'_>,
        attr: TaskAttr,
    ) -> Result<CmdResult, SessionError> {
        self.execute_marked(lun, cdb, xfer, attr, true)
    }

    fn execute_marked(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: Xfer<'_>,
        attr: TaskAttr,
        retry: bool,
    ) -> Result<CmdResult, SessionError> {
        let how = StartHow {
            retry,
            ..StartHow::default()
        };
        let c = self.start_marked(lun, cdb, &xfer, attr, how)?;
        Ok(self.finish(c, xfer))
    }

    /// Sends one SCSI command and returns at once (waiting only for pool
    /// pages, a credit or a queue slot): the asynchronous half of
    /// [`Session::execute_attr`]. Write data is copied out of `xfer`
    /// before this returns; a read's destination is given to
    /// [`Session::finish`]. Every started command must be finished.
    pub fn start(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: &Xfer<'_>,
        attr: TaskAttr,
    ) -> Result<Started, SessionError> {
        self.start_marked(lun, cdb, xfer, attr, StartHow::default())
    }

    /// [`Session::start`], for a caller that starts several commands and
    /// then waits for them (a queue): this command, and those this thread
    /// starts after it, are sent together when the thread next has to
    /// sleep ([`Session::wait_any_of`] or [`Session::finish`] finding no
    /// answer yet, or a wait for a credit inside a start), or sooner when
    /// another thread sends: one post, and on soft RoCE their packets in
    /// one segmented send, instead of one per command.
    pub fn start_batched(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: &Xfer<'_>,
        attr: TaskAttr,
    ) -> Result<Started, SessionError> {
        self.start_batched_after(None, lun, cdb, xfer, attr)
    }

    /// [`Session::start_batched`] that first gives back the pages of
    /// `kept` (a read's data the caller is done with) under the same hold
    /// of the session lock: a queue starting a slot again takes the lock
    /// once, not once to drop the slot's last data and once to start.
    /// `kept` is left empty (no pages, no bytes), whatever the start's
    /// outcome; a `Kept` of another session is left as it is.
    pub fn start_batched_after(
        &self,
        kept: Option<&mut Kept>,
        lun: Lun,
        cdb: &[u8],
        xfer: &Xfer<'_>,
        attr: TaskAttr,
    ) -> Result<Started, SessionError> {
        let how = StartHow {
            batch: true,
            replacing: kept.filter(|k| Arc::ptr_eq(&k.inner, &self.inner)),
            ..StartHow::default()
        };
        self.start_marked(lun, cdb, xfer, attr, how)
    }

    fn start_marked(
        &self,
        lun: Lun,
        cdb: &[u8],
        xfer: &Xfer<'_>,
        attr: TaskAttr,
        how: StartHow<'_>,
    ) -> Result<Started, SessionError> {
        let StartHow {
            retry,
            batch,
            replacing,
        } = how;
        let inner = &self.inner;
        let (len, reading) = match xfer {
            Xfer::None => (0, false),
            Xfer::In(n) => (*n, true),
            Xfer::InTo(b) => (b.len(), true),
            Xfer::Out(d) => (d.len(), false),
        };
        let mut st = inner.lock();
        if let Some(k) = replacing {
            // First: they may be the pages this command waits for.
            inner.give_back(&mut st, &k.runs);
            k.runs.clear();
            k.len = 0;
        }
        if len > inner.pool.len() {
            return Err(SessionError::TooLarge(len, inner.pool.len()));
        }
        let me = current_id();
        if batch && st.batching != Some(me) {
            st.batching = Some(me);
            st.batch_now = None;
        }
        // Wait for pool pages (other commands may hold them).
        let pages = len.div_ceil(inner.page);
        // Segments the buffer will have, and whether they need an external
        // descriptor table (in the pool too, which the target fetches by
        // RDMA READ). Data and table pages are taken together, so callers
        // waiting for pages never hold half of what they need.
        let seg_count = if inner.max_segment == 0 {
            // Unsplit buffers (most sessions): one segment, none when
            // empty, without the division.
            usize::from(pages > 0)
        } else {
            pages.div_ceil(inner.seg_pages(pages).max(1))
        };
        if seg_count > inner.max_descriptors() {
            return Err(SessionError::TooManySegments {
                len,
                segments: seg_count,
                max: inner.max_descriptors(),
            });
        }
        let table_pages = if inner.allow_ext_sg && seg_count > usize::from(inner.cmd_sg_entries) {
            (seg_count * srp::wire::DIRECT_BUF_LEN).div_ceil(inner.page)
        } else {
            0
        };
        let (runs, table_run) = loop {
            if st.closed {
                return Err(SessionError::Closed);
            }
            if let Some(runs) = inner.alloc(&mut st, pages) {
                if table_pages == 0 {
                    break (runs, None);
                }
                if let Some(start) = st.pages.find_free(0, table_pages) {
                    st.pages.set(start, table_pages, true);
                    break (runs, Some((start, table_pages)));
                }
                inner.free(&mut st, &runs);
            }
            st = inner.wait_cv(st);
        };
        let mut segs = inner.segments(&runs, len);
        let immediate = match xfer {
            Xfer::Out(d) => st
                .channel
                .immediate_capacity()
                .is_some_and(|cap| (d.len() as u32) <= cap && !d.is_empty()),
            _ => false,
        };
        if let Xfer::Out(data) = xfer {
            if !immediate {
                // The pages are ours until freed: fill them without holding
                // the lock every completion takes.
                drop(st);
                let mut at = 0;
                for s in &segs {
                    inner.pool.write_at(
                        (s.va - inner.pool.addr()) as usize,
                        &data[at..at + s.len as usize],
                    );
                    at += s.len as usize;
                }
                st = inner.lock();
            }
        }
        let mut table = table_run.map(|(start, pages)| DirectBuf {
            va: inner.pool.addr() + (start * inner.page) as u64,
            key: inner.pool_mr.rkey,
            len: (pages * inner.page) as u32,
        });
        // register_always: a window of its own for each segment and the
        // descriptor table, bound ahead of the SRP_CMD on the same queue.
        let mut windows = Vec::new();
        let mut binds = Vec::new();
        if inner.register_always && !immediate {
            for d in segs.iter_mut().chain(table.as_mut()) {
                match inner.window_for(&mut st, d) {
                    Ok((w, bind)) => {
                        windows.push(w);
                        binds.push(bind);
                    }
                    Err(e) => {
                        st.windows
                            .extend(windows.iter().map(|&(w, old, _)| (w, old)));
                        inner.free(&mut st, &runs);
                        if let Some((start, pages)) = table_run {
                            inner.free(&mut st, &[(start, pages)]);
                        }
                        inner.cv.notify_all();
                        return Err(e);
                    }
                }
            }
        }
        let data = match xfer {
            Xfer::None => Data::None,
            Xfer::In(_) | Xfer::InTo(_) => Data::In(&segs),
            Xfer::Out(d) if immediate => Data::Immediate(d),
            Xfer::Out(_) => Data::Out(&segs),
        };
        let mut cmd = Command::new(lun, cdb, data);
        cmd.attr = attr;
        cmd.desc_table = table;
        // Written into the SEND's slot from `xfer` (`flush_outputs_here`
        // below), not copied into the IU's buffer first.
        cmd.immediate_follows = true;
        let mut runs = runs;
        // A push, not `extend`: its iterator machinery cost ~40
        // instructions a command for the table run almost none has.
        if let Some(t) = table_run {
            runs.push(t);
        }
        // Queue full or no credit: wait for a completion and try again.
        let tag = loop {
            let now = if batch && st.batching == Some(me) {
                *st.batch_now.get_or_insert_with(|| inner.now())
            } else {
                inner.now()
            };
            if st.channel.outstanding() == 0 {
                // The target has had nothing to answer until now.
                st.quiet_since = now;
            }
            match st.channel.submit(now, &cmd) {
                Ok(tag) => {
                    // Woken at the answer from now on (the answer may
                    // come while the lock is let go below).
                    st.parked.insert(tag.0, std::thread::current());
                    if let Some(t) = cmd.desc_table {
                        st.tables.insert(tag, t.va);
                    }
                    if !windows.is_empty() {
                        // Ahead of the SRP_CMD, which `flush_outputs_here`
                        // queues next.
                        for wr in binds.drain(..) {
                            st.posts.push(NO_SLOT, wr);
                        }
                        st.bound
                            .insert(tag, windows.iter().map(|&(w, _, new)| (w, new)).collect());
                    }
                    if retry {
                        st.retried.insert(tag, ());
                    }
                    break tag;
                }
                Err(
                    srp::initiator::SubmitError::NoCredit
                    | srp::initiator::SubmitError::QueueFull(_)
                    | srp::initiator::SubmitError::Recovering,
                ) if !st.closed => {
                    st = inner.wait_cv(st);
                }
                Err(e) => {
                    inner.free(&mut st, &runs);
                    st.windows
                        .extend(windows.iter().map(|&(w, old, _)| (w, old)));
                    inner.cv.notify_all();
                    return Err(if st.closed {
                        SessionError::Closed
                    } else {
                        e.into()
                    });
                }
            }
        };
        let data = match xfer {
            Xfer::Out(d) if immediate => Some((tag, *d)),
            _ => None,
        };
        inner.flush_outputs_here(&mut st, data);
        inner.kick_if_timer_earlier(&mut st, tag);
        Ok(Started {
            tag,
            owner: me,
            runs,
            len,
            reading,
        })
    }

    /// Waits until one of `cmds` has its answer; returns its index. One
    /// thread can keep many commands in flight this way (as fio's libaio
    /// engine does) instead of one thread per command.
    pub fn wait_any(&self, cmds: &[&Started]) -> usize {
        self.wait_any_of(cmds.iter().copied().enumerate())
            .unwrap_or(0)
    }

    /// [`Session::wait_any`] over `(key, command)` pairs, without a slice:
    /// returns the key of a command that has its answer, or `None` when
    /// `cmds` is empty. The iterator is walked once per wake-up.
    pub fn wait_any_of<'a, K, I>(&self, cmds: I) -> Option<K>
    where
        I: Iterator<Item = (K, &'a Started)> + Clone,
    {
        self.wait_first(cmds, |_, _| Some(())).map(|(k, ())| k)
    }

    /// [`Session::wait_any_of`] that takes the answer it found, under
    /// the same hold of the session lock, for the command's finish
    /// ([`Session::finish_answered`], [`Session::finish_kept_answered`]):
    /// a queue finishing what it waited for takes the lock once for both,
    /// or not at all for a read kept in place.
    pub fn wait_any_answer<'a, K, I>(&self, cmds: I) -> Option<(K, Answer)>
    where
        I: Iterator<Item = (K, &'a Started)> + Clone,
    {
        self.wait_first(cmds, |st, tag| {
            take_answer(st, tag).map(|completion| Answer { tag, completion })
        })
    }

    /// Waits until one of `cmds` has its answer; its key and what `take`
    /// makes of it under the lock. `None` when `cmds` is empty.
    fn wait_first<'a, K, I, T>(
        &self,
        cmds: I,
        mut take: impl FnMut(&mut State, Tag) -> Option<T>,
    ) -> Option<(K, T)>
    where
        I: Iterator<Item = (K, &'a Started)> + Clone,
    {
        let inner = &self.inner;
        // No command: nothing to wait for.
        cmds.clone().next()?;
        let mut registered = false;
        let (_st, found) = inner.wait_answer(inner.lock(), |st| {
            if let Some((k, tag)) = first_done(&st.done, cmds.clone()) {
                return take(st, tag).map(|t| (k, t));
            }
            // Once, and only for commands another thread started (their
            // starter is registered): whoever handles a tag's answer takes
            // its entry, which ends the wait. An entry left behind costs
            // at most a spurious wake-up.
            if !registered {
                let me = std::thread::current();
                for (_, c) in cmds.clone().filter(|(_, c)| c.owner != me.id()) {
                    st.parked.insert(c.tag.0, me.clone());
                }
                registered = true;
            }
            None
        });
        Some(found)
    }

    /// Waits for `c`'s answer (at once after [`Session::wait_any`] chose
    /// it), copies read data into `xfer`'s buffer (`Xfer::InTo`) or into
    /// [`CmdResult::data`] (`Xfer::In`), and gives its pages back.
    pub fn finish(&self, c: Started, xfer: Xfer<'_>) -> CmdResult {
        self.finish_inner(c, xfer, false, None).0
    }

    /// [`Session::finish`] with the answer [`Session::wait_any_answer`]
    /// took for `c` (an answer to another command is put back, and `c`'s
    /// own waited for).
    pub fn finish_answered(&self, c: Started, answer: Answer, xfer: Xfer<'_>) -> CmdResult {
        self.finish_inner(c, xfer, false, Some(answer)).0
    }

    /// [`Session::finish_kept`] with the answer
    /// [`Session::wait_any_answer`] took for `c`, as
    /// [`Session::finish_answered`].
    pub fn finish_kept_answered(&self, c: Started, answer: Answer) -> (CmdResult, Option<Kept>) {
        self.finish_inner(c, Xfer::None, true, Some(answer))
    }

    /// [`Session::finish`] that leaves a read's data where the target
    /// wrote it, in the session's registered pool: no copy now, and the
    /// pages stay the command's until the [`Kept`] goes (a caller that
    /// may never look at the data, or looks later). [`CmdResult::data`]
    /// stays empty; `None` when there is no data to keep (not a read, or
    /// not GOOD).
    pub fn finish_kept(&self, c: Started) -> (CmdResult, Option<Kept>) {
        self.finish_inner(c, Xfer::None, true, None)
    }

    fn finish_inner(
        &self,
        c: Started,
        xfer: Xfer<'_>,
        keep: bool,
        answer: Option<Answer>,
    ) -> (CmdResult, Option<Kept>) {
        let inner = &self.inner;
        let Started {
            tag,
            owner,
            runs,
            len,
            reading,
        } = c;
        let (st, completion) = match answer {
            // Taken already: the lock only if the pages go back now.
            Some(a) if a.tag == tag => (None, a.completion),
            other => {
                let mut st = inner.lock();
                if let Some(a) = other {
                    // Another command's: back where its finish looks.
                    st.done.insert(a.tag.0, a.completion);
                }
                // Until this tag's answer is in: reaped by this thread, or
                // by another that wakes it (one wake-up per command, not
                // one per completion for every caller).
                let (st, c) = inner.wait_answer(st, |st| {
                    if let Some(c) = take_answer(st, tag) {
                        return Some(c);
                    }
                    if owner != current_id() {
                        st.parked.insert(tag.0, std::thread::current());
                    }
                    None
                });
                (Some(st), c)
            }
        };
        let mut out = Vec::new();
        let good = completion.status == Status::Scsi(scsi::Status::Good.code());
        let got = match completion.data_in_residual {
            Some(srp::initiator::Residual::Under(n)) => len.saturating_sub(n as usize),
            _ => len,
        };
        let kept = if reading && good && keep {
            // Left where the target wrote it: the pages go with the `Kept`.
            drop(st);
            Some(Kept {
                inner: inner.clone(),
                runs,
                len: got,
            })
        } else {
            let st = if reading && good {
                // The pages stay ours until given back below: copy without
                // the lock.
                drop(st);
                let dst: &mut [u8] = match xfer {
                    Xfer::InTo(b) => {
                        let got = got.min(b.len());
                        &mut b[..got]
                    }
                    _ => {
                        out = vec![0u8; got];
                        &mut out
                    }
                };
                inner.copy_out(&runs, dst);
                None
            } else {
                st
            };
            let mut st = st.unwrap_or_else(|| inner.lock());
            inner.give_back(&mut st, &runs);
            None
        };
        let result = CmdResult {
            status: completion.status,
            sense: completion.sense,
            data: out,
            residual: completion.data_in_residual,
        };
        (result, kept)
    }

    /// LOGICAL UNIT RESET of `lun` (what `sg_reset --device` asks of
    /// ib_srp); waits for the target's answer. Commands of the LUN still
    /// outstanding end with `Status::Reset` (callers such as
    /// [`crate::disk::Disk`] retry them).
    pub fn reset_lun(&self, lun: Lun) -> Result<(), SessionError> {
        let inner = &self.inner;
        let mut st = inner.lock();
        let before = loop {
            if st.closed {
                return Err(SessionError::Closed);
            }
            let seen = st.tmfs_done;
            let now = inner.now();
            match st.channel.reset_lun(now, lun) {
                Ok(()) => break seen,
                Err(srp::initiator::SubmitError::Recovering) => {
                    st = inner.wait_cv(st);
                }
                Err(e) => return Err(e.into()),
            }
        };
        inner.flush_outputs_here(&mut st, None);
        let _ = inner.events.lock().map(|tx| tx.send(Ev::Kick));
        loop {
            if st.tmfs_done > before {
                if let Some((TmFunc::LogicalUnitReset, result)) = st.last_tmf {
                    return result.map_err(SessionError::TaskMgmt);
                }
            }
            if st.closed {
                return Err(SessionError::Closed);
            }
            st = inner.wait_cv(st);
        }
    }

    /// Sends ABORT TASK for the oldest unanswered command, as the error
    /// handler does for a timed-out one, passing by commands that are
    /// already retries ([`Session::execute_retry`]); returns `false` when
    /// nothing such was outstanding. The command then ends `Status::Aborted` if the target
    /// aborted it, or normally if its response came first
    /// ([`SessionStats::aborts_complete`] / `aborts_failed` count the
    /// answers).
    pub fn abort_oldest(&self) -> bool {
        let inner = &self.inner;
        let mut st = inner.lock();
        if st.closed {
            return false;
        }
        let now = inner.now();
        let retried = &st.retried;
        let Some(tag) = st
            .channel
            .oldest_unanswered_where(|t| !retried.contains_key(&t))
        else {
            return false;
        };
        let sent = st.channel.abort(now, tag);
        inner.flush_outputs_here(&mut st, None);
        let _ = inner.events.lock().map(|tx| tx.send(Ev::Kick));
        sent
    }

    /// Logs out: disconnects (ib_srp sends no SRP_I_LOGOUT either) and
    /// fails whatever is still outstanding.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        shutdown(&self.inner, self.poller.take());
    }
}

impl Drop for Session {
    /// A live session is logged out before this returns. A session whose
    /// connection already failed is torn down on a thread of its own: its
    /// commands have all ended (`TransportFailed`), and the DREQ over a
    /// dead link can take the CM's whole retry budget (seconds). Whoever
    /// drops the last reference (often an I/O thread on its way to retry
    /// a failed command on another path, or the remote port's reconnect
    /// thread) must not wait for that.
    fn drop(&mut self) {
        let Some(poller) = self.poller.take() else {
            return;
        };
        if !self.inner.lock().closed {
            shutdown(&self.inner, Some(poller));
            return;
        }
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name("srp-teardown".into())
            .spawn(move || shutdown(&inner, Some(poller)));
        if spawned.is_err() {
            // No thread to hand it to: tear down here (the poll thread,
            // whose handle went with the closure, is stopped, not joined).
            shutdown(&self.inner, None);
        }
    }
}

impl Inner {
    fn lock(&self) -> Locked<'_> {
        Locked {
            inner: self,
            st: Some(Counted::lock(&self.st)),
        }
    }

    /// Posts `batch` and whatever other threads queue meanwhile, in
    /// order, with the lock let go, each batch in one post; a failed post
    /// fails the connection.
    fn flush_posts(&self, mut batch: Posts) {
        loop {
            let n = batch.len();
            // The requests not posted.
            let failed = match self.provider.post_send(self.qp, &batch.wrs) {
                Ok(()) => n..n,
                Err(verbs::VerbsError::BadWr { index, .. }) => index.min(n)..n,
                Err(_) => 0..n,
            };
            batch.wrs.clear();
            let mut st = self.lock();
            if !failed.is_empty() {
                for slot in batch.slots.drain(failed).filter(|&slot| slot != NO_SLOT) {
                    if let Some(id) = st.slot_ids.get_mut(slot as usize) {
                        *id = None;
                    }
                    st.free_slots.push(slot);
                }
                self.lost(&mut st);
                self.drain_channel(&mut st);
            }
            batch.slots.clear();
            if st.posts.is_empty() {
                st.flushing = false;
                st.flush_bufs = batch;
                return;
            }
            st.batch_now = None;
            std::mem::swap(&mut st.posts, &mut batch);
        }
    }

    fn now(&self) -> rdma_types::Instant {
        rdma_types::Instant::from_std(self.epoch, std::time::Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_for_a_driven_nic_goes_out_at_sixteen_and_others_wait_for_the_wait() {
        // Its own batch waits on the loopback fabric however long it is.
        assert!(holds_posts(true, false, 1000));
        // On soft RoCE, until 16 wait.
        assert!(holds_posts(true, true, DRIVEN_BATCH_MAX - 1));
        assert!(!holds_posts(true, true, DRIVEN_BATCH_MAX));
        // Another thread's posts are never this one's to hold.
        assert!(!holds_posts(false, false, 1));
        assert!(!holds_posts(false, true, 1));
    }

    #[test]
    fn the_partition_picks_its_table_index() {
        let t = [Pkey(0xffff), Pkey(0x0010), Pkey(0x0000), Pkey(0x8020)];
        // The same P_Key, or the partition with the other membership bit.
        assert_eq!(pkey_index(&t, Pkey(0xffff)), Some(0));
        assert_eq!(pkey_index(&t, Pkey(0x8010)), Some(1));
        assert_eq!(pkey_index(&t, Pkey(0x0020)), Some(3));
        // An exact entry wins over one of the other membership.
        let both = [Pkey(0x0010), Pkey(0x8010)];
        assert_eq!(pkey_index(&both, Pkey(0x8010)), Some(1));
        assert_eq!(pkey_index(&both, Pkey(0x0010)), Some(0));
        // Absent partitions and invalid keys find nothing.
        assert_eq!(pkey_index(&t, Pkey(0x8030)), None);
        assert_eq!(pkey_index(&t, Pkey(0x8000)), None);
        assert_eq!(pkey_index(&t, Pkey(0x0000)), None);
    }
}
