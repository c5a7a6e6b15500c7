//! The client side: a blocking gRPC unary-call channel for Python (GIL released).
//!
//! One TCP connection, one call at a time, driven by the calling thread: no runtime,
//! no hand-offs between threads, one write and usually one read per call. Every call
//! has a deadline, sent as `grpc-timeout` and enforced on the socket, so a hung or
//! vanished game is an error naming the cause, never a hang.

use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::http2::{self, header, Block, Connection, Incoming};

create_exception!(
    uerl_native,
    RpcError,
    PyException,
    "A failed call: args are (gRPC status code as int, details)."
);

// gRPC status codes used here (grpc/status.h).
const CANCELLED: i32 = 1;
const UNKNOWN: i32 = 2;
const INVALID_ARGUMENT: i32 = 3;
const DEADLINE_EXCEEDED: i32 = 4;
const RESOURCE_EXHAUSTED: i32 = 8;
const INTERNAL: i32 = 13;
const UNAVAILABLE: i32 = 14;

// Static-table entries (RFC 7541, appendix A) of a gRPC request's headers.
const METHOD_POST: usize = 3;
const SCHEME_HTTP: usize = 6;
const NAME_AUTHORITY: usize = 1;
const NAME_PATH: usize = 4;
const NAME_CONTENT_TYPE: usize = 31;

type Failure = (i32, String);

fn io_failure(err: io::Error, deadline: Instant) -> Failure {
    match err.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            (DEADLINE_EXCEEDED, "deadline exceeded".into())
        }
        _ if Instant::now() >= deadline => (DEADLINE_EXCEEDED, "deadline exceeded".into()),
        io::ErrorKind::InvalidData => (INTERNAL, format!("HTTP/2 protocol error: {err}")),
        _ => (UNAVAILABLE, format!("connection lost: {err}")),
    }
}

fn resolve(address: &str) -> io::Result<Vec<SocketAddr>> {
    Ok(address.to_socket_addrs()?.collect())
}

/// A TCP connection that completed the HTTP/2 handshake: the peer answered with its
/// SETTINGS. (A TCP accept alone proves little: a game still loading, or a TLS server
/// spoken to in plaintext, accepts and never answers.)
fn open(address: &str, deadline: Instant) -> io::Result<Connection> {
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{address} resolves to nothing"));
    for addr in resolve(address)? {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        match TcpStream::connect_timeout(&addr, left) {
            Ok(socket) => {
                socket.set_read_timeout(Some(left))?;
                socket.set_write_timeout(Some(left))?;
                let mut conn = Connection::new(socket)?;
                conn.start(true)?;
                conn.await_settings()?;
                return Ok(conn);
            }
            Err(err) => last = err,
        }
    }
    Err(last)
}

fn grpc_timeout(timeout: Duration) -> String {
    let ms = timeout.as_millis().max(1);
    if ms < 100_000_000 {
        format!("{ms}m")
    } else {
        format!("{}S", timeout.as_secs().min(99_999_999))
    }
}

fn status_of(headers: &http2::Headers) -> Option<Result<(), Failure>> {
    let code = header(headers, b"grpc-status")?;
    let code: i32 = std::str::from_utf8(code).ok()?.trim().parse().ok()?;
    if code == 0 {
        return Some(Ok(()));
    }
    let message = header(headers, b"grpc-message").map(http2::percent_decode).unwrap_or_default();
    Some(Err((code, message)))
}

struct Live {
    conn: Connection,
    next_stream: u32,
    read_timeout: Option<Duration>,
}

impl Live {
    fn call(
        &mut self,
        authority: &[u8],
        path: &[u8],
        request: &[u8],
        timeout: Duration,
        max_reply: usize,
    ) -> Result<Vec<u8>, Failure> {
        let deadline = Instant::now() + timeout;
        if self.read_timeout != Some(timeout) {
            // One setsockopt per distinct timeout, not per call: deadlines are checked per frame.
            let socket = self.conn.socket();
            let limit = Some(timeout.max(Duration::from_millis(1)));
            socket.set_read_timeout(limit).and_then(|_| socket.set_write_timeout(limit)).map_err(|e| io_failure(e, deadline))?;
            self.read_timeout = Some(timeout);
        }
        if let Some(last) = self.conn.last_stream {
            return Err((UNAVAILABLE, format!("the game is closing the connection (GOAWAY after stream {last})")));
        }
        let stream = self.next_stream;
        self.next_stream += 2;
        let headers = Block::default()
            .indexed(METHOD_POST)
            .indexed(SCHEME_HTTP)
            .named(NAME_PATH, path)
            .named(NAME_AUTHORITY, authority)
            .named(NAME_CONTENT_TYPE, b"application/grpc")
            .literal(b"te", b"trailers")
            .literal(b"grpc-timeout", grpc_timeout(timeout).as_bytes());
        let mut parked = Vec::new();
        let body = http2::grpc_frame(request);
        self.conn.send(stream, &headers, Some(&body), None, &mut parked).map_err(|e| io_failure(e, deadline))?;
        let mut got_headers = false;
        let mut data: Vec<u8> = Vec::new();
        loop {
            let incoming = match parked.pop() {
                Some(frame) => frame,
                None => self.conn.next().map_err(|e| io_failure(e, deadline))?,
            };
            if Instant::now() > deadline {
                return Err((DEADLINE_EXCEEDED, "deadline exceeded".into()));
            }
            match incoming {
                Incoming::Headers { stream: s, end_stream, headers } if s == stream => {
                    if !got_headers {
                        got_headers = true;
                        match header(&headers, b":status") {
                            Some(b"200") => {}
                            other => {
                                let status = String::from_utf8_lossy(other.unwrap_or(b"none")).into_owned();
                                return Err((UNKNOWN, format!("HTTP status {status} instead of a gRPC reply")));
                            }
                        }
                        if !end_stream {
                            continue;
                        }
                    } else if !end_stream {
                        return Err((INTERNAL, "a second header block that does not end the reply".into()));
                    }
                    // Trailers (or a trailers-only reply): the call's status.
                    match status_of(&headers) {
                        Some(Ok(())) => {}
                        Some(Err(failure)) => return Err(failure),
                        None => return Err((UNKNOWN, "the reply has no grpc-status".into())),
                    }
                    return http2::grpc_unframe(&data)
                        .map(<[u8]>::to_vec)
                        .map_err(|e| (INTERNAL, format!("reply: {e}")));
                }
                Incoming::Data { stream: s, data: chunk, end_stream } if s == stream => {
                    data.extend_from_slice(&chunk);
                    if data.len() > max_reply + 5 {
                        return Err((RESOURCE_EXHAUSTED, format!("reply larger than {max_reply} bytes")));
                    }
                    if end_stream {
                        return Err((INTERNAL, "the reply ended without trailers".into()));
                    }
                }
                Incoming::Reset { stream: s, code } if s == stream => {
                    // RST_STREAM codes (RFC 9113, 7): REFUSED_STREAM may be retried, CANCEL is a cancel.
                    let status = match code {
                        0x7 => UNAVAILABLE,
                        0x8 => CANCELLED,
                        0xb => RESOURCE_EXHAUSTED,
                        _ => INTERNAL,
                    };
                    return Err((status, format!("the game reset the call (HTTP/2 error {code})")));
                }
                Incoming::GoAway { last_stream, debug, .. } if last_stream < stream => {
                    return Err((UNAVAILABLE, format!("the game closed the connection (GOAWAY {debug})")));
                }
                _ => {} // frames of earlier, abandoned calls
            }
        }
    }
}

#[pyclass(module = "uerl_native")]
pub struct Channel {
    address: String,
    live: Option<Live>,
    max_message_bytes: usize,
}

impl Channel {
    /// `call` for Rust callers: the reply's bytes, or `RpcError`.
    pub fn call_bytes(
        &mut self,
        py: Python<'_>,
        method: &str,
        request: &[u8],
        timeout_s: f64,
    ) -> PyResult<Vec<u8>> {
        let timeout = Duration::from_secs_f64(timeout_s.max(0.001));
        let max = self.max_message_bytes;
        let address = self.address.as_str();
        let mut live = self.live.take();
        let result = py.allow_threads(|| {
            let deadline = Instant::now() + timeout;
            let live_ref = match &mut live {
                Some(l) => l,
                None => {
                    let conn = open(address, deadline).map_err(|e| io_failure(e, deadline))?;
                    live.insert(Live { conn, next_stream: 1, read_timeout: None })
                }
            };
            live_ref.call(address.as_bytes(), method.as_bytes(), request, timeout, max)
        });
        match result {
            Ok(reply) => {
                self.live = live;
                Ok(reply)
            }
            // A game's own error status leaves the connection usable; anything else drops it.
            Err((code, details)) => {
                let transport = matches!(code, UNAVAILABLE | DEADLINE_EXCEEDED | INTERNAL);
                if !transport {
                    self.live = live;
                }
                Err(RpcError::new_err((code, details)))
            }
        }
    }
}

#[pymethods]
impl Channel {
    /// A plaintext channel to `host:port`; nothing is connected until `wait_ready`.
    #[new]
    fn new(address: &str, max_message_bytes: usize) -> PyResult<Self> {
        let valid = address.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        if !valid {
            return Err(RpcError::new_err((INVALID_ARGUMENT, format!("bad address {address:?}: expected host:port"))));
        }
        Ok(Self { address: address.to_string(), live: None, max_message_bytes })
    }

    /// Connect, retrying with backoff until `timeout_s`: a game may still be starting.
    fn wait_ready(&mut self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        if self.live.is_some() {
            return Ok(());
        }
        let address = self.address.clone();
        let result = py.allow_threads(move || {
            let deadline = Instant::now() + Duration::from_secs_f64(timeout_s.max(0.0));
            let mut backoff = Duration::from_millis(20);
            loop {
                match open(&address, deadline) {
                    Ok(conn) => return Ok(conn),
                    Err(err) => {
                        if Instant::now() + backoff >= deadline {
                            return Err(format!("no HTTP/2 connection within {timeout_s} s: {err}"));
                        }
                        std::thread::sleep(backoff);
                        backoff = (backoff * 2).min(Duration::from_millis(500));
                    }
                }
            }
        });
        match result {
            Ok(conn) => {
                self.live = Some(Live { conn, next_stream: 1, read_timeout: None });
                Ok(())
            }
            Err(msg) => Err(RpcError::new_err((UNAVAILABLE, msg))),
        }
    }

    /// One unary call, e.g. `call("/Schola.GymService/UpdateState", request, 60.0)`.
    /// After a failure the connection is dropped; the next call opens a new one.
    fn call<'py>(
        &mut self,
        py: Python<'py>,
        method: &str,
        request: &[u8],
        timeout_s: f64,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let reply = self.call_bytes(py, method, request, timeout_s)?;
        Ok(PyBytes::new(py, &reply))
    }

    /// Drop the connection; the object can `wait_ready` again.
    fn close(&mut self) {
        self.live = None;
    }

    #[getter]
    fn connected(&self) -> bool {
        self.live.is_some()
    }
}
