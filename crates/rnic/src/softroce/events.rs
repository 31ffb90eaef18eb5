//! Completions and affiliated events: the route of each QP to its CQs and
//! owner, drained from the node on the NIC thread.

use super::*;

/// Where a QP's completions go; read by the driver thread's callback.
#[derive(Clone)]
pub(super) struct Route {
    /// The callbacks of the CA open that created the QP.
    pub(super) handler: Arc<dyn EventHandler>,
    pub(super) send_cq: (Arc<Cq>, Context),
    pub(super) recv_cq: (Arc<Cq>, Context),
    pub(super) ctx: Context,
    /// The consumer asked for ERR: no QpFatal event.
    pub(super) quiet_error: bool,
}

impl CaRt {
    /// Moves a QP's completions from the node to its CQs and tells the
    /// consumer; runs on the driver thread with no lock of ours held when
    /// the handler is called.
    pub(super) fn deliver(&self, qp: softroce::QpHandle) {
        let Some(route) = self.routes_lock().get(&qp.0.value()).cloned() else {
            return;
        };
        let (completions, events) = self.node(|n| {
            let mut c = Vec::new();
            while let Some(x) = n.poll_completion_with_pkey(qp) {
                c.push(x);
            }
            let mut e = Vec::new();
            while let Some(x) = n.poll_event(qp) {
                e.push(x);
            }
            (c, e)
        });
        let mut notify = Vec::new();
        // Datagram receives say which entry their P_Key matched.
        let table = completions
            .iter()
            .any(|(_, k)| k.is_some())
            .then(|| self.pkey_table());
        // The engine reports an unsignaled send only when it fails, so
        // every completion here is the consumer's (`send_wqe` gives the
        // engine each WR's signaled flag).
        for (c, pkey) in completions {
            let mut wc = WorkCompletion::new(c.wr_id, c.status, c.opcode, route.ctx);
            wc.byte_len = c.byte_len;
            if let Some(imm) = c.imm {
                wc.imm = imm;
                wc.wc_flags = wc.wc_flags | WcFlags::WITH_IMM;
            }
            if let Some(k) = c.invalidated {
                wc.invalidated_rkey = k;
                wc.wc_flags = wc.wc_flags | WcFlags::WITH_INV;
            }
            if let Some(src) = c.src_qp {
                wc.src_qp = src;
            }
            if c.grh {
                wc.wc_flags = wc.wc_flags | WcFlags::GRH;
            }
            if let (Some(k), Some(t)) = (pkey, &table) {
                wc.pkey_index = pkey_index_of(t, k).unwrap_or(0);
            }
            let (cq, ctx) = if c.is_recv {
                &route.recv_cq
            } else {
                &route.send_cq
            };
            let r = cq.push(wc, c.solicited);
            if r.notify {
                notify.push(*ctx);
            }
            if r.overflow {
                route.handler.on_async_event(AsyncEvent {
                    kind: AsyncEventKind::CqError,
                    ctx: *ctx,
                    port: None,
                });
            }
        }
        for ctx in notify {
            route.handler.on_completion(ctx);
        }
        for e in events {
            let kind = match e {
                roce::QpEvent::CommEstablished => AsyncEventKind::CommEstablished,
                roce::QpEvent::Error(_) if route.quiet_error => continue,
                roce::QpEvent::Error(_) => AsyncEventKind::QpFatal,
                roce::QpEvent::SqDrained => AsyncEventKind::SqDrained,
                roce::QpEvent::LastWqeReached => continue,
            };
            route.handler.on_async_event(AsyncEvent {
                kind,
                ctx: route.ctx,
                port: None,
            });
        }
    }

    pub(super) fn routes_lock(&self) -> MutexGuard<'_, HashMap<u32, Route>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }
}
