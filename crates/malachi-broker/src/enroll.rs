//! Enrollment: how a broker without a certificate becomes a member of a secure cluster
//! (docs/security.md).
//!
//! The joiner connects to a seed over TLS without a certificate (a *stranger*, which may make
//! this one call and nothing else) and sends its node id with a proof that it knows the
//! cluster's join token: an HMAC of the token over the TLS session's exporter value. The seed
//! checks the proof against its own token and answers with the cluster CA, a certificate for
//! the joiner's node id, and its own proof of the token over the same session, which the
//! joiner checks before it trusts anything in the answer. Both proofs are bound to the session,
//! so a man in the middle (who holds two sessions, one with each side) can relay neither, and a
//! stranger without the token learns nothing: the seed says only that the proof is wrong.

use malachi_transport::Transport;
use malachi_transport::pki::{self, ClusterCa, ClusterFiles, Credentials};
use serde::{Deserialize, Serialize};

use crate::node::Broker;
use crate::peer::PeerCall;

/// How long an enrollment may take (a certificate is signed on the seed).
const ENROLL_TIMEOUT_MS: u64 = 5_000;

/// A joiner's enrollment request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrollRequest {
    /// The node id the joiner's certificate will name.
    pub node_id: u64,
    /// Where the joiner's inter-node port is: a node id registered at another address is taken.
    pub cluster_address: String,
    /// `pki::proof(token, JOINER_ROLE, binding)`.
    pub proof: [u8; 32],
}

/// The seed's answer: everything a member keeps in `<data dir>/cluster/`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Enrolled {
    /// `pki::proof(token, SEED_ROLE, binding)`: the joiner checks it before using the rest.
    pub seed_proof: [u8; 32],
    pub cluster_id: String,
    /// The cluster CA with its key: every member may admit the next broker.
    pub ca: Credentials,
    /// The joiner's certificate and key.
    pub node: Credentials,
}

/// Answers a stranger's enrollment with `broker`'s CA, or says why not (a wrong token, a taken
/// node id, a broker whose operator brought the certificates and which so holds no CA key).
pub(crate) async fn answer(
    broker: &Broker,
    binding: [u8; 32],
    request: EnrollRequest,
) -> Result<Vec<u8>, String> {
    let files = broker.cluster_files.as_ref().ok_or(NOT_A_SEED)?;
    let token = files.read_token().map_err(|error| error.to_string())?.ok_or(NOT_A_SEED)?;
    if !pki::proof_matches(&token, pki::JOINER_ROLE, &binding, &request.proof) {
        tracing::warn!(
            node_id = request.node_id,
            "an enrollment with a wrong cluster token was refused"
        );
        return Err(WRONG_TOKEN.to_string());
    }
    let registered = broker
        .admin
        .read(|admin| admin.0.broker(request.node_id).map(|known| known.cluster_address.clone()));
    match registered {
        Some(address) if address != request.cluster_address => {
            return Err(format!(
                "node id {} is taken by the broker at {address}; start the new broker with \
                 another --node-id (MALACHI_NODE_ID)",
                request.node_id
            ));
        }
        // A registered broker never enrolls again: its data directory keeps its certificate.
        // One that does lost its directory, and with it the Raft logs the others count on; as
        // the same voter it would make their logs run backwards (openraft stops a leader that
        // sees that).
        Some(_) => {
            tracing::warn!(node_id = request.node_id, "a registered broker enrolled again");
            return Err(format!(
                "node id {id} is registered, and this broker comes with an empty data directory: \
                 a broker that lost its directory cannot rejoin as the same member. Remove it \
                 first (malachi cluster remove {id} --force, through another broker) or start it \
                 with another --node-id (MALACHI_NODE_ID)",
                id = request.node_id
            ));
        }
        None => {}
    }
    let cluster_id = broker.cluster.as_ref().map(|(_, id)| id.clone()).unwrap_or_default();
    let ca = files.read_ca(&cluster_id).map_err(|error| error.to_string())?.ok_or(NOT_A_SEED)?;
    let node = ca.issue(request.node_id).map_err(|error| error.to_string())?;
    tracing::info!(node_id = request.node_id, "enrolled a broker: issued its certificate");
    let enrolled = Enrolled {
        seed_proof: pki::proof(&token, pki::SEED_ROLE, &binding),
        cluster_id,
        ca: ca.credentials,
        node,
    };
    serde_json::to_vec(&enrolled).map_err(|error| error.to_string())
}

const NOT_A_SEED: &str = "this broker cannot admit brokers (its operator brought the cluster \
                          certificates, so it holds no CA key): enroll through another seed";
/// The reason a wrong token gets; the cluster tests and the CLI look for it.
pub const WRONG_TOKEN: &str =
    "wrong cluster token: start the broker with the cluster's MALACHI_CLUSTER_TOKEN";

/// Enrolls node `node_id` through the seed at `seed` with `token` and writes what it received
/// to `files`: the joiner's side.
pub async fn enroll_through(
    transport: &Transport,
    seed: &str,
    token: &str,
    cluster_address: &str,
    files: &ClusterFiles,
) -> Result<ClusterCa, String> {
    let node_id = transport.node_id();
    let make = |binding: [u8; 32]| {
        PeerCall::Enroll(EnrollRequest {
            node_id,
            cluster_address: cluster_address.to_string(),
            proof: pki::proof(token, pki::JOINER_ROLE, &binding),
        })
        .encode()
    };
    let timeout = std::time::Duration::from_millis(ENROLL_TIMEOUT_MS);
    let (_, binding, answer) = transport
        .call_as_stranger(seed, make, timeout)
        .await
        .map_err(|error| format!("{seed}: {error}"))?;
    let enrolled: Enrolled = serde_json::from_slice(&answer)
        .map_err(|error| format!("{seed}: malformed enrollment answer: {error}"))?;
    if !pki::proof_matches(token, pki::SEED_ROLE, &binding, &enrolled.seed_proof) {
        return Err(format!(
            "{seed}: the seed does not know the cluster token (or someone is in between): \
             nothing it sent was used"
        ));
    }
    files
        .write(&enrolled.ca, &enrolled.node, token)
        .map_err(|error| format!("writing the cluster credentials: {error}"))?;
    Ok(ClusterCa { cluster_id: enrolled.cluster_id, credentials: enrolled.ca })
}
