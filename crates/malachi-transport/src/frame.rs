//! The bytes on an inter-node connection: a handshake each way, then length-prefixed frames.
//! Pure encoding and decoding, no I/O; specified in docs/cluster.md ("The inter-node transport").
//!
//! All integers are little-endian.
//!
//! * hello (both ways, first): `magic` "MLCN", `version` u8, `node_id` u64, cluster id as `len`
//!   u8 + UTF-8 (empty: a node that has not joined a cluster yet). The answering side sends
//!   `status` u8 first: 0, then its own hello; 1, then a refusal reason as `len` u16 + UTF-8.
//! * frame: `len` u32 (of what follows, at most [`FRAME_BYTES_MAX`]), `tag` u8, `id` u64, then
//!   for tag 1 (request) `service` u8, `group_id` u64, `kind` u8, `source_node_id` u64 and the
//!   payload; for tag 2 (answer) the payload; for tag 3 (failure) a UTF-8 reason.

/// The first bytes a broker sends on an inter-node connection.
pub const MAGIC: [u8; 4] = *b"MLCN";
/// Bumped when the layout changes; a peer speaking another version is refused.
pub const VERSION: u8 = 1;
/// The largest frame body: a Raft snapshot of a big vnode fits, a corrupt length does not
/// allocate gigabytes.
pub const FRAME_BYTES_MAX: u32 = 256 << 20;
/// A cluster id is 32 hexadecimal digits; anything much longer is not one.
pub const CLUSTER_ID_BYTES_MAX: usize = 64;

const TAG_REQUEST: u8 = 1;
const TAG_ANSWER: u8 = 2;
const TAG_FAILURE: u8 = 3;
/// tag + id + service + group_id + kind + source_node_id.
const REQUEST_HEADER_BYTES: usize = 1 + 8 + 1 + 8 + 1 + 8;

/// Who is at the other end of a connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hello {
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

/// One call from a broker to a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub service: Service,
    pub group_id: u64,
    pub kind: u8,
    pub source_node_id: u64,
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
    /// Request `id` failed on the peer (no such group, not started, ...).
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
    #[error("inter-node protocol version {0}, this broker speaks {VERSION}")]
    Version(u8),
    #[error("frame of {0} bytes is larger than {FRAME_BYTES_MAX}")]
    TooLarge(u64),
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

pub fn encode_hello(hello: &Hello) -> Vec<u8> {
    let id = hello.cluster_id.as_bytes();
    assert!(id.len() <= CLUSTER_ID_BYTES_MAX, "cluster ids are checked where they are made");
    let mut out = Vec::with_capacity(4 + 1 + 8 + 1 + id.len());
    out.extend_from_slice(&MAGIC);
    out.push(VERSION);
    out.extend_from_slice(&hello.node_id.to_le_bytes());
    out.push(id.len() as u8);
    out.extend_from_slice(id);
    out
}

/// The fixed part of a hello: magic, version, node id, cluster id length.
pub const HELLO_FIXED_BYTES: usize = 4 + 1 + 8 + 1;

/// Decodes the fixed part of a hello; returns the node id and how many cluster id bytes follow.
pub fn decode_hello_fixed(fixed: &[u8; HELLO_FIXED_BYTES]) -> Result<(u64, usize), FrameError> {
    if fixed[..4] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    if fixed[4] != VERSION {
        return Err(FrameError::Version(fixed[4]));
    }
    let node_id = u64::from_le_bytes(fixed[5..13].try_into().expect("8 bytes"));
    let id_len = usize::from(fixed[13]);
    if id_len > CLUSTER_ID_BYTES_MAX {
        return Err(FrameError::ClusterId(id_len));
    }
    Ok((node_id, id_len))
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
            out.extend_from_slice(&request.source_node_id.to_le_bytes());
            out.extend_from_slice(&request.payload);
        }
        Frame::Answer { id, payload } => {
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

/// Checks a frame's length prefix before anything is allocated for its body.
pub fn frame_body_len(prefix: [u8; 4]) -> Result<usize, FrameError> {
    let len = u32::from_le_bytes(prefix);
    if len > FRAME_BYTES_MAX {
        return Err(FrameError::TooLarge(u64::from(len)));
    }
    Ok(len as usize)
}

/// Decodes a frame body (what follows the length prefix).
pub fn decode_frame(mut body: Vec<u8>) -> Result<Frame, FrameError> {
    if body.len() < 9 {
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
            let source_node_id = u64::from_le_bytes(body[19..27].try_into().expect("8 bytes"));
            let payload = body.split_off(REQUEST_HEADER_BYTES);
            Ok(Frame::Request {
                id,
                request: Request { service, group_id, kind, source_node_id, payload },
            })
        }
        TAG_ANSWER => Ok(Frame::Answer { id, payload: body.split_off(9) }),
        TAG_FAILURE => Ok(Frame::Failure { id, reason: decode_text(body.split_off(9))? }),
        other => Err(FrameError::Tag(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Request {
                id: 7,
                request: Request {
                    service: Service::Raft,
                    group_id: u64::MAX,
                    kind: 4,
                    source_node_id: 3,
                    payload: b"entries".to_vec(),
                },
            },
            Frame::Request {
                id: 0,
                request: Request {
                    service: Service::Cluster,
                    group_id: 0,
                    kind: 1,
                    source_node_id: 1,
                    payload: Vec::new(),
                },
            },
            Frame::Answer { id: 9, payload: vec![0; 1000] },
            Frame::Answer { id: 10, payload: Vec::new() },
            Frame::Failure { id: 11, reason: "group 5 is not open here".into() },
        ];
        for frame in frames {
            let bytes = encode_frame(&frame);
            let len = frame_body_len(bytes[..4].try_into().unwrap()).unwrap();
            assert_eq!(len, bytes.len() - 4);
            assert_eq!(decode_frame(bytes[4..].to_vec()).unwrap(), frame);
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
            request: Request {
                service: Service::Raft,
                group_id: 0,
                kind: 1,
                source_node_id: 1,
                payload: Vec::new(),
            },
        });
        request[4 + 9] = 77;
        assert_eq!(decode_frame(request[4..].to_vec()).unwrap_err(), FrameError::Service(77));
        let too_large = (FRAME_BYTES_MAX + 1).to_le_bytes();
        assert!(matches!(frame_body_len(too_large), Err(FrameError::TooLarge(_))));
        assert_eq!(
            frame_body_len(FRAME_BYTES_MAX.to_le_bytes()).unwrap(),
            FRAME_BYTES_MAX as usize
        );
    }

    #[test]
    fn hellos_round_trip_and_refuse_strangers() {
        for cluster_id in ["", "0123456789abcdef0123456789abcdef"] {
            let hello = Hello { node_id: 42, cluster_id: cluster_id.into() };
            let bytes = encode_hello(&hello);
            let fixed: [u8; HELLO_FIXED_BYTES] = bytes[..HELLO_FIXED_BYTES].try_into().unwrap();
            let (node_id, id_len) = decode_hello_fixed(&fixed).unwrap();
            assert_eq!(node_id, 42);
            assert_eq!(decode_text(bytes[HELLO_FIXED_BYTES..].to_vec()).unwrap(), cluster_id);
            assert_eq!(id_len, cluster_id.len());
        }
        let mut http = [0u8; HELLO_FIXED_BYTES];
        http[..4].copy_from_slice(b"GET ");
        assert_eq!(decode_hello_fixed(&http).unwrap_err(), FrameError::BadMagic);
        let mut future = encode_hello(&Hello { node_id: 1, cluster_id: String::new() });
        future[4] = VERSION + 1;
        let fixed: [u8; HELLO_FIXED_BYTES] = future[..HELLO_FIXED_BYTES].try_into().unwrap();
        assert_eq!(decode_hello_fixed(&fixed).unwrap_err(), FrameError::Version(VERSION + 1));
        let mut long = encode_hello(&Hello { node_id: 1, cluster_id: String::new() });
        long[13] = (CLUSTER_ID_BYTES_MAX + 1) as u8;
        let fixed: [u8; HELLO_FIXED_BYTES] = long[..HELLO_FIXED_BYTES].try_into().unwrap();
        assert_eq!(
            decode_hello_fixed(&fixed).unwrap_err(),
            FrameError::ClusterId(CLUSTER_ID_BYTES_MAX + 1)
        );
    }
}
