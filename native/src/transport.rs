//! The client side: a blocking gRPC unary-call channel for Python (GIL released), on the
//! `h2` crate (hyper's HTTP/2: flow control, HPACK, GOAWAY, PING, limits and years of
//! fuzzing are its, not ours).
//!
//! One connection per channel, on a single-threaded tokio runtime that the calling thread
//! drives during a call (no hand-off between threads on the step path). While no call
//! runs, a small thread drives it instead, so the connection answers the game's keepalive
//! pings and sees its GOAWAY or its end. Every call has a deadline, sent as
//! `grpc-timeout` and enforced here (the name lookup and a wait for another thread's
//! connection attempt included), so a hung or vanished game is an error naming the
//! cause, never a hang. docs/protocol.md lists what is supported and what is retried.

use std::collections::HashMap;
use std::io::Read;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use h2::client::SendRequest;
use h2::Reason;
use http::{HeaderMap, HeaderValue, Method, Request, Uri};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use tokio::runtime::Runtime;
use tokio::sync::{oneshot, Notify};

use crate::grpc::{
    Failure, CANCELLED, DEADLINE_EXCEEDED, INTERNAL, INVALID_ARGUMENT, PERMISSION_DENIED, RESOURCE_EXHAUSTED,
    UNAUTHENTICATED, UNAVAILABLE, UNIMPLEMENTED, UNKNOWN,
};

create_exception!(
    uerl_native,
    RpcError,
    PyException,
    "A failed call: args are (gRPC status code as int, details)."
);

/// Metadata a reply may carry (headers, trailers; RFC 7541 sizes), as gRPC C-core's hard
/// limit: more fails the call with RESOURCE_EXHAUSTED.
const MAX_METADATA_BYTES: usize = 16 << 10;
/// What h2 is told (and advertises): room to see a block past our limit whole and refuse
/// it ourselves, since h2 itself drops trailer fields past its limit without a word. A
/// block past 4 times this ends the connection (h2's abuse limit: a CONTINUATION flood).
const H2_HEADER_LIST_BYTES: u32 = 64 << 10;
/// Flow-control windows: a step's reply (tens of KB for 16 environments) arrives without
/// waiting for a WINDOW_UPDATE.
const WINDOW_BYTES: u32 = 8 << 20;
/// A call whose request provably never reached the game is sent again (on a new
/// connection) at most this many times, within its deadline.
const MAX_TRANSPARENT_RETRIES: usize = 3;
/// A CANCEL reset this close to the deadline is the game's own timer firing on it.
const CANCEL_AT_DEADLINE: Duration = Duration::from_millis(10);
/// A call after a pause this long first lets the connection catch up (see `call_blocking`).
const CATCH_UP_AFTER: Duration = Duration::from_millis(2);
/// The channel counts as idle (and the idle driver takes over the connection) after this.
const IDLE_AFTER: Duration = Duration::from_millis(50);
/// How long the idle driver drives the connection before it looks at the channel again.
const IDLE_SLICE: Duration = Duration::from_millis(500);

/// How an attempt failed: `Refused` never reached the game (safe to send again).
enum Attempt {
    Refused(Failure),
    Failed(Failure),
}

fn deadline_exceeded() -> Failure {
    (DEADLINE_EXCEEDED, "deadline exceeded".into())
}

/// gRPC's mapping of an HTTP status that is not a gRPC reply (doc/http-grpc-status-mapping.md).
fn http_status_code(status: u16) -> i32 {
    match status {
        400 => INTERNAL,
        401 => UNAUTHENTICATED,
        403 => PERMISSION_DENIED,
        404 => UNIMPLEMENTED,
        429 | 502 | 503 | 504 => UNAVAILABLE,
        _ => UNKNOWN,
    }
}

/// An `h2` error as a gRPC status, and whether the request provably never reached the
/// game: refused (REFUSED_STREAM) or above the last stream of the game's GOAWAY.
fn h2_failure(err: &h2::Error) -> Attempt {
    if err.is_go_away() && err.is_remote() {
        return Attempt::Refused((
            UNAVAILABLE,
            format!("the game closed the connection (GOAWAY {:?})", err.reason().unwrap_or(Reason::NO_ERROR)),
        ));
    }
    if err.is_reset() && err.is_remote() {
        let reason = err.reason().unwrap_or(Reason::INTERNAL_ERROR);
        let failure = |code| (code, format!("the game reset the call (HTTP/2 {reason:?})"));
        return match reason {
            Reason::REFUSED_STREAM => Attempt::Refused(failure(UNAVAILABLE)),
            Reason::CANCEL => Attempt::Failed(failure(CANCELLED)),
            Reason::ENHANCE_YOUR_CALM => Attempt::Failed(failure(RESOURCE_EXHAUSTED)),
            Reason::INADEQUATE_SECURITY => Attempt::Failed(failure(PERMISSION_DENIED)),
            _ => Attempt::Failed(failure(INTERNAL)),
        };
    }
    if err.is_io() {
        return Attempt::Failed((UNAVAILABLE, format!("connection lost: {err}")));
    }
    match err.reason() {
        // Limits this client sets (header list size): refused like C-core refuses them.
        Some(Reason::REFUSED_STREAM) | Some(Reason::ENHANCE_YOUR_CALM) => {
            Attempt::Failed((RESOURCE_EXHAUSTED, format!("reply refused: {err}")))
        }
        _ => Attempt::Failed((INTERNAL, format!("HTTP/2 protocol error: {err}"))),
    }
}

/// A failure before the request was queued on the connection: it never left this process.
fn never_sent(err: &h2::Error) -> Attempt {
    match h2_failure(err) {
        Attempt::Refused(failure) | Attempt::Failed(failure) => Attempt::Refused(failure),
    }
}

fn grpc_timeout(timeout: Duration) -> HeaderValue {
    let ms = timeout.as_millis().max(1);
    let text = if ms < 100_000_000 { format!("{ms}m") } else { format!("{}S", timeout.as_secs().min(99_999_999)) };
    HeaderValue::from_str(&text).expect("ASCII")
}

fn percent_decode(raw: &[u8]) -> String {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        if raw[i] == b'%' && i + 2 < raw.len() {
            let hex = std::str::from_utf8(&raw[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(byte) = hex {
                out.push(byte);
                i += 3;
                continue;
            }
        }
        out.push(raw[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The call's status from trailers (or a trailers-only reply's headers); None if absent.
fn grpc_status(headers: &HeaderMap) -> Option<Result<(), Failure>> {
    let code = headers.get("grpc-status")?;
    let code: i32 = match code.to_str().ok().and_then(|c| c.trim().parse().ok()) {
        Some(code) => code,
        None => return Some(Err((UNKNOWN, format!("a malformed grpc-status {code:?}")))),
    };
    if code == 0 {
        return Some(Ok(()));
    }
    let message = headers.get("grpc-message").map(|m| percent_decode(m.as_bytes())).unwrap_or_default();
    Some(Err((code, message)))
}

/// The one message of a unary reply: its length prefix checked against the limit before
/// any of it is waited for, decompressed as `grpc-encoding` says (bounded by the limit).
fn unframe(data: &[u8], encoding: Option<&HeaderValue>, max: usize) -> Result<Vec<u8>, Failure> {
    if data.is_empty() {
        return Err((INTERNAL, "the game answered OK without a reply message".into()));
    }
    if data.len() < 5 {
        return Err((INTERNAL, format!("reply: a {}-byte message prefix (5 expected)", data.len())));
    }
    let compressed = data[0];
    let length = crate::grpc::declared_length(data).expect("5 bytes");
    let message = &data[crate::grpc::PREFIX_BYTES..];
    if message.len() != length {
        return Err((INTERNAL, format!("reply: {} message byte(s) after a prefix of {length}", message.len())));
    }
    match compressed {
        0 => Ok(message.to_vec()),
        1 => {
            let encoding = encoding.map(HeaderValue::as_bytes).unwrap_or(b"identity");
            let mut out = Vec::new();
            let limit = max as u64 + 1;
            let read = match encoding {
                b"gzip" => flate2::read::GzDecoder::new(message).take(limit).read_to_end(&mut out),
                b"deflate" => flate2::read::ZlibDecoder::new(message).take(limit).read_to_end(&mut out),
                other => {
                    return Err((
                        INTERNAL,
                        format!(
                            "a compressed message, but the reply's grpc-encoding is {:?}",
                            String::from_utf8_lossy(other)
                        ),
                    ))
                }
            };
            read.map_err(|e| (INTERNAL, format!("reply: cannot decompress it: {e}")))?;
            if out.len() > max {
                return Err((RESOURCE_EXHAUSTED, format!("reply larger than {max} bytes once decompressed")));
            }
            Ok(out)
        }
        flag => Err((INTERNAL, format!("reply: message flag {flag} (0 or 1 expected)"))),
    }
}

fn check_metadata(headers: &HeaderMap, what: &str) -> Result<(), Failure> {
    let size: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 32).sum();
    if size > MAX_METADATA_BYTES {
        return Err((
            RESOURCE_EXHAUSTED,
            format!("the reply's {what} hold {size} bytes of metadata, more than the limit of {MAX_METADATA_BYTES}"),
        ));
    }
    Ok(())
}

/// One live connection: where requests go, whether its task still runs, and which way
/// it goes ("unix" or "tcp").
#[derive(Clone)]
struct Conn {
    send: SendRequest<Bytes>,
    alive: Arc<AtomicBool>,
    via: &'static str,
}

/// How an HTTP/2 handshake and its PING went on one stream.
enum Opened {
    Ready(Conn),
    /// Not a game's gRPC server (yet): try the next address.
    NotHttp2(Failure),
}

/// HTTP/2 on `io`, proved by a PING answered (a game still loading, or a TLS server
/// spoken to in plaintext, accepts and never answers).
async fn handshake<T>(io: T, peer: &str, via: &'static str, deadline: tokio::time::Instant) -> Result<Opened, Failure>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let handshake = h2::client::Builder::new()
        .enable_push(false)
        .initial_window_size(WINDOW_BYTES)
        .initial_connection_window_size(WINDOW_BYTES)
        .max_header_list_size(H2_HEADER_LIST_BYTES)
        .handshake::<_, Bytes>(io);
    let (send, mut connection) = match tokio::time::timeout_at(deadline, handshake).await {
        Err(_) => return Err(deadline_exceeded()),
        Ok(Err(e)) => return Ok(Opened::NotHttp2((UNAVAILABLE, format!("no HTTP/2 from {peer}: {e}")))),
        Ok(Ok(pair)) => pair,
    };
    let mut pings = connection.ping_pong().expect("taken once");
    let alive = Arc::new(AtomicBool::new(true));
    let flag = alive.clone();
    tokio::spawn(async move {
        let _ = connection.await;
        flag.store(false, Ordering::Release);
    });
    match tokio::time::timeout_at(deadline, pings.ping(h2::Ping::opaque())).await {
        Err(_) => Err(deadline_exceeded()),
        // An HTTP/1.1 server, a TLS one, garbage: not a game's gRPC server (yet).
        Ok(Err(e)) => Ok(Opened::NotHttp2((UNAVAILABLE, format!("no HTTP/2 from {peer}: {e}")))),
        Ok(Ok(_pong)) => Ok(Opened::Ready(Conn { send, alive, via })),
    }
}

/// A name lookup under way on a thread of its own: what it finds, once it has.
type Lookup = oneshot::Receiver<std::io::Result<Vec<SocketAddr>>>;

/// The addresses `address` (`host:port`) resolves to, by `deadline`. A literal IP is
/// read as is. A name goes to the system's resolver, which blocks for as long as its own
/// timeouts say, so it runs on a thread of its own that the call stops waiting for at its
/// deadline; a lookup still under way is left in `pending` for the next attempt to wait
/// on (one lookup at a time, however often a caller retries).
async fn resolve(address: &str, deadline: tokio::time::Instant, pending: &mut Option<Lookup>) -> Result<Vec<SocketAddr>, Failure> {
    if let Ok(addr) = address.parse::<SocketAddr>() {
        return Ok(vec![addr]);
    }
    let lookup = match pending {
        Some(lookup) => lookup,
        None => {
            let (found, lookup) = oneshot::channel();
            let name = address.to_string();
            std::thread::Builder::new()
                .name("uerl-resolve".into())
                .spawn(move || {
                    let _ = found.send(name.to_socket_addrs().map(Iterator::collect));
                })
                .map_err(|e| (UNAVAILABLE, format!("cannot resolve {address}: no thread for the lookup: {e}")))?;
            pending.insert(lookup)
        }
    };
    let result = match tokio::time::timeout_at(deadline, lookup).await {
        Err(_) => return Err((DEADLINE_EXCEEDED, format!("deadline exceeded while resolving {address}"))),
        Ok(result) => result,
    };
    *pending = None;
    match result {
        Ok(Ok(addrs)) => Ok(addrs),
        Ok(Err(e)) => Err((UNAVAILABLE, format!("cannot resolve {address}: {e}"))),
        Err(_) => Err((UNAVAILABLE, format!("cannot resolve {address}: the lookup's thread ended"))),
    }
}

/// A connection that completed the HTTP/2 handshake and answered a PING: over the game's
/// Unix socket when it offers one (`local_socket`) and a process of `uid` serves it,
/// else over TCP.
async fn open(address: &str, deadline: tokio::time::Instant, uid: u32, pending: &mut Option<Lookup>) -> Result<Conn, Failure> {
    if let Some(name) = crate::local_socket::name_for_address(address) {
        // Nothing listening there fails at once (ECONNREFUSED): then TCP. So does a
        // socket served by another user: any process may take an abstract name, so only
        // one of ours is trusted with the game's traffic.
        if let Ok(Ok(unix)) = tokio::time::timeout_at(deadline, tokio::net::UnixStream::connect(&name)).await {
            if crate::local_socket::served_by(&unix, uid) {
                if let Opened::Ready(conn) = handshake(unix, address, "unix", deadline).await? {
                    return Ok(conn);
                }
            }
        }
    }
    let addrs = resolve(address, deadline, pending).await?;
    let mut last = (UNAVAILABLE, format!("{address} resolves to nothing"));
    for addr in addrs {
        let tcp = match tokio::time::timeout_at(deadline, tokio::net::TcpStream::connect(addr)).await {
            Err(_) => return Err(deadline_exceeded()),
            Ok(Err(e)) => {
                last = (UNAVAILABLE, format!("cannot connect to {addr}: {e}"));
                continue;
            }
            Ok(Ok(tcp)) => tcp,
        };
        let _ = tcp.set_nodelay(true);
        match handshake(tcp, &addr.to_string(), "tcp", deadline).await? {
            Opened::Ready(conn) => return Ok(conn),
            Opened::NotHttp2(failure) => last = failure,
        }
    }
    Err(last)
}

struct Call<'a> {
    uri: &'a Uri,
    body: Bytes,
    timeout: HeaderValue,
    max: usize,
}

async fn attempt(conn: &Conn, call: &Call<'_>) -> Result<Vec<u8>, Attempt> {
    let mut send = conn.send.clone().ready().await.map_err(|e| never_sent(&e))?;
    let request = Request::builder()
        .method(Method::POST)
        .uri(call.uri.clone())
        .header("content-type", HeaderValue::from_static("application/grpc"))
        .header("te", HeaderValue::from_static("trailers"))
        .header("grpc-timeout", call.timeout.clone())
        .header("grpc-accept-encoding", HeaderValue::from_static("identity,deflate,gzip"))
        .body(())
        .expect("a valid request");
    // Not sent yet if this fails: the connection closed before the stream opened.
    let (response, mut stream) = send.send_request(request, false).map_err(|e| never_sent(&e))?;
    stream.send_data(call.body.clone(), true).map_err(|e| h2_failure(&e))?;
    let response = response.await.map_err(|e| h2_failure(&e))?;
    let (head, mut body) = response.into_parts();
    check_metadata(&head.headers, "headers").map_err(Attempt::Failed)?;
    if let Some(status) = grpc_status(&head.headers) {
        // Trailers-only: the status is all there is.
        status.map_err(Attempt::Failed)?;
        return Err(Attempt::Failed((INTERNAL, "the game answered OK without a reply message".into())));
    }
    if head.status != http::StatusCode::OK {
        let code = http_status_code(head.status.as_u16());
        return Err(Attempt::Failed((code, format!("HTTP status {} instead of a gRPC reply", head.status.as_u16()))));
    }
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|e| h2_failure(&e))?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(chunk.chunk());
        crate::grpc::check_arriving(&data, call.max, "reply").map_err(Attempt::Failed)?;
    }
    let trailers = body.trailers().await.map_err(|e| h2_failure(&e))?;
    if let Some(trailers) = &trailers {
        check_metadata(trailers, "trailers").map_err(Attempt::Failed)?;
    }
    match trailers.as_ref().and_then(grpc_status) {
        Some(Ok(())) => {}
        Some(Err(failure)) => return Err(Attempt::Failed(failure)),
        None => return Err(Attempt::Failed((UNKNOWN, "the reply ended without a grpc-status".into()))),
    }
    unframe(&data, head.headers.get("grpc-encoding"), call.max).map_err(Attempt::Failed)
}

/// What the channel and its idle driver share.
struct Shared {
    runtime: Runtime,
    conn: Mutex<Option<Conn>>,
    /// Held while a connection opens (so calls that start together share one), with the
    /// name lookup still under way, if any. Each caller waits for it until its own
    /// deadline only: an async lock, taken under that deadline.
    connecting: tokio::sync::Mutex<Option<Lookup>>,
    in_flight: AtomicUsize,
    /// When the last call ended, in ns since `epoch`.
    last_end_ns: AtomicU64,
    epoch: Instant,
    /// Ends the idle driver's slice when a call starts.
    interrupt: Notify,
    stop: Mutex<bool>,
    stopping: Condvar,
}

impl Shared {
    fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    fn live(&self) -> Option<Conn> {
        let guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_ref().filter(|c| c.alive.load(Ordering::Acquire)).cloned()
    }

    fn set(&self, conn: Option<Conn>) {
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = conn;
    }

    /// Drives the connection while no call does: answers keepalive pings, takes in a
    /// GOAWAY or the connection's end, so the next call starts on a connection that works.
    fn idle_driver(self: Arc<Self>) {
        let mut stop = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            stop = self.stopping.wait_timeout(stop, IDLE_AFTER).unwrap_or_else(|p| p.into_inner()).0;
            if *stop {
                return;
            }
            let idle_ns = self.now_ns().saturating_sub(self.last_end_ns.load(Ordering::Acquire));
            if self.in_flight.load(Ordering::Acquire) > 0 || idle_ns < IDLE_AFTER.as_nanos() as u64 {
                continue;
            }
            if self.live().is_none() {
                continue;
            }
            drop(stop);
            self.runtime.block_on(async {
                tokio::select! {
                    _ = self.interrupt.notified() => {}
                    _ = tokio::time::sleep(IDLE_SLICE) => {}
                }
            });
            stop = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Marks a call in flight for as long as it lives.
struct InFlight<'a>(&'a Shared);

impl<'a> InFlight<'a> {
    fn start(shared: &'a Shared) -> Self {
        shared.in_flight.fetch_add(1, Ordering::AcqRel);
        shared.interrupt.notify_one();
        InFlight(shared)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.last_end_ns.store(self.0.now_ns(), Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

#[pyclass(module = "uerl_native", frozen)]
pub struct Channel {
    address: String,
    authority: String,
    max_message_bytes: usize,
    shared: Arc<Shared>,
    driver: Mutex<Option<JoinHandle<()>>>,
    /// Each method's URI, parsed once.
    uris: Mutex<HashMap<String, Uri>>,
    /// The user a game's local socket must be served by to be used: this process's
    /// (`_trust_local_socket_of` changes it, for tests).
    local_uid: AtomicU32,
}

impl Channel {
    fn uri(&self, method: &str) -> Result<Uri, Failure> {
        let mut uris = self.uris.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(uri) = uris.get(method) {
            return Ok(uri.clone());
        }
        let uri: Uri = format!("http://{}{}", self.authority, method)
            .parse()
            .map_err(|e| (INVALID_ARGUMENT, format!("bad method {method:?}: {e}")))?;
        uris.insert(method.to_string(), uri.clone());
        Ok(uri)
    }

    /// The live connection, or a new one: one at a time, so calls that start together
    /// from several threads share one connection (and its stream limit). A caller waits
    /// for another's attempt only until its own deadline.
    fn connect(&self, deadline: Instant) -> Result<Conn, Failure> {
        let shared = &self.shared;
        let at = tokio::time::Instant::from_std(deadline);
        let uid = self.local_uid.load(Ordering::Relaxed);
        shared.runtime.block_on(async {
            let mut pending = tokio::time::timeout_at(at, shared.connecting.lock()).await.map_err(|_| {
                (DEADLINE_EXCEEDED, "deadline exceeded while another call was connecting".to_string())
            })?;
            if let Some(conn) = shared.live() {
                return Ok(conn);
            }
            let conn = open(&self.address, at, uid, &mut pending).await?;
            shared.set(Some(conn.clone()));
            Ok(conn)
        })
    }

    fn call_blocking(&self, method: &str, request: &[u8], timeout: Duration) -> Result<Vec<u8>, Failure> {
        let shared = &*self.shared;
        let idle_ns = shared.now_ns().saturating_sub(shared.last_end_ns.load(Ordering::Acquire));
        let _in_flight = InFlight::start(shared);
        let deadline = Instant::now() + timeout;
        let uri = self.uri(method)?;
        // Over the limit, nothing is sent: gRPC's client refuses such a message too.
        let body = crate::grpc::frame(request, self.max_message_bytes, "request")?;
        let call = Call { uri: &uri, body, timeout: grpc_timeout(timeout), max: self.max_message_bytes };
        let mut retries = 0;
        loop {
            let conn = match shared.live() {
                // After a pause, let the connection take in what arrived meanwhile (a
                // GOAWAY, its end when a game restarted) before a request goes out on it:
                // two turns of the scheduler, one to poll the socket, one to run the
                // connection's task. Back-to-back steps skip it (the idle driver covers
                // pauses past IDLE_AFTER; this covers the ones below).
                Some(conn) if idle_ns > CATCH_UP_AFTER.as_nanos() as u64 => shared.runtime.block_on(async {
                    tokio::task::yield_now().await;
                    tokio::task::yield_now().await;
                    conn
                }),
                Some(conn) => conn,
                None => self.connect(deadline)?,
            };
            if !conn.alive.load(Ordering::Acquire) {
                shared.set(None);
                continue;
            }
            let at = tokio::time::Instant::from_std(deadline);
            let result = shared.runtime.block_on(async { tokio::time::timeout_at(at, attempt(&conn, &call)).await });
            match result {
                Ok(Ok(reply)) => return Ok(reply),
                Ok(Err(Attempt::Refused(failure))) => {
                    shared.set(None);
                    retries += 1;
                    if retries > MAX_TRANSPARENT_RETRIES || Instant::now() >= deadline {
                        return Err(failure);
                    }
                }
                Ok(Err(Attempt::Failed(failure))) if failure.0 == CANCELLED && Instant::now() + CANCEL_AT_DEADLINE >= deadline => {
                    // The game timed the call out too (grpc-timeout) and reset it.
                    shared.set(None);
                    return Err(deadline_exceeded());
                }
                Ok(Err(Attempt::Failed(failure))) => {
                    // A game's own status leaves the connection usable; anything else drops it.
                    if matches!(failure.0, UNAVAILABLE | INTERNAL | UNKNOWN) {
                        shared.set(None);
                    }
                    return Err(failure);
                }
                Err(_) => {
                    // The stream is reset (CANCEL) as its futures drop; a game that froze
                    // gets a fresh connection next time.
                    shared.set(None);
                    return Err(deadline_exceeded());
                }
            }
        }
    }

    /// `call` for Rust callers: the reply's bytes, or `RpcError` (`ValueError` for a
    /// timeout that is no number of seconds). A panic anywhere below becomes INTERNAL: it
    /// must not reach Python as a `PanicException`.
    pub fn call_bytes(&self, py: Python<'_>, method: &str, request: &[u8], timeout_s: f64) -> PyResult<Vec<u8>> {
        let timeout = timeout_arg(timeout_s)?.max(Duration::from_millis(1));
        let result = py.allow_threads(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.call_blocking(method, request, timeout)))
                .unwrap_or_else(|_| {
                    self.shared.set(None);
                    Err((INTERNAL, "the client failed on the game's reply (a bug: please report it)".into()))
                })
        });
        result.map_err(|(code, details)| RpcError::new_err((code, details)))
    }

    /// `wait_ready` with the GIL released: one connection attempt after another, each
    /// under the whole deadline, with a growing pause between them.
    fn wait_ready_blocking(&self, timeout: Duration, timeout_s: f64) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        let mut backoff = Duration::from_millis(20);
        loop {
            let attempt_deadline = deadline.max(Instant::now() + Duration::from_millis(1));
            match self.connect(attempt_deadline) {
                Ok(_) => return Ok(()),
                Err((_, err)) => {
                    if Instant::now() + backoff >= deadline {
                        return Err(format!("no HTTP/2 connection within {timeout_s} s: {err}"));
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
            }
        }
    }
}

/// A timeout argument as a duration: a finite number of seconds, 0 or more (a NaN would
/// make no deadline at all, and panic on the way to one).
fn timeout_arg(timeout_s: f64) -> PyResult<Duration> {
    if !timeout_s.is_finite() || timeout_s < 0.0 {
        return Err(PyValueError::new_err(format!(
            "timeout_s must be a finite number of seconds, 0 or more: got {timeout_s}"
        )));
    }
    Ok(Duration::from_secs_f64(timeout_s.min(1e9)))
}

#[pymethods]
impl Channel {
    /// A plaintext channel to `host:port`; nothing is connected until `wait_ready` or a call.
    #[new]
    fn new(address: &str, max_message_bytes: usize) -> PyResult<Self> {
        let valid = address
            .rsplit_once(':')
            .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
        let authority_ok = valid && address.parse::<http::uri::Authority>().is_ok();
        if !authority_ok {
            return Err(RpcError::new_err((INVALID_ARGUMENT, format!("bad address {address:?}: expected host:port"))));
        }
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| RpcError::new_err((INTERNAL, format!("cannot start the client's runtime: {e}"))))?;
        let shared = Arc::new(Shared {
            runtime,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(None),
            in_flight: AtomicUsize::new(0),
            last_end_ns: AtomicU64::new(0),
            epoch: Instant::now(),
            interrupt: Notify::new(),
            stop: Mutex::new(false),
            stopping: Condvar::new(),
        });
        let idle = shared.clone();
        let driver = std::thread::Builder::new()
            .name("uerl-h2-idle".into())
            .spawn(move || idle.idle_driver())
            .map_err(|e| RpcError::new_err((INTERNAL, format!("cannot start the client's idle thread: {e}"))))?;
        Ok(Self {
            address: address.to_string(),
            authority: address.to_string(),
            max_message_bytes,
            shared,
            driver: Mutex::new(Some(driver)),
            uris: Mutex::new(HashMap::new()),
            local_uid: AtomicU32::new(crate::local_socket::own_uid()),
        })
    }

    /// Connect, retrying with backoff until `timeout_s`: a game may still be starting.
    fn wait_ready(&self, py: Python<'_>, timeout_s: f64) -> PyResult<()> {
        let timeout = timeout_arg(timeout_s)?;
        if self.shared.live().is_some() {
            return Ok(());
        }
        let result = py.allow_threads(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.wait_ready_blocking(timeout, timeout_s)))
                .unwrap_or_else(|_| Err("the client failed while connecting (a bug: please report it)".into()))
        });
        result.map_err(|msg| RpcError::new_err((UNAVAILABLE, msg)))
    }

    /// For tests: use a game's local socket only when a process of `uid` serves it (by
    /// default this process's own user), to play a client of another user's.
    fn _trust_local_socket_of(&self, uid: u32) {
        self.local_uid.store(uid, Ordering::Relaxed);
    }

    /// One unary call, e.g. `call("/Schola.GymService/UpdateState", request, 60.0)`.
    /// Safe from several threads at once (calls share the connection as HTTP/2 streams).
    fn call<'py>(&self, py: Python<'py>, method: &str, request: &[u8], timeout_s: f64) -> PyResult<Bound<'py, PyBytes>> {
        let reply = self.call_bytes(py, method, request, timeout_s)?;
        Ok(PyBytes::new(py, &reply))
    }

    /// Drop the connection; the object can `wait_ready` again.
    fn close(&self) {
        self.shared.set(None);
    }

    #[getter]
    fn connected(&self) -> bool {
        self.shared.live().is_some()
    }

    /// How the live connection reaches the game: "unix" (its local socket), "tcp", or
    /// None while not connected.
    #[getter]
    fn via(&self) -> Option<&'static str> {
        self.shared.live().map(|conn| conn.via)
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        *self.shared.stop.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.shared.stopping.notify_all();
        self.shared.interrupt.notify_one();
        if let Some(driver) = self.driver.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = driver.join();
        }
        self.shared.set(None);
    }
}
