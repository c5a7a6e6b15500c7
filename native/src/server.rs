//! The server side, for `uerl mock-ue --transport native`: gRPC unary calls served from
//! Rust threads, each call handed to a Python function `handler(method, request) -> reply`
//! (bytes in, bytes out). An exception with `grpc_code` (int) and `grpc_message`
//! attributes becomes that status; any other exception becomes INTERNAL.
//!
//! HTTP/2 is the `h2` crate, as on the client side: one thread per connection, running
//! a single-threaded tokio runtime; requests of a connection are served in order (a game
//! steps one request at a time anyway). Plaintext only: a TLS game uses gRPC Python's
//! server. Bound to a loopback address it also listens on that address's Unix socket
//! (`local_socket`), which the compiled client prefers.
//!
//! A message over the server's limit is RESOURCE_EXHAUSTED, as gRPC's server makes it: a
//! request is refused from its length prefix (its bytes are not buffered), a reply
//! instead of being sent. Each connection's socket is held only while it is served.

use std::collections::HashMap;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::grpc::{Failure, DEFAULT_MAX_MESSAGE_BYTES, INTERNAL, UNIMPLEMENTED};

/// What a client may send before it waits for us (a step's request is tens of KB): what
/// h2 holds of a connection's requests at most before we read it, as the client's window.
const WINDOW_BYTES: u32 = 8 << 20;
/// How long `stop()` waits for connection threads to let go of Python.
const STOP_WAIT: Duration = Duration::from_secs(5);
/// After a failed accept (EMFILE: no descriptor left, which lasts until something
/// closes), the acceptor waits this long, doubling to `ACCEPT_BACKOFF_MAX`, as Go's
/// net/http does: retrying at once would spin a core.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(5);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// An accepted connection, either way in.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> std::io::Result<Self> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }

    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

/// The connections being served, as `stop()` needs them.
#[derive(Default)]
struct Sockets {
    /// Set by `stop()`: from then on no connection is taken in. Under the same lock as
    /// `open`, so none is registered after `stop()` shut them.
    stopping: bool,
    /// A duplicate of each connection's socket, by connection, for `stop()` to shut;
    /// removed (and closed) when its connection ends.
    open: HashMap<u64, Stream>,
    next_id: u64,
}

struct Shared {
    sockets: Mutex<Sockets>,
    /// Wakes an acceptor that backs off after a failed accept (`stop()`).
    wake: Condvar,
    /// Connection threads still running, and a signal when one ends.
    live: Mutex<usize>,
    ended: Condvar,
}

impl Shared {
    fn sockets(&self) -> MutexGuard<'_, Sockets> {
        self.sockets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn live(&self) -> MutexGuard<'_, usize> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A connection ended: its duplicate socket closes, `stop()` hears of it.
    fn ended(&self, id: u64) {
        self.sockets().open.remove(&id);
        *self.live() -= 1;
        self.ended.notify_all();
    }
}

/// A listening socket, shared with its acceptor thread so `stop()` can shut it (which
/// wakes a blocked `accept`) while the thread still owns it.
enum Listener {
    Tcp(Arc<TcpListener>),
    Unix(Arc<UnixListener>),
}

impl Listener {
    fn shutdown(&self) {
        let fd = match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix(l) => l.as_raw_fd(),
        };
        // SAFETY: the fd is open (this Arc holds the listener); on Linux shutting a
        // listening socket makes its pending and future accepts fail.
        unsafe { libc::shutdown(fd, libc::SHUT_RD) };
    }
}

#[pyclass(module = "uerl_native")]
pub struct Server {
    shared: Arc<Shared>,
    port: u16,
    host: String,
    /// The Unix socket's abstract name, when bound (a loopback host).
    local_name: Option<String>,
    listeners: Vec<Listener>,
    acceptors: Vec<JoinHandle<()>>,
}

fn call_python(handler: &Py<PyAny>, method: &str, request: &[u8]) -> Result<Vec<u8>, (i32, String)> {
    Python::with_gil(|py| {
        let args = (method, PyBytes::new(py, request));
        match handler.call1(py, args) {
            // `bytes` read whole: extracting a Vec<u8> would take it as a sequence, one
            // Python int per byte (7 µs of a 16-environment step's reply).
            Ok(reply) => match reply.downcast_bound::<PyBytes>(py) {
                Ok(bytes) => Ok(bytes.as_bytes().to_vec()),
                Err(_) => reply
                    .extract::<Vec<u8>>(py)
                    .map_err(|e| (INTERNAL, format!("handler returned no bytes: {e}"))),
            },
            Err(err) => {
                let value = err.value(py);
                let code = value.getattr("grpc_code").and_then(|c| c.extract::<i32>()).unwrap_or(INTERNAL);
                let message = value
                    .getattr("grpc_message")
                    .and_then(|m| m.extract::<String>())
                    .unwrap_or_else(|_| err.to_string());
                Err((code, message))
            }
        }
    })
}

/// The message inside a gRPC length-prefixed body.
fn grpc_unframe(body: &[u8]) -> Result<&[u8], String> {
    let Some(length) = crate::grpc::declared_length(body) else {
        return Err(format!("body of {} bytes has no gRPC message frame", body.len()));
    };
    if body[0] != 0 {
        return Err("compressed message, but no compression was negotiated".into());
    }
    let message = &body[crate::grpc::PREFIX_BYTES..];
    if message.len() != length {
        return Err(format!("gRPC frame says {length} bytes, carries {}", message.len()));
    }
    Ok(message)
}

fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &b in text.as_bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn grpc_response(status: Option<Failure>) -> Response<()> {
    let mut response = Response::builder()
        .status(200)
        .header("content-type", HeaderValue::from_static("application/grpc"))
        .body(())
        .expect("a valid response");
    if let Some((code, message)) = status {
        // Trailers-only: the status rides in the one header block.
        let headers = response.headers_mut();
        headers.insert("grpc-status", HeaderValue::from(code));
        if let Ok(value) = HeaderValue::from_str(&percent_encode(&message)) {
            headers.insert("grpc-message", value);
        }
    }
    response
}

/// A request's message, read as it arrives: refused as soon as its prefix declares more
/// than `max` bytes (or a second message follows), so no more than that is ever held.
async fn read_request(body: &mut h2::RecvStream, max: usize) -> Result<Result<BytesMut, Failure>, h2::Error> {
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
        if let Err(failure) = crate::grpc::check_arriving(&data, max, "request") {
            return Ok(Err(failure));
        }
    }
    Ok(Ok(data))
}

/// One call: the request's body read whole, the handler's reply (or status) sent.
async fn serve_call(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    handler: &Py<PyAny>,
    max: usize,
) -> Result<(), h2::Error> {
    let path = request.uri().path().to_string();
    let mut body = request.into_body();
    let result = match read_request(&mut body, max).await? {
        Ok(data) => match grpc_unframe(&data) {
            Ok(message) => call_python(handler, &path, message)
                .and_then(|reply| crate::grpc::frame(&reply, max, "reply").map_err(|(code, e)| (code, format!("the game's {e}")))),
            Err(e) => Err((UNIMPLEMENTED, format!("request: {e}"))),
        },
        Err(failure) => Err(failure),
    };
    // A request refused unread is reset (NO_ERROR) once this answer is out and `body`
    // dropped (RFC 9113 8.1): the client stops sending it.
    drop(body);
    match result {
        Ok(framed) => {
            let mut send = respond.send_response(grpc_response(None), false)?;
            send.send_data(framed, false)?;
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            send.send_trailers(trailers)
        }
        Err(status) => respond.send_response(grpc_response(Some(status)), true).map(|_| ()),
    }
}

fn serve(socket: Stream, handler: Arc<Py<PyAny>>, max: usize) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    runtime.block_on(async move {
        match socket {
            Stream::Tcp(socket) => {
                socket.set_nodelay(true)?;
                socket.set_nonblocking(true)?;
                serve_h2(tokio::net::TcpStream::from_std(socket)?, handler, max).await
            }
            Stream::Unix(socket) => {
                socket.set_nonblocking(true)?;
                serve_h2(tokio::net::UnixStream::from_std(socket)?, handler, max).await
            }
        }
    })
}

async fn serve_h2<T>(io: T, handler: Arc<Py<PyAny>>, max: usize) -> std::io::Result<()>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut conn = h2::server::Builder::new()
        .initial_window_size(WINDOW_BYTES)
        .initial_connection_window_size(WINDOW_BYTES)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(std::io::Error::other)?;
    // Calls run as tasks beside the loop that drives the connection (their bodies
    // arrive through it); on this one thread, in the order they came.
    while let Some(next) = conn.accept().await {
        let Ok((request, respond)) = next else { break };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _ = serve_call(request, respond, &handler, max).await;
        });
    }
    Ok(())
}

/// Serve each connection `incoming` yields on a thread of its own, until `stop()`.
/// Needs no GIL (the handler is shared, not cloned), so `stop()` and `Drop` can wait for
/// it while holding it.
fn accept_loop(
    shared: Arc<Shared>,
    handler: Arc<Py<PyAny>>,
    max: usize,
    incoming: impl Iterator<Item = std::io::Result<Stream>>,
) {
    let mut backoff = ACCEPT_BACKOFF_MIN;
    for socket in incoming {
        let mut sockets = shared.sockets();
        if sockets.stopping {
            break;
        }
        // A socket `stop()` could not shut is not served (nor could it be: a
        // duplicate fails only when descriptors ran out, which serving needs too).
        let Some((socket, clone)) = socket.ok().and_then(|s| s.try_clone().ok().map(|c| (s, c))) else {
            let (sockets, _) = shared.wake.wait_timeout(sockets, backoff).unwrap_or_else(|p| p.into_inner());
            if sockets.stopping {
                break;
            }
            backoff = (backoff * 2).min(ACCEPT_BACKOFF_MAX);
            continue;
        };
        backoff = ACCEPT_BACKOFF_MIN;
        sockets.next_id += 1;
        let id = sockets.next_id;
        sockets.open.insert(id, clone);
        drop(sockets);
        *shared.live() += 1;
        let connection = shared.clone();
        let handler = handler.clone();
        let started = std::thread::Builder::new().name("uerl-native-conn".into()).spawn(move || {
            // The thread keeps one Python thread state for its life: without it every
            // call's `with_gil` would make and free one (and its frame stack: an mmap
            // and a munmap per call). `stop()` waits for it to end, so none is left
            // holding one when Python exits.
            Python::with_gil(|py| {
                py.allow_threads(|| {
                    let _ = serve(socket, handler, max);
                })
            });
            connection.ended(id);
        });
        if started.is_err() {
            shared.ended(id);
        }
    }
}

impl Server {
    /// Stop accepting, close every connection, wait for the acceptors and (up to 5 s) the
    /// connection threads to end. Once: later calls do nothing.
    fn shut(&mut self) {
        if self.acceptors.is_empty() {
            return;
        }
        {
            let mut sockets = self.shared.sockets();
            sockets.stopping = true;
            for (_, socket) in sockets.open.drain() {
                socket.shutdown();
            }
        }
        self.shared.wake.notify_all();
        // Wake each blocking accept: its listener shut, and (should that not wake it) a
        // connection of our own.
        for listener in &self.listeners {
            listener.shutdown();
        }
        let host = if self.host == "0.0.0.0" { "127.0.0.1" } else { self.host.as_str() };
        let _ = TcpStream::connect((host, self.port));
        if let Some(name) = &self.local_name {
            let _ = crate::local_socket::connect(name);
        }
        let shared = self.shared.clone();
        let acceptors: Vec<_> = self.acceptors.drain(..).collect();
        // Connection threads take the GIL for each call: wait with it released (`Drop`
        // may hold it).
        Python::with_gil(|py| {
            py.allow_threads(move || {
                for acceptor in acceptors {
                    let _ = acceptor.join();
                }
                // Their sockets are shut: each ends once its current call (if any) returns.
                let live = shared.live();
                let _ = shared.ended.wait_timeout_while(live, STOP_WAIT, |live| *live > 0);
            })
        });
        self.listeners.clear();
    }
}

impl Drop for Server {
    /// A server dropped without `stop()` still frees its port and its connections.
    fn drop(&mut self) {
        self.shut();
    }
}

#[pymethods]
impl Server {
    /// Bind `host:port` (0: any free port) and serve `handler` until `stop()`; a
    /// loopback `host` is served on its Unix socket too (`local_socket`). A request or a
    /// reply over `max_message_bytes` is RESOURCE_EXHAUSTED.
    #[new]
    #[pyo3(signature = (host, port, handler, max_message_bytes = DEFAULT_MAX_MESSAGE_BYTES))]
    fn new(host: &str, port: u16, handler: Py<PyAny>, max_message_bytes: usize) -> PyResult<Self> {
        let tcp = TcpListener::bind((host, port))
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("cannot bind {host}:{port}: {e}")))?;
        let port = tcp.local_addr()?.port();
        // The TCP port is ours, so its name is free unless a process that lost the port
        // still holds it (it is going away): then TCP alone.
        let local = crate::local_socket::name(host, port).and_then(|name| crate::local_socket::bind(&name).ok().map(|l| (name, l)));
        let shared = Arc::new(Shared {
            sockets: Mutex::new(Sockets::default()),
            wake: Condvar::new(),
            live: Mutex::new(0),
            ended: Condvar::new(),
        });
        let handler = Arc::new(handler);
        let max = max_message_bytes;
        let tcp = Arc::new(tcp);
        let mut server =
            Self { shared: shared.clone(), port, host: host.to_string(), local_name: None, listeners: Vec::new(), acceptors: Vec::new() };
        server.listeners.push(Listener::Tcp(tcp.clone()));
        let (accepting, tcp_handler) = (shared.clone(), handler.clone());
        server.acceptors.push(std::thread::Builder::new().name("uerl-native-accept".into()).spawn(move || {
            accept_loop(accepting, tcp_handler, max, tcp.incoming().map(|s| s.map(Stream::Tcp)))
        })?);
        if let Some((name, unix)) = local {
            let unix = Arc::new(unix);
            server.listeners.push(Listener::Unix(unix.clone()));
            server.acceptors.push(std::thread::Builder::new().name("uerl-native-accept".into()).spawn(move || {
                accept_loop(shared, handler, max, unix.incoming().map(|s| s.map(Stream::Unix)))
            })?);
            server.local_name = Some(name);
        }
        Ok(server)
    }

    /// Whether a Unix socket serves too (a loopback host; see `local_socket`).
    #[getter]
    fn local_socket(&self) -> bool {
        self.local_name.is_some()
    }

    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Stop accepting, close every connection, wait for the acceptors and (up to 5 s) the
    /// connection threads to end.
    fn stop(&mut self) {
        self.shut();
    }
}
