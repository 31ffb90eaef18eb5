//! The event thread of a CA open, and the rule that keeps callbacks and
//! destruction apart.
//!
//! The thread sleeps in `poll(2)` on the context's async fd, every CQ's
//! channel and an eventfd (new CQs, stop). It reads and acknowledges each
//! event first, then finds the object by the key the device hands back,
//! and calls the handler with no lock held.
//!
//! Destroy and callbacks: the thread marks the object it is calling back
//! for (`Dispatch::current`) while it looks the object up under the state
//! lock, so a destroy that removed the object first is never called back
//! after; a destroy that comes later waits until that callback returns
//! before it delivers `on_destroyed` (or, called from inside the callback
//! itself, leaves `on_destroyed` to the thread, which delivers it once the
//! callback has returned). Lock order: dispatch, then state, then a CQ's.

use super::ca::CaRt;
use super::cq::CqRt;
use super::gsi::GsiRt;
use super::objects::{Obj, State};
use crate::sys::{self, raw::event, AsyncEventInfo, Element, Ready};
use rdma_types::PortNum;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use verbs::{AsyncEvent, AsyncEventKind, Context, Handle, ResourceKind};

/// What the event thread is calling back for, and the `on_destroyed`
/// calls it owes once that callback returns.
#[derive(Default)]
pub(crate) struct Dispatch {
    current: Option<Handle>,
    deferred: Vec<(ResourceKind, Context)>,
}

fn guard<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Starts `rt`'s event thread.
pub(super) fn start(rt: &Arc<CaRt>, st: Arc<Mutex<State>>) -> std::io::Result<()> {
    let me = rt.clone();
    let t = std::thread::Builder::new()
        .name(format!("rdmacore-{}", rt.dev.name()))
        .spawn(move || run(&me, &st))?;
    let _ = rt.thread_id.set(t.thread().id());
    *guard(&rt.thread) = Some(t);
    Ok(())
}

/// Delivers `on_destroyed(kind, ctx)` for object `h`, which the caller
/// has removed from the table: once no callback for it runs (see the
/// module docs).
pub(super) fn retire(rt: &CaRt, h: Handle, kind: ResourceKind, ctx: Context) {
    let mut d = guard(&rt.dispatch);
    if rt.on_event_thread() {
        if d.current == Some(h) {
            d.deferred.push((kind, ctx));
            return;
        }
    } else {
        while d.current == Some(h) {
            d = rt.dispatched.wait(d).unwrap_or_else(|e| e.into_inner());
        }
    }
    drop(d);
    rt.handler.on_destroyed(kind, ctx);
}

/// Calls `call` with what `find` returns for the object it names in the
/// state, if that is still there, marked as the one being called back
/// for.
fn dispatch<T>(
    rt: &CaRt,
    st: &Mutex<State>,
    find: impl FnOnce(&State) -> Option<(Handle, T)>,
    call: impl FnOnce(T),
) {
    let mut d = guard(&rt.dispatch);
    let Some((h, what)) = find(&guard(st)) else {
        return;
    };
    d.current = Some(h);
    drop(d);
    call(what);
    let owed = {
        let mut d = guard(&rt.dispatch);
        d.current = None;
        rt.dispatched.notify_all();
        std::mem::take(&mut d.deferred)
    };
    for (kind, ctx) in owed {
        rt.handler.on_destroyed(kind, ctx);
    }
}

fn run(rt: &Arc<CaRt>, st: &Mutex<State>) {
    let mut async_fd = rt.dev.async_fd();
    while !rt.stop.load(Ordering::Acquire) {
        let cqs: Vec<Arc<CqRt>> = rt
            .cq_list()
            .iter()
            .filter(|c| !c.broken.load(Ordering::Relaxed))
            .cloned()
            .collect();
        let gsis: Vec<Arc<GsiRt>> = rt
            .gsi_list()
            .iter()
            .filter(|g| !g.broken.load(Ordering::Relaxed))
            .cloned()
            .collect();
        let mut fds = vec![rt.waker.fd(), async_fd];
        fds.extend(cqs.iter().map(|c| c.hw.fd()));
        fds.extend(gsis.iter().map(|g| g.fd()));
        let ready = match sys::poll_readable(&fds, -1) {
            Ok(r) => r,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(device = %rt.dev.name(), "poll on the event descriptors: {e}");
                std::thread::sleep(std::time::Duration::from_millis(100));
                continue;
            }
        };
        if ready[0] != Ready::No {
            rt.waker.drain();
        }
        if rt.removal.swap(false, Ordering::AcqRel) {
            on_async(
                rt,
                st,
                AsyncEventInfo {
                    kind: event::DEVICE_FATAL,
                    element: Element::Device,
                },
            );
        }
        match ready[1] {
            Ready::No => {}
            Ready::Readable => {
                let mut n = 0;
                while let Some(ev) = rt.dev.next_async_event() {
                    n += 1;
                    on_async(rt, st, ev);
                }
                if n == 0 {
                    // Readable with nothing to read: the device is gone.
                    async_fd = -1;
                }
            }
            Ready::Broken => async_fd = -1,
        }
        for (g, r) in gsis.iter().zip(&ready[2 + cqs.len()..]) {
            match r {
                Ready::Readable if g.drain() => notify(rt, st, &g.recv_cq),
                Ready::Broken => g.broken.store(true, Ordering::Relaxed),
                _ => {}
            }
        }
        // GSI completions that fired an arm in a verb (sends).
        for cq in &cqs {
            if cq.take_soft_fired() {
                notify(rt, st, cq);
            }
        }
        // One event per CQ and round: a CQ fires once per arm, and a
        // second read would mostly find nothing (a system call each
        // time); one still pending makes the next poll return at once.
        for (cq, r) in cqs.iter().zip(&ready[2..]) {
            match r {
                Ready::Readable if cq.hw.take_event() => on_cq_event(rt, st, cq),
                Ready::Readable | Ready::Broken => cq.broken.store(true, Ordering::Relaxed),
                Ready::No => {}
            }
        }
    }
}

fn on_cq_event(rt: &CaRt, st: &Mutex<State>, cq: &CqRt) {
    if cq.on_event() {
        notify(rt, st, cq);
    }
}

/// Calls the consumer's completion handler of `cq`, if it is still there.
fn notify(rt: &CaRt, st: &Mutex<State>, cq: &CqRt) {
    let key = cq.key;
    dispatch(
        rt,
        st,
        |s| s.by_key(key).map(|(h, _)| (h, cq.ctx)),
        |ctx| rt.handler.on_completion(ctx),
    );
}

/// The verbs event of a device event (`None`: not one the verbs name).
fn kind_of(kind: u32) -> Option<AsyncEventKind> {
    use AsyncEventKind::*;
    Some(match kind {
        // A QP the device took to ERR: the verbs have one fatal event for
        // the three IBA names (11.6.3.1: catastrophic, invalid request,
        // access violation).
        event::QP_FATAL | event::QP_REQ_ERR | event::QP_ACCESS_ERR => QpFatal,
        event::COMM_EST => CommEstablished,
        event::SQ_DRAINED => SqDrained,
        event::PATH_MIG => PathMigrated,
        event::CQ_ERR => CqError,
        event::SRQ_LIMIT_REACHED => SrqLimitReached,
        event::PORT_ACTIVE => PortActive,
        event::PORT_ERR => PortDown,
        event::LID_CHANGE => LidChange,
        event::PKEY_CHANGE => PkeyChange,
        // Client reregistration (IBA 14.4.11) asks SA clients to register
        // again, as an SM change does.
        event::SM_CHANGE | event::CLIENT_REREGISTER => SmChange,
        event::DEVICE_FATAL => CaRemoval,
        _ => return None,
    })
}

fn on_async(rt: &CaRt, st: &Mutex<State>, ev: AsyncEventInfo) {
    if ev.kind == event::GID_CHANGE {
        rt.gids_changed();
        return;
    }
    let Some(kind) = kind_of(ev.kind) else {
        tracing::debug!(device = %rt.dev.name(), kind = ev.kind, element = ?ev.element, "async event not passed on");
        return;
    };
    let ca = rt.handle.get().copied();
    let event = |ctx, port| AsyncEvent { kind, ctx, port };
    let find = |s: &State| match ev.element {
        Element::Qp(key) | Element::Cq(key) | Element::Srq(key) => {
            let (h, i) = s.by_key(key)?;
            let ctx = match s.obj(i) {
                Obj::Qp(q) => q.ctx,
                Obj::Cq { cq, .. } => cq.ctx,
                Obj::Srq { ctx, .. } => *ctx,
                _ => return None,
            };
            Some((h, event(ctx, None)))
        }
        // Port and device events are the CA open's: called back for it.
        Element::Port(p) => {
            let h = ca?;
            s.objs.slot(h).ok()?;
            Some((h, event(0, Some(PortNum(p)))))
        }
        Element::Device => {
            let h = ca?;
            s.objs.slot(h).ok()?;
            Some((h, event(rt.ctx, None)))
        }
    };
    dispatch(rt, st, find, |e| rt.handler.on_async_event(e));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_events_map_to_the_verbs_ones() {
        assert_eq!(kind_of(event::QP_ACCESS_ERR), Some(AsyncEventKind::QpFatal));
        assert_eq!(kind_of(event::QP_REQ_ERR), Some(AsyncEventKind::QpFatal));
        assert_eq!(kind_of(event::PORT_ERR), Some(AsyncEventKind::PortDown));
        assert_eq!(
            kind_of(event::PORT_ACTIVE),
            Some(AsyncEventKind::PortActive)
        );
        assert_eq!(
            kind_of(event::DEVICE_FATAL),
            Some(AsyncEventKind::CaRemoval)
        );
        assert_eq!(
            kind_of(event::CLIENT_REREGISTER),
            Some(AsyncEventKind::SmChange)
        );
        assert_eq!(
            kind_of(event::SRQ_LIMIT_REACHED),
            Some(AsyncEventKind::SrqLimitReached)
        );
        assert_eq!(kind_of(event::CQ_ERR), Some(AsyncEventKind::CqError));
        assert_eq!(kind_of(event::QP_LAST_WQE_REACHED), None);
        assert_eq!(kind_of(event::PATH_MIG_ERR), None);
        assert_eq!(kind_of(99), None);
    }
}
