//! Who may make which call, and which code answers it: the one place a call from a peer enters
//! the broker. The caller is the node the connection's certificate names (a *member*), or a
//! *stranger* without one, which may only enroll with the cluster token. Checks that need the
//! broker's metadata (a Raft sender's membership, a replicated batch's primary, a settle's seal
//! point) are made by the answering code, named here.

use std::sync::{Arc, Weak};

use malachi_transport::{Caller, Handler, HandlerFuture, Request};

use super::{DataCall, PeerCall, json};
use crate::data::SegmentKey;
use crate::node::Broker;

/// Answers the calls peers make to this broker.
pub struct PeerHandler(pub Weak<Broker>);

/// What a stranger is told when it calls anything but the enrollment.
pub const STRANGERS_ENROLL_ONLY: &str =
    "a broker without the cluster's certificate may only enroll, with the cluster token";

/// The handler a broker installs on its transport.
pub fn peer_handler(broker: &Arc<Broker>) -> Arc<dyn Handler> {
    Arc::new(PeerHandler(Arc::downgrade(broker)))
}

impl Handler for PeerHandler {
    fn handle(&self, caller: Caller, request: Request) -> HandlerFuture {
        let broker = self.0.upgrade();
        Box::pin(async move {
            let broker = broker.ok_or_else(|| "this broker is shutting down".to_string())?;
            match caller {
                // Nothing but an enrollment of a stranger is even decoded.
                Caller::Stranger { binding } => match PeerCall::decode_enrollment(request) {
                    Some(enroll) => {
                        let enroll = enroll.map_err(|error| error.to_string())?;
                        crate::enroll::answer(&broker, binding, enroll).await
                    }
                    None => Err(STRANGERS_ENROLL_ONLY.to_string()),
                },
                Caller::Member(sender) => {
                    let call = PeerCall::decode(request).map_err(|error| error.to_string())?;
                    dispatch(&broker, sender, call).await
                }
            }
        })
    }
}

/// Answers `call` from member `sender`.
async fn dispatch(broker: &Broker, sender: u64, call: PeerCall) -> Result<Vec<u8>, String> {
    match call {
        // Only from a member of the group, with leader and candidate ids its own.
        PeerCall::Raft { group_id, kind, body } => {
            broker.answer_raft(sender, group_id, kind, &body).await
        }
        PeerCall::Welcome => Ok(json(&broker.welcome())),
        // A broker registers itself only.
        PeerCall::Join(record) => broker.answer_join(sender, record).await,
        PeerCall::AddMember(add) => broker.add_to_group(add).await.map(|()| Vec::new()),
        PeerCall::Coordinate { group_id, ask } => {
            broker.coordination.answer_coordination(group_id, ask).await
        }
        PeerCall::Enroll(_) => Err("a member holds its certificate and enrolls no more".into()),
        // A broker speaks for itself only: the notice is the sender's.
        PeerCall::Draining { draining } => {
            broker.handover.note(sender, draining);
            Ok(Vec::new())
        }
        PeerCall::HandOver { draining } => Ok(json(&broker.handover.drain(draining).await)),
        PeerCall::Data { key, call } => answer_data(broker, sender, key, call).await,
    }
}

/// Answers a data call on this broker's copy of `key`.
async fn answer_data(
    broker: &Broker,
    sender: u64,
    key: SegmentKey,
    call: DataCall,
) -> Result<Vec<u8>, String> {
    broker.catch_up_on(key).await;
    Ok(match call {
        DataCall::Append { records } => broker.answer_append(key, records).await,
        DataCall::Read { from, wanted, bytes_max } => {
            broker.answer_read(key, from, wanted, bytes_max).await
        }
        DataCall::End => broker.answer_end(key).await,
        DataCall::Seal => broker.answer_seal(key).await,
        DataCall::Create => broker.answer_create(key).await,
        // Only from the segment's recorded primary.
        DataCall::Replicate { start, acked_end, records } => {
            broker.replicator.replicate_here(sender, key, start, acked_end, records).await
        }
        DataCall::Fence => broker.replicator.answer_fence(key).await,
        // Only from a copy metadata records.
        DataCall::Fill { source, end } => {
            return broker.replicator.answer_fill(key, source, end).await;
        }
        DataCall::SealAt { end } => broker.replicator.answer_seal_at(key, end).await,
        DataCall::ReadRaw { from, wanted, bytes_max: _ } => {
            broker.replicator.answer_read_raw(key, from, wanted).await
        }
        // At the seal point metadata records, from copies it records.
        DataCall::Settle { seal, sources } => {
            return broker.healer.answer_settle(key, seal, sources).await;
        }
        DataCall::CopyState => broker.observer.answer_copy_state(key).await,
    })
}
