use std::fmt;

/// Everything that can go wrong in this crate: input that does not follow the
/// bucket layout or the configuration's constraints. Protocol outcomes (a lost
/// race, a fenced lease) are decisions, not errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A key in the bucket does not follow the layout; it is never acted on.
    MalformedKey { reason: &'static str, key: String },
    /// A record body (lease, hold, `alarm_indexed`) does not parse.
    MalformedRecord {
        reason: &'static str,
        record: String,
    },
    /// A class name that cannot appear in a key.
    InvalidClass { class: String },
    /// An actor name that is empty or too long for a key.
    InvalidName { reason: &'static str, bytes: usize },
    /// A node id that cannot appear in a key.
    InvalidNode { node: String },
    /// An advertised address that cannot appear in a lease record.
    InvalidAddress {
        reason: &'static str,
        address: String,
    },
    /// A due time beyond what 15 digits hold.
    TimeOutOfRange { at_ms: u64 },
    /// A configuration value outside its allowed range.
    InvalidConfig { field: &'static str, value: u64 },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::MalformedKey { reason, key } => {
                write!(f, "malformed key: {reason}: key=`{key}`")
            }
            Error::MalformedRecord { reason, record } => {
                write!(f, "malformed record: {reason}: record=`{record}`")
            }
            Error::InvalidClass { class } => write!(f, "invalid class name: class=`{class}`"),
            Error::InvalidName { reason, bytes } => {
                write!(f, "invalid actor name: {reason}: bytes={bytes}")
            }
            Error::InvalidNode { node } => write!(f, "invalid node id: node=`{node}`"),
            Error::InvalidAddress { reason, address } => {
                write!(
                    f,
                    "invalid advertised address: {reason}: address=`{address}`"
                )
            }
            Error::TimeOutOfRange { at_ms } => write!(f, "due time out of range: at_ms={at_ms}"),
            Error::InvalidConfig { field, value } => {
                write!(f, "invalid configuration: field={field} value={value}")
            }
        }
    }
}

impl std::error::Error for Error {}
