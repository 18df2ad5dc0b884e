//! Fuzzes what a broker reads from a peer's connection before it trusts anything: the hello's
//! fixed part, the version negotiation, and the frames after it (`malachi-transport`'s
//! `frame.rs`, docs/cluster.md "The inter-node transport").
//!
//! What must hold, whatever the bytes:
//! * no panic, and nothing allocated beyond what the input holds (a declared length is checked
//!   against the bound before any body is read);
//! * a negotiated version is inside both ranges;
//! * framing is canonical: every frame decoded re-encodes to exactly the bytes it came from;
//! * a request's call (`malachi-broker`'s `peer` codec) decodes without a panic, survives its
//!   own encoding, and a data call re-encodes to exactly the payload it came from;
//! * only an enrollment is read from a stranger's request.
//!
//! Input: byte 0 picks the frame bound (small, so refusals happen; 255 for the stranger's
//! 64 KiB), then the hello's fixed part, then the stream of frames.

#![no_main]

use libfuzzer_sys::fuzz_target;
use malachi_broker::peer::PeerCall;
use malachi_transport::frame::{self, Frame, HELLO_FIXED_BYTES, STRANGER_FRAME_BYTES_MAX};
use malachi_transport::{Request, Service};

fuzz_target!(|input: &[u8]| {
    let [bound, rest @ ..] = input else {
        return;
    };
    let max = if *bound == u8::MAX { STRANGER_FRAME_BYTES_MAX } else { u32::from(*bound) * 8 };
    let Some((fixed, mut stream)) = rest.split_first_chunk::<HELLO_FIXED_BYTES>() else {
        return;
    };
    if let Ok((versions, _, id_len)) = frame::decode_hello_fixed(fixed) {
        assert!(versions.start() <= versions.end(), "an empty version range was accepted");
        assert!(id_len <= frame::CLUSTER_ID_BYTES_MAX, "a long cluster id was accepted");
        if let Ok(version) = frame::common_version(&frame::VERSIONS, &versions) {
            assert!(frame::VERSIONS.contains(&version) && versions.contains(&version));
        }
    }
    while let Some((prefix, after)) = stream.split_first_chunk::<4>() {
        let Ok(len) = frame::frame_body_len(*prefix, max) else {
            return;
        };
        assert!(len as u64 <= u64::from(max), "a frame over the bound was accepted");
        if after.len() < len {
            return;
        }
        let (body, next) = after.split_at(len);
        if let Ok(decoded) = frame::decode_frame(body.to_vec()) {
            let encoded = frame::encode_frame(&decoded);
            assert_eq!(&encoded[..4], &prefix[..], "the length re-encodes differently");
            assert_eq!(&encoded[4..], body, "framing is not canonical");
            if let Frame::Request { request, .. } = decoded {
                check_call(request);
            }
        }
        stream = next;
    }
});

fn check_call(request: Request) {
    if let Some(enrollment) = PeerCall::decode_enrollment(request.clone()) {
        let enrollment_kind = (request.service, request.kind);
        assert!(enrollment_kind == (Service::Cluster, malachi_broker::peer::CLUSTER_ENROLL));
        drop(enrollment);
    }
    let Ok(call) = PeerCall::decode(request.clone()) else {
        return;
    };
    let encoded = call.encode();
    assert_eq!(PeerCall::decode(encoded.clone()).as_ref(), Ok(&call), "a call changed");
    if request.service == Service::Data {
        assert_eq!(encoded, request, "a data call has two encodings");
    }
}
