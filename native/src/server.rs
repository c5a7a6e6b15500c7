//! The server side, for `uerl mock-ue --transport native`: gRPC unary calls served from
//! Rust threads, each call handed to a Python function `handler(method, request) -> reply`
//! (bytes in, bytes out). An exception with `grpc_code` (int) and `grpc_message`
//! attributes becomes that status; any other exception becomes INTERNAL.
//!
//! One thread per connection, requests of a connection served in order (a game steps
//! one request at a time anyway). Plaintext only: a TLS game uses gRPC Python's server.

use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::server_http2::{self as http2, header, Block, Connection, Incoming};

const UNIMPLEMENTED: i32 = 12;
const INTERNAL: i32 = 13;
const STATUS_200: usize = 8;
const NAME_CONTENT_TYPE: usize = 31;

struct Shared {
    stopping: AtomicBool,
    sockets: Mutex<Vec<TcpStream>>,
}

#[pyclass(module = "uerl_native")]
pub struct Server {
    shared: Arc<Shared>,
    port: u16,
    host: String,
    acceptor: Option<JoinHandle<()>>,
}

fn call_python(handler: &Py<PyAny>, method: &str, request: &[u8]) -> Result<Vec<u8>, (i32, String)> {
    Python::with_gil(|py| {
        let args = (method, PyBytes::new(py, request));
        match handler.call1(py, args) {
            Ok(reply) => reply
                .extract::<Vec<u8>>(py)
                .map_err(|e| (INTERNAL, format!("handler returned no bytes: {e}"))),
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

fn reply(conn: &mut Connection, stream: u32, result: Result<Vec<u8>, (i32, String)>) -> std::io::Result<()> {
    let head = Block::default().indexed(STATUS_200).named(NAME_CONTENT_TYPE, b"application/grpc");
    let mut parked = Vec::new();
    match result {
        Ok(message) => {
            let trailers = Block::default().literal(b"grpc-status", b"0");
            conn.send(stream, &head, Some(&http2::grpc_frame(&message)), Some(&trailers), &mut parked)
        }
        Err((code, message)) => {
            // Trailers-only: the status rides in the one header block.
            let head = head
                .literal(b"grpc-status", code.to_string().as_bytes())
                .literal(b"grpc-message", &http2::percent_encode(&message));
            conn.send(stream, &head, None, None, &mut parked)
        }
    }
}

fn serve(socket: TcpStream, handler: Py<PyAny>, shared: Arc<Shared>) -> std::io::Result<()> {
    let mut conn = Connection::new(socket)?;
    conn.read_preface()?;
    conn.start()?;
    let mut open: std::collections::HashMap<u32, (String, Vec<u8>)> = Default::default();
    while !shared.stopping.load(Ordering::Relaxed) {
        let (stream, end) = match conn.next()? {
            Incoming::Headers { stream, end_stream, headers } => {
                if let Some(entry) = open.get_mut(&stream) {
                    let _ = entry; // request trailers: nothing in them for us
                } else {
                    let path = header(&headers, b":path").map(|p| String::from_utf8_lossy(p).into_owned());
                    open.insert(stream, (path.unwrap_or_default(), Vec::new()));
                }
                (stream, end_stream)
            }
            Incoming::Data { stream, end_stream, data } => {
                if let Some((_, body)) = open.get_mut(&stream) {
                    body.extend_from_slice(&data);
                }
                (stream, end_stream)
            }
            Incoming::Reset { stream, .. } => {
                open.remove(&stream);
                continue;
            }
            Incoming::GoAway { .. } => return Ok(()),
            Incoming::Control => continue,
        };
        if !end {
            continue;
        }
        let Some((path, body)) = open.remove(&stream) else { continue };
        let result = match http2::grpc_unframe(&body) {
            Ok(request) => call_python(&handler, &path, request),
            Err(e) => Err((UNIMPLEMENTED, format!("request: {e}"))),
        };
        reply(&mut conn, stream, result)?;
    }
    Ok(())
}

#[pymethods]
impl Server {
    /// Bind `host:port` (0: any free port) and serve `handler` until `stop()`.
    #[new]
    fn new(host: &str, port: u16, handler: Py<PyAny>) -> PyResult<Self> {
        let listener = TcpListener::bind((host, port))
            .map_err(|e| pyo3::exceptions::PyOSError::new_err(format!("cannot bind {host}:{port}: {e}")))?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared { stopping: AtomicBool::new(false), sockets: Mutex::new(Vec::new()) });
        let accepting = shared.clone();
        let acceptor = std::thread::Builder::new().name("uerl-native-accept".into()).spawn(move || {
            for socket in listener.incoming() {
                if accepting.stopping.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(socket) = socket else { continue };
                if let Ok(clone) = socket.try_clone() {
                    accepting.sockets.lock().unwrap().push(clone);
                }
                let handler = Python::with_gil(|py| handler.clone_ref(py));
                let shared = accepting.clone();
                let _ = std::thread::Builder::new()
                    .name("uerl-native-conn".into())
                    .spawn(move || {
                        let _ = serve(socket, handler, shared);
                    });
            }
        })?;
        Ok(Self { shared, port, host: host.to_string(), acceptor: Some(acceptor) })
    }

    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Stop accepting, close every connection, wait for the acceptor to end.
    fn stop(&mut self, py: Python<'_>) {
        self.shared.stopping.store(true, Ordering::Relaxed);
        for socket in self.shared.sockets.lock().unwrap().drain(..) {
            let _ = socket.shutdown(Shutdown::Both);
        }
        // Wake the blocking accept with a connection of our own.
        let host = if self.host == "0.0.0.0" { "127.0.0.1" } else { self.host.as_str() };
        let _ = TcpStream::connect((host, self.port));
        if let Some(acceptor) = self.acceptor.take() {
            py.allow_threads(|| {
                let _ = acceptor.join();
            });
        }
    }
}
