//! What a call can fail with, split by who can act on it: the server refused
//! ([`ClientError::Server`], with its reason text), the network failed
//! ([`ClientError::Transport`]), the bytes made no sense ([`ClientError::Protocol`]), no answer
//! came in time ([`ClientError::Timeout`]), or the connection is gone ([`ClientError::Closed`]).

use std::io;

use malachi_wire::Reason;

/// The error of every client call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// An error answer from the server. `reason` is the wire text as sent (it may carry detail
    /// after the reason name, `policy_in_use: a, b`); `retryable` follows section 4's table.
    #[error("{reason}")]
    Server { reason: String, retryable: bool },
    /// The socket failed (refused, reset, ...).
    #[error("{0}")]
    Transport(#[from] io::Error),
    /// The server sent bytes that do not follow the protocol, or we were asked to send a request
    /// that cannot be encoded (a frame over the limit).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// No answer within the request (or connect) timeout. The request may still take effect.
    #[error("timed out waiting for the server")]
    Timeout,
    /// The connection closed before the answer came.
    #[error("the connection closed")]
    Closed,
    /// TLS could not be set up: a CA, certificate or key file that does not load, or a
    /// server name that is not one.
    #[error("TLS: {0}")]
    Tls(String),
}

impl ClientError {
    /// A server error from its wire reason text.
    pub fn server(reason_text: &[u8]) -> ClientError {
        let retryable = Reason::from_wire(reason_text).is_some_and(Reason::is_retryable);
        ClientError::Server { reason: String::from_utf8_lossy(reason_text).into_owned(), retryable }
    }

    /// The recognised reason of a server error; `None` for other errors and for reason texts
    /// this client does not know.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            ClientError::Server { reason, .. } => Reason::from_wire(reason.as_bytes()),
            _ => None,
        }
    }

    /// The reason text of a server error as sent.
    pub fn reason_text(&self) -> Option<&str> {
        match self {
            ClientError::Server { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// Whether sending the same request again may succeed: for server errors the "yes" and
    /// "later" rows of section 4; transport failures, timeouts and closed connections are
    /// retryable on a new connection (a produce retried this way may be written twice:
    /// delivery is at-least-once). Protocol errors are not.
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Server { retryable, .. } => *retryable,
            ClientError::Transport(_) | ClientError::Timeout | ClientError::Closed => true,
            ClientError::Protocol(_) | ClientError::Tls(_) => false,
        }
    }
}

/// Why a connection ended, kept so every waiter (and every later call) gets the same cause.
/// `io::Error` is not `Clone`, so a transport failure keeps its kind and text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CloseCause {
    Server(Vec<u8>),
    Transport { kind: io::ErrorKind, message: String },
    Protocol(String),
    Closed,
}

impl CloseCause {
    pub(crate) fn to_error(&self) -> ClientError {
        match self {
            CloseCause::Server(reason) => ClientError::server(reason),
            CloseCause::Transport { kind, message } => {
                ClientError::Transport(io::Error::new(*kind, message.clone()))
            }
            CloseCause::Protocol(message) => ClientError::Protocol(message.clone()),
            CloseCause::Closed => ClientError::Closed,
        }
    }

    pub(crate) fn transport(error: &io::Error) -> CloseCause {
        CloseCause::Transport { kind: error.kind(), message: error.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_follow_the_reason_table() {
        let cases: &[(&str, Option<Reason>, bool)] = &[
            ("not_owner", Some(Reason::NotOwner), true),
            ("migrating", Some(Reason::Migrating), true),
            ("no_such_topic", Some(Reason::NoSuchTopic), false),
            ("policy_in_use: orders, audit", Some(Reason::PolicyInUse), false),
            ("{:unroutable, \"k1\"}", Some(Reason::Unroutable), true),
            // The brokers' retry class, the same table (they once disagreed on these).
            ("storage_failed", Some(Reason::StorageFailed), true),
            ("disk_full", Some(Reason::DiskFull), true),
            ("storage_damaged", Some(Reason::StorageDamaged), false),
            ("something_new", None, false),
        ];
        for (text, reason, retryable) in cases {
            let error = ClientError::server(text.as_bytes());
            assert_eq!(error.reason(), *reason, "{text}");
            assert_eq!(error.is_retryable(), *retryable, "{text}");
            assert_eq!(error.reason_text(), Some(*text));
            assert_eq!(error.to_string(), *text);
        }
    }

    #[test]
    fn other_errors() {
        let cases: &[(ClientError, bool)] = &[
            (ClientError::Timeout, true),
            (ClientError::Closed, true),
            (ClientError::Transport(io::ErrorKind::ConnectionReset.into()), true),
            (ClientError::Protocol("bad".into()), false),
        ];
        for (error, retryable) in cases {
            assert_eq!(error.is_retryable(), *retryable, "{error}");
            assert_eq!(error.reason(), None);
        }
        let cause = CloseCause::transport(&io::Error::new(io::ErrorKind::BrokenPipe, "gone"));
        let ClientError::Transport(error) = cause.to_error() else { panic!("transport") };
        assert_eq!((error.kind(), error.to_string()), (io::ErrorKind::BrokenPipe, "gone".into()));
    }
}
