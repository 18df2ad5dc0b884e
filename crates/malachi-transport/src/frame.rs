//! The bytes on an inter-node connection: a hello each way, then length-prefixed frames. Pure
//! encoding and decoding, no I/O; specified in docs/cluster.md ("The inter-node transport").
//!
//! All integers are little-endian. Under TLS (the default) these bytes travel inside the TLS
//! session; the certificate, not the hello, says which node is at the other end.
//!
//! * hello (the caller's, first): `magic` "MLCN", `generation` u8 (2: this layout; 1 was the
//!   earlier release's, which a broker of this one refuses by name), `version_min` u16,
//!   `version_max` u16 (the protocol versions this broker speaks), `node_id` u64, cluster id as
//!   `len` u8 + UTF-8 (empty: a broker that has not joined a cluster yet).
//! * the answer to a hello: `status` u8; 0, then the `version` u16 both sides speak from now on
//!   (the highest both know) and the answering broker's own hello; 1, then a refusal reason as
//!   `len` u16 + UTF-8.
//! * frame: `len` u32 (of what follows, at most the connection's frame limit), `tag` u8, `id`
//!   u64, then for tag 1 (request) `service` u8, `group_id` u64, `kind` u8 and the payload; for
//!   tag 2 (answer) the payload; for tag 3 (failure) a UTF-8 reason. No frame names its
//!   sender: the receiving broker takes it from the connection.

use std::ops::RangeInclusive;

/// The first bytes a broker sends on an inter-node connection.
pub const MAGIC: [u8; 4] = *b"MLCN";
/// The layout of the hello and frames this file describes. The earlier release sent its single
/// protocol version (1) in this byte.
pub const GENERATION: u8 = 2;
/// The protocol versions this build speaks. A rolling upgrade mixes two releases: each side
/// offers its range and both speak the highest version they share, so a release that adds
/// version N+1 still speaks N to the brokers not yet upgraded.
pub const VERSIONS: RangeInclusive<u16> = 2..=2;
/// The largest frame body between members: a Raft snapshot of a big vnode fits, a corrupt
/// length does not allocate gigabytes.
pub const FRAME_BYTES_MAX: u32 = 256 << 20;
/// The largest frame body from a broker that is not a member yet (a join): it sends a few
/// hundred bytes, and nothing it declares is buffered beyond this.
pub const STRANGER_FRAME_BYTES_MAX: u32 = 64 << 10;
/// A cluster id is 32 hexadecimal digits; anything much longer is not one.
pub const CLUSTER_ID_BYTES_MAX: usize = 64;
/// A refusal reason longer than this is cut.
pub const REASON_BYTES_MAX: usize = 1024;

const TAG_REQUEST: u8 = 1;
const TAG_ANSWER: u8 = 2;
const TAG_FAILURE: u8 = 3;
/// tag + id.
const FRAME_HEADER_BYTES: usize = 1 + 8;
/// tag + id + service + group_id + kind.
const REQUEST_HEADER_BYTES: usize = FRAME_HEADER_BYTES + 1 + 8 + 1;

/// Who says it is at the other end of a connection, and which protocol versions it speaks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
    pub versions: RangeInclusive<u16>,
    pub node_id: u64,
    /// Empty for a node that has not joined a cluster yet.
    pub cluster_id: String,
}

/// What a request is for; each service has its own handler on the receiving broker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Service {
    /// A Raft message of group `group_id` (`kind` is a `malachi_consensus::MessageKind`).
    Raft = 1,
    /// A cluster control call: join, address exchange (`kind` names it).
    Cluster = 2,
    /// A segment operation forwarded to the broker holding the segment: append, read, end.
    Data = 3,
}

impl Service {
    fn from_code(code: u8) -> Option<Service> {
        match code {
            1 => Some(Service::Raft),
            2 => Some(Service::Cluster),
            3 => Some(Service::Data),
            _ => None,
        }
    }
}

/// One call from a broker to a peer. The sender is not part of it: the receiver knows it from
/// the connection ([`crate::Caller`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub service: Service,
    pub group_id: u64,
    pub kind: u8,
    pub payload: Vec<u8>,
}

/// One frame on a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Request {
        id: u64,
        request: Request,
    },
    /// The handler's answer to request `id`.
    Answer {
        id: u64,
        payload: Vec<u8>,
    },
    /// Request `id` failed on the peer (no such group, not started, refused...).
    Failure {
        id: u64,
        reason: String,
    },
}

/// Why bytes from a peer are not a frame or a hello. The connection is closed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("not a Malachi inter-node connection (bad magic)")]
    BadMagic,
    #[error(
        "the peer speaks the inter-node protocol of another release (layout {0}, this broker's \
         is {GENERATION}); upgrade it, or this broker"
    )]
    Generation(u8),
    #[error("the peer offers protocol versions {min}..={max}, this broker speaks {VERSIONS:?}")]
    NoCommonVersion { min: u16, max: u16 },
    #[error("protocol version range {min}..={max} is empty")]
    BadVersions { min: u16, max: u16 },
    #[error("frame of {len} bytes is larger than this connection's limit of {max}")]
    TooLarge { len: u64, max: u32 },
    #[error("truncated {0}")]
    Truncated(&'static str),
    #[error("unknown frame tag {0}")]
    Tag(u8),
    #[error("unknown service {0}")]
    Service(u8),
    #[error("text is not UTF-8")]
    Text,
    #[error("cluster id of {0} bytes")]
    ClusterId(usize),
}

/// The fixed part of a hello: magic, generation, versions, node id, cluster id length.
pub const HELLO_FIXED_BYTES: usize = 4 + 1 + 2 + 2 + 8 + 1;

pub fn encode_hello(hello: &Hello) -> Vec<u8> {
    let id = hello.cluster_id.as_bytes();
    assert!(id.len() <= CLUSTER_ID_BYTES_MAX, "cluster ids are checked where they are made");
    assert!(!hello.versions.is_empty(), "a broker speaks at least one version");
    let mut out = Vec::with_capacity(HELLO_FIXED_BYTES + id.len());
    out.extend_from_slice(&MAGIC);
    out.push(GENERATION);
    out.extend_from_slice(&hello.versions.start().to_le_bytes());
    out.extend_from_slice(&hello.versions.end().to_le_bytes());
    out.extend_from_slice(&hello.node_id.to_le_bytes());
    out.push(id.len() as u8);
    out.extend_from_slice(id);
    out
}

/// What the fixed part of a hello says: versions, node id, and how many cluster id bytes
/// follow.
pub fn decode_hello_fixed(
    fixed: &[u8; HELLO_FIXED_BYTES],
) -> Result<(RangeInclusive<u16>, u64, usize), FrameError> {
    if fixed[..4] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    if fixed[4] != GENERATION {
        return Err(FrameError::Generation(fixed[4]));
    }
    let min = u16::from_le_bytes([fixed[5], fixed[6]]);
    let max = u16::from_le_bytes([fixed[7], fixed[8]]);
    if min > max {
        return Err(FrameError::BadVersions { min, max });
    }
    let node_id = u64::from_le_bytes(fixed[9..17].try_into().expect("8 bytes"));
    let id_len = usize::from(fixed[17]);
    if id_len > CLUSTER_ID_BYTES_MAX {
        return Err(FrameError::ClusterId(id_len));
    }
    Ok((min..=max, node_id, id_len))
}

/// The version two brokers speak: the highest both know.
pub fn common_version(
    ours: &RangeInclusive<u16>,
    theirs: &RangeInclusive<u16>,
) -> Result<u16, FrameError> {
    let version = (*ours.end()).min(*theirs.end());
    if version >= *ours.start() && version >= *theirs.start() {
        Ok(version)
    } else {
        Err(FrameError::NoCommonVersion { min: *theirs.start(), max: *theirs.end() })
    }
}

/// The answering side's acceptance: the version chosen, then its hello.
pub fn encode_welcome_hello(version: u16, hello: &Hello) -> Vec<u8> {
    let mut out = vec![0u8];
    out.extend_from_slice(&version.to_le_bytes());
    out.extend_from_slice(&encode_hello(hello));
    out
}

/// The answering side's refusal, with its reason (cut to [`REASON_BYTES_MAX`]).
pub fn encode_refusal(reason: &str) -> Vec<u8> {
    let mut end = reason.len().min(REASON_BYTES_MAX);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = vec![1u8];
    out.extend_from_slice(&(end as u16).to_le_bytes());
    out.extend_from_slice(&reason.as_bytes()[..end]);
    out
}

pub fn decode_text(bytes: Vec<u8>) -> Result<String, FrameError> {
    String::from_utf8(bytes).map_err(|_| FrameError::Text)
}

/// A frame with its length prefix.
pub fn encode_frame(frame: &Frame) -> Vec<u8> {
    let mut out = vec![0u8; 4];
    match frame {
        Frame::Request { id, request } => {
            out.reserve(REQUEST_HEADER_BYTES + request.payload.len());
            out.push(TAG_REQUEST);
            out.extend_from_slice(&id.to_le_bytes());
            out.push(request.service as u8);
            out.extend_from_slice(&request.group_id.to_le_bytes());
            out.push(request.kind);
            out.extend_from_slice(&request.payload);
        }
        Frame::Answer { id, payload } => {
            out.reserve(FRAME_HEADER_BYTES + payload.len());
            out.push(TAG_ANSWER);
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(payload);
        }
        Frame::Failure { id, reason } => {
            out.push(TAG_FAILURE);
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(reason.as_bytes());
        }
    }
    let body = u32::try_from(out.len() - 4).expect("callers bound payloads below 4 GiB");
    out[..4].copy_from_slice(&body.to_le_bytes());
    out
}

/// Checks a frame's length prefix against the connection's limit before anything is allocated
/// for its body.
pub fn frame_body_len(prefix: [u8; 4], max: u32) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(prefix);
    if len > max {
        return Err(FrameError::TooLarge { len: u64::from(len), max });
    }
    Ok(len as usize)
}

/// Decodes a frame body (what follows the length prefix).
pub fn decode_frame(mut body: Vec<u8>) -> Result<Frame, FrameError> {
    if body.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Truncated("frame header"));
    }
    let tag = body[0];
    let id = u64::from_le_bytes(body[1..9].try_into().expect("8 bytes"));
    match tag {
        TAG_REQUEST => {
            if body.len() < REQUEST_HEADER_BYTES {
                return Err(FrameError::Truncated("request header"));
            }
            let service = Service::from_code(body[9]).ok_or(FrameError::Service(body[9]))?;
            let group_id = u64::from_le_bytes(body[10..18].try_into().expect("8 bytes"));
            let kind = body[18];
            let payload = body.split_off(REQUEST_HEADER_BYTES);
            Ok(Frame::Request { id, request: Request { service, group_id, kind, payload } })
        }
        TAG_ANSWER => Ok(Frame::Answer { id, payload: body.split_off(FRAME_HEADER_BYTES) }),
        TAG_FAILURE => {
            Ok(Frame::Failure { id, reason: decode_text(body.split_off(FRAME_HEADER_BYTES))? })
        }
        other => Err(FrameError::Tag(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(bytes: &[u8]) -> [u8; HELLO_FIXED_BYTES] {
        bytes[..HELLO_FIXED_BYTES].try_into().unwrap()
    }

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Request {
                id: 7,
                request: Request {
                    service: Service::Raft,
                    group_id: u64::MAX,
                    kind: 4,
                    payload: b"entries".to_vec(),
                },
            },
            Frame::Request {
                id: 0,
                request: Request {
                    service: Service::Cluster,
                    group_id: 0,
                    kind: 1,
                    payload: Vec::new(),
                },
            },
            Frame::Answer { id: 9, payload: vec![0; 1000] },
            Frame::Answer { id: 10, payload: Vec::new() },
            Frame::Failure { id: 11, reason: "group 5 is not open here".into() },
        ];
        for frame in frames {
            let bytes = encode_frame(&frame);
            let len = frame_body_len(bytes[..4].try_into().unwrap(), FRAME_BYTES_MAX).unwrap();
            assert_eq!(len, bytes.len() - 4);
            assert_eq!(decode_frame(bytes[4..].to_vec()).unwrap(), frame);
            // Every strict prefix of a body is refused or decodes to something shorter, never
            // panics.
            for cut in 0..bytes.len() - 4 {
                let _ = decode_frame(bytes[4..4 + cut].to_vec());
            }
        }
    }

    #[test]
    fn bad_frames_are_named() {
        let cases: &[(&[u8], FrameError)] = &[
            (&[1, 0, 0], FrameError::Truncated("frame header")),
            (&[1, 0, 0, 0, 0, 0, 0, 0, 0, 2], FrameError::Truncated("request header")),
            (&[9, 0, 0, 0, 0, 0, 0, 0, 0], FrameError::Tag(9)),
            (&[3, 0, 0, 0, 0, 0, 0, 0, 0, 0xff], FrameError::Text),
        ];
        for (bytes, expected) in cases {
            assert_eq!(&decode_frame(bytes.to_vec()).unwrap_err(), expected, "{bytes:?}");
        }
        let mut request = encode_frame(&Frame::Request {
            id: 1,
            request: Request { service: Service::Raft, group_id: 0, kind: 1, payload: Vec::new() },
        });
        request[4 + 9] = 77;
        assert_eq!(decode_frame(request[4..].to_vec()).unwrap_err(), FrameError::Service(77));
        // The limit is the connection's: a stranger's is far below a member's.
        for max in [STRANGER_FRAME_BYTES_MAX, FRAME_BYTES_MAX] {
            let over = (max + 1).to_le_bytes();
            assert_eq!(
                frame_body_len(over, max).unwrap_err(),
                FrameError::TooLarge { len: u64::from(max) + 1, max }
            );
            assert_eq!(frame_body_len(max.to_le_bytes(), max).unwrap(), max as usize);
        }
    }

    #[test]
    fn hellos_round_trip_and_refuse_strangers() {
        for cluster_id in ["", "0123456789abcdef0123456789abcdef"] {
            let hello = Hello { versions: 2..=5, node_id: 42, cluster_id: cluster_id.into() };
            let bytes = encode_hello(&hello);
            let (versions, node_id, id_len) = decode_hello_fixed(&fixed(&bytes)).unwrap();
            assert_eq!((versions, node_id, id_len), (2..=5, 42, cluster_id.len()));
            assert_eq!(decode_text(bytes[HELLO_FIXED_BYTES..].to_vec()).unwrap(), cluster_id);
        }
        let hello = |versions| Hello { versions, node_id: 1, cluster_id: String::new() };
        let mut http = [0u8; HELLO_FIXED_BYTES];
        http[..4].copy_from_slice(b"GET ");
        assert_eq!(decode_hello_fixed(&http).unwrap_err(), FrameError::BadMagic);
        // The earlier release's hello: magic, version 1, node id.
        let mut earlier = encode_hello(&hello(2..=2));
        earlier[4] = 1;
        assert_eq!(decode_hello_fixed(&fixed(&earlier)).unwrap_err(), FrameError::Generation(1));
        let mut backwards = encode_hello(&hello(2..=2));
        backwards[5..7].copy_from_slice(&3u16.to_le_bytes());
        assert_eq!(
            decode_hello_fixed(&fixed(&backwards)).unwrap_err(),
            FrameError::BadVersions { min: 3, max: 2 }
        );
        let mut long = encode_hello(&hello(2..=2));
        long[17] = (CLUSTER_ID_BYTES_MAX + 1) as u8;
        assert_eq!(
            decode_hello_fixed(&fixed(&long)).unwrap_err(),
            FrameError::ClusterId(CLUSTER_ID_BYTES_MAX + 1)
        );
    }

    #[test]
    fn two_brokers_speak_the_highest_version_both_know() {
        // (ours, theirs, agreed)
        let cases = [
            (2..=2, 2..=2, Some(2)),
            (2..=3, 2..=2, Some(2)),
            (2..=2, 2..=3, Some(2)),
            (2..=4, 3..=5, Some(4)),
            (3..=3, 2..=2, None),
            (2..=2, 3..=4, None),
        ];
        for (ours, theirs, agreed) in cases {
            assert_eq!(common_version(&ours, &theirs).ok(), agreed, "{ours:?} {theirs:?}");
            assert_eq!(common_version(&theirs, &ours).ok(), agreed, "symmetric");
        }
    }

    #[test]
    fn refusals_are_cut_on_a_character_boundary() {
        let long = "é".repeat(REASON_BYTES_MAX);
        let refusal = encode_refusal(&long);
        let len = usize::from(u16::from_le_bytes([refusal[1], refusal[2]]));
        assert!(len <= REASON_BYTES_MAX);
        assert!(std::str::from_utf8(&refusal[3..]).is_ok());
        assert_eq!(refusal.len(), 3 + len);
    }
}
