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

use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

const UNIMPLEMENTED: i32 = 12;
const INTERNAL: i32 = 13;
/// What a client may send before it waits for us: more than any request.
const WINDOW_BYTES: u32 = 1 << 30;
/// How long `stop()` waits for connection threads to let go of Python.
const STOP_WAIT: Duration = Duration::from_secs(5);

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

struct Shared {
    stopping: AtomicBool,
    sockets: Mutex<Vec<Stream>>,
    /// Connection threads still running, and a signal when one ends.
    live: Mutex<usize>,
    ended: Condvar,
}

#[pyclass(module = "uerl_native")]
pub struct Server {
    shared: Arc<Shared>,
    port: u16,
    host: String,
    /// The Unix socket's abstract name, when bound (a loopback host).
    local_name: Option<String>,
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
    if body.len() < 5 {
        return Err(format!("body of {} bytes has no gRPC message frame", body.len()));
    }
    if body[0] != 0 {
        return Err("compressed message, but no compression was negotiated".into());
    }
    let length = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() != 5 + length {
        return Err(format!("gRPC frame says {length} bytes, carries {}", body.len() - 5));
    }
    Ok(&body[5..])
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

fn grpc_response(status: Option<(i32, String)>) -> Response<()> {
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

/// One call: the request's body read whole, the handler's reply (or status) sent.
async fn serve_call(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    handler: &Py<PyAny>,
) -> Result<(), h2::Error> {
    let path = request.uri().path().to_string();
    let mut body = request.into_body();
    let mut data = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let result = match grpc_unframe(&data) {
        Ok(message) => call_python(handler, &path, message),
        Err(e) => Err((UNIMPLEMENTED, format!("request: {e}"))),
    };
    match result {
        Ok(message) => {
            let mut send = respond.send_response(grpc_response(None), false)?;
            let mut framed = BytesMut::with_capacity(message.len() + 5);
            framed.extend_from_slice(&[0]);
            framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
            framed.extend_from_slice(&message);
            send.send_data(framed.freeze(), false)?;
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            send.send_trailers(trailers)
        }
        Err(status) => respond.send_response(grpc_response(Some(status)), true).map(|_| ()),
    }
}

fn serve(socket: Stream, handler: Py<PyAny>) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_io().build()?;
    runtime.block_on(async move {
        match socket {
            Stream::Tcp(socket) => {
                socket.set_nodelay(true)?;
                socket.set_nonblocking(true)?;
                serve_h2(tokio::net::TcpStream::from_std(socket)?, handler).await
            }
            Stream::Unix(socket) => {
                socket.set_nonblocking(true)?;
                serve_h2(tokio::net::UnixStream::from_std(socket)?, handler).await
            }
        }
    })
}

async fn serve_h2<T>(io: T, handler: Py<PyAny>) -> std::io::Result<()>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut conn = h2::server::Builder::new()
        .initial_window_size(WINDOW_BYTES)
        .initial_connection_window_size(WINDOW_BYTES)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(std::io::Error::other)?;
    let handler = Arc::new(handler);
    // Calls run as tasks beside the loop that drives the connection (their bodies
    // arrive through it); on this one thread, in the order they came.
    while let Some(next) = conn.accept().await {
        let Ok((request, respond)) = next else { break };
        let handler = handler.clone();
        tokio::spawn(async move {
            let _ = serve_call(request, respond, &handler).await;
        });
    }
    Ok(())
}

/// Serve each connection `incoming` yields on a thread of its own, until `stop()`.
fn accept_loop(shared: Arc<Shared>, handler: Py<PyAny>, incoming: impl Iterator<Item = std::io::Result<Stream>>) {
    for socket in incoming {
        if shared.stopping.load(Ordering::Relaxed) {
            break;
        }
        let Ok(socket) = socket else { continue };
        if let Ok(clone) = socket.try_clone() {
            shared.sockets.lock().unwrap().push(clone);
        }
        let handler = Python::with_gil(|py| handler.clone_ref(py));
        *shared.live.lock().unwrap() += 1;
        let connection = shared.clone();
        let started = std::thread::Builder::new().name("uerl-native-conn".into()).spawn(move || {
            // The thread keeps one Python thread state for its life: without it every
            // call's `with_gil` would make and free one (and its frame stack: an mmap
            // and a munmap per call). `stop()` waits for it to end, so none is left
            // holding one when Python exits.
            Python::with_gil(|py| {
                py.allow_threads(|| {
                    let _ = serve(socket, handler);
                })
            });
            *connection.live.lock().unwrap() -= 1;
            connection.ended.notify_all();
        });
        if started.is_err() {
            *shared.live.lock().unwrap() -= 1;
        }
    }
}

#[pymethods]
impl Server {
    /// Bind `host:port` (0: any free port) and serve `handler` until `stop()`; a
    /// loopback `host` is served on its Unix socket too (`local_socket`).
    #[new]
    fn new(py: Python<'_>, host: &str, port: u16, handler: Py<PyAny>) -> PyResult<Self> {
        let listener = TcpListener::bind((host, port))
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("cannot bind {host}:{port}: {e}")))?;
        let port = listener.local_addr()?.port();
        // The TCP port is ours, so its name is free unless a process that lost the port
        // still holds it (it is going away): then TCP alone.
        let local = crate::local_socket::name(host, port).and_then(|name| crate::local_socket::bind(&name).ok().map(|l| (name, l)));
        let shared = Arc::new(Shared {
            stopping: AtomicBool::new(false),
            sockets: Mutex::new(Vec::new()),
            live: Mutex::new(0),
            ended: Condvar::new(),
        });
        let mut acceptors = Vec::new();
        let (accepting, tcp_handler) = (shared.clone(), handler.clone_ref(py));
        acceptors.push(std::thread::Builder::new().name("uerl-native-accept".into()).spawn(move || {
            accept_loop(accepting, tcp_handler, listener.incoming().map(|s| s.map(Stream::Tcp)))
        })?);
        let local_name = match local {
            Some((name, unix)) => {
                let accepting = shared.clone();
                acceptors.push(std::thread::Builder::new().name("uerl-native-accept".into()).spawn(move || {
                    accept_loop(accepting, handler, unix.incoming().map(|s| s.map(Stream::Unix)))
                })?);
                Some(name)
            }
            None => None,
        };
        Ok(Self { shared, port, host: host.to_string(), local_name, acceptors })
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
    fn stop(&mut self, py: Python<'_>) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        for socket in self.shared.sockets.lock().unwrap().drain(..) {
            socket.shutdown();
        }
        // Wake each blocking accept with a connection of our own.
        let host = if self.host == "0.0.0.0" { "127.0.0.1" } else { self.host.as_str() };
        let _ = TcpStream::connect((host, self.port));
        if let Some(name) = &self.local_name {
            let _ = crate::local_socket::connect(name);
        }
        let shared = self.shared.clone();
        let acceptors: Vec<_> = self.acceptors.drain(..).collect();
        py.allow_threads(move || {
            for acceptor in acceptors {
                let _ = acceptor.join();
            }
            // Their sockets are shut: each ends once its current call (if any) returns.
            let live = shared.live.lock().unwrap();
            let _ = shared.ended.wait_timeout_while(live, STOP_WAIT, |live| *live > 0);
        });
    }
}
