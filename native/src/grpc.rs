//! What both sides of uerl's compiled gRPC share (`transport` the client, `server` the
//! mock game's): status codes and the length-prefixed message framing of gRPC over
//! HTTP/2 (a flag byte, 0 for uncompressed, and the message's length as 4 bytes, big
//! endian), with the size limit checked on the way out and on the way in.

use bytes::{Bytes, BytesMut};

// gRPC status codes used here (grpc/status.h).
pub const CANCELLED: i32 = 1;
pub const UNKNOWN: i32 = 2;
pub const INVALID_ARGUMENT: i32 = 3;
pub const DEADLINE_EXCEEDED: i32 = 4;
pub const PERMISSION_DENIED: i32 = 7;
pub const RESOURCE_EXHAUSTED: i32 = 8;
pub const UNIMPLEMENTED: i32 = 12;
pub const INTERNAL: i32 = 13;
pub const UNAVAILABLE: i32 = 14;
pub const UNAUTHENTICATED: i32 = 16;

/// A failed call: its gRPC status code and details.
pub type Failure = (i32, String);

/// A message's limit where none is given: uerl's on both sides of the wire
/// (`MAX_MESSAGE_BYTES` in training/protocol/transport.py, which gRPC Python's client
/// and server are given too).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 100 << 20;

/// Bytes before a message: its flag and its length.
pub const PREFIX_BYTES: usize = 5;

/// `message` framed for the wire. Over `max` it is RESOURCE_EXHAUSTED, as gRPC refuses to
/// send it (the length must also fit the prefix's 4 bytes, whatever `max` says).
pub fn frame(message: &[u8], max: usize, what: &str) -> Result<Bytes, Failure> {
    let length = u32::try_from(message.len()).ok().filter(|_| message.len() <= max).ok_or_else(|| {
        (RESOURCE_EXHAUSTED, format!("{what} of {} bytes, larger than the limit of {max}", message.len()))
    })?;
    let mut framed = BytesMut::with_capacity(message.len() + PREFIX_BYTES);
    framed.extend_from_slice(&[0]);
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(message);
    Ok(framed.freeze())
}

/// The message length a frame's prefix declares, once its 5 bytes are in.
pub fn declared_length(data: &[u8]) -> Option<usize> {
    (data.len() >= PREFIX_BYTES).then(|| u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize)
}

/// While a unary message arrives: RESOURCE_EXHAUSTED as soon as its prefix declares more
/// than `max` (before the rest is waited for), an error as soon as more than one message
/// arrives; so no more than `max` and a frame's worth is ever held.
pub fn check_arriving(data: &[u8], max: usize, what: &str) -> Result<(), Failure> {
    if let Some(length) = declared_length(data) {
        if length > max {
            return Err((RESOURCE_EXHAUSTED, format!("{what} of {length} bytes, larger than the limit of {max}")));
        }
        if data.len() > PREFIX_BYTES + length {
            return Err((INTERNAL, format!("a unary {what} with more than one message")));
        }
    }
    Ok(())
}

