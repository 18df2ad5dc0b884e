//! The answers to data calls: a status byte, then what the call answers.
//!
//! * 0 done, then the result;
//! * 1 fenced (an append or a replicated batch: the head or copy is sealed; re-route) or gone
//!   (the other calls: metadata no longer lists the segment);
//! * 2 failed, then `retryable` u8 and the wire reason as UTF-8;
//! * 3 refused (a replicated batch only: it did not start where the copy ends), then the
//!   copy's durable end u64.

use crate::error::LogError;

pub(crate) const DONE: u8 = 0;
pub(crate) const FENCED_OR_GONE: u8 = 1;
const FAILED: u8 = 2;
pub(crate) const REFUSED: u8 = 3;

/// What a forwarded leaf operation came to.
pub(crate) enum Remote<T> {
    Done(T),
    /// Append: the head was sealed under the request. Read or end: the segment is gone.
    FencedOrGone,
}

/// A data call's failure answer: retryable or not, then the wire reason.
pub(crate) fn encode_failure(error: &LogError) -> Vec<u8> {
    let mut failed = vec![FAILED, u8::from(error.is_retryable())];
    failed.extend_from_slice(error.reason().as_bytes());
    failed
}

/// The answer to a data call that came to `outcome`: done with what `encode` writes, fenced
/// or gone (`None`), or failed.
pub(crate) fn answer_of<T>(
    outcome: Result<Option<T>, LogError>,
    encode: impl FnOnce(T, &mut Vec<u8>),
) -> Vec<u8> {
    match outcome {
        Ok(Some(done)) => {
            let mut answer = vec![DONE];
            encode(done, &mut answer);
            answer
        }
        Ok(None) => vec![FENCED_OR_GONE],
        Err(error) => encode_failure(&error),
    }
}

/// Decodes a data call's answer; `done` reads the result of a done one.
pub(crate) fn decode_answer<T>(
    answer: &[u8],
    done: impl FnOnce(&[u8]) -> Result<T, String>,
) -> Result<Remote<T>, LogError> {
    match answer.split_first() {
        Some((&DONE, body)) => done(body).map(Remote::Done).map_err(malformed),
        Some((&FENCED_OR_GONE, _)) => Ok(Remote::FencedOrGone),
        Some((&FAILED, [retryable, reason @ ..])) => Err(LogError::Remote {
            reason: String::from_utf8_lossy(reason).into_owned(),
            retryable: *retryable != 0,
        }),
        _ => Err(malformed("unknown status".to_string())),
    }
}

/// What a follower answers a shipped batch.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Shipped {
    /// Its copy is durable to this offset.
    Durable(u64),
    /// The batch did not start where its copy ends, which is durable to this offset.
    Refused(u64),
    /// Its copy is sealed.
    Fenced,
}

pub(crate) fn encode_shipped(outcome: Result<Shipped, LogError>) -> Vec<u8> {
    let (status, durable) = match outcome {
        Ok(Shipped::Durable(durable)) => (DONE, durable),
        Ok(Shipped::Refused(durable)) => (REFUSED, durable),
        Ok(Shipped::Fenced) => return vec![FENCED_OR_GONE],
        Err(error) => return encode_failure(&error),
    };
    let mut answer = vec![status];
    answer.extend_from_slice(&durable.to_le_bytes());
    answer
}

pub(crate) fn decode_shipped(answer: &[u8]) -> Result<Shipped, LogError> {
    let offset = |body: &[u8]| -> Result<u64, String> {
        let bytes: [u8; 8] = body.try_into().map_err(|_| "not an offset".to_string())?;
        Ok(u64::from_le_bytes(bytes))
    };
    if let Some((&REFUSED, body)) = answer.split_first() {
        return offset(body).map(Shipped::Refused).map_err(malformed);
    }
    Ok(match decode_answer(answer, offset)? {
        Remote::Done(durable) => Shipped::Durable(durable),
        Remote::FencedOrGone => Shipped::Fenced,
    })
}

pub(crate) fn malformed(detail: String) -> LogError {
    LogError::Unavailable(format!("malformed data answer: {detail}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::Reader;

    #[test]
    fn answers_decode_by_status() {
        let done = decode_answer(&[DONE, 7, 0, 0, 0, 0, 0, 0, 0], |body| Reader(body).u64());
        assert!(matches!(done, Ok(Remote::Done(7))));
        assert!(matches!(decode_answer(&[FENCED_OR_GONE], |_| Ok(())), Ok(Remote::FencedOrGone)));
        let mut failed = vec![FAILED, 1];
        failed.extend_from_slice(b"disk_full");
        match decode_answer(&failed, |_| Ok(())) {
            Err(error @ LogError::Remote { .. }) => {
                assert_eq!(error.reason(), "disk_full");
                assert!(error.is_retryable());
            }
            _ => panic!("a failure answer is the holder's reason"),
        }
        for bad in [&[][..], &[9], &[FAILED], &[REFUSED, 0]] {
            assert!(matches!(decode_answer(bad, |_| Ok(())), Err(LogError::Unavailable(_))));
        }
        assert!(matches!(
            decode_answer(&[DONE, 1, 2], |body| Reader(body).u64()),
            Err(LogError::Unavailable(_))
        ));
    }

    #[test]
    fn shipped_answers_round_trip() {
        for shipped in [Shipped::Durable(7), Shipped::Refused(u64::MAX), Shipped::Fenced] {
            let answer = encode_shipped(Ok(shipped));
            let again = decode_shipped(&answer).unwrap();
            assert_eq!(encode_shipped(Ok(again)), answer);
        }
        let failed = encode_shipped(Err(LogError::NoQuorum("two of three".into())));
        assert_eq!(decode_shipped(&failed).unwrap_err().reason(), "no_quorum");
        for bad in [&[][..], &[DONE, 1], &[REFUSED], &[REFUSED, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[9]] {
            assert!(matches!(decode_shipped(bad), Err(LogError::Unavailable(_))), "{bad:?}");
        }
    }
}
